"""Every PromQL snippet in docs/runbooks.md names series that exist: omniwatch's own (the catalogue and the
recording rules of alerts/), verl passthrough families (``verl_<sanitised key>`` of a key VeRL-Omni logs, with
a ``key`` matcher that maps to that family), and the external families omniwatch knows by name (TransferQueue,
vLLM / vLLM-Omni, Ray, DCGM: omniwatch/external.py and the recorded endpoint bodies)."""
from __future__ import annotations

import re
from pathlib import Path

import orjson

from omniwatch import names
from omniwatch import external
from omniwatch.core.model import passthrough_name
from omniwatch.simulate import Fault, RunSpec, step_dict

from .conftest import FIXTURES, SCENARIOS, fixture_path
from omniwatch.yamlio import load as yaml_load

REPO = Path(__file__).resolve().parents[1]
RUNBOOKS = REPO / "docs" / "runbooks.md"
CODE = re.compile(r"`([^`\n]+)`")
# A metric-shaped token not part of a path (verl_omni/utils/...) or a dotted config key.
TOKEN = re.compile(r"(?<![\w:./-])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:./])")
METRIC_PREFIXES = ("omniwatch_", "verl_", "tq_", "vllm:", "vllm_omni:", "ray_", "DCGM_")
SELECTOR = re.compile(r"(verl_\w+)\{([^}]*)\}")


def verl_keys() -> set[str]:
    keys: set[str] = set()
    for name in SCENARIOS:
        for line in fixture_path(name).read_bytes().splitlines():
            keys |= orjson.loads(line)["data"].keys()
    for spec in (RunSpec(validation_every=2, checkpoint_every=2), RunSpec(trainer="v1"), RunSpec(trainer="legacy_async"),
                 RunSpec(rollout_corr="decoupled"), RunSpec(rollout_corr="bypass"),
                 RunSpec(faults=[Fault("nested_timer", 1, seconds_share=0.05)])):
        for s in (1, 2):
            keys |= step_dict(spec, s).keys()
    return keys


def known_series() -> set[str]:
    known = set(names.CATALOGUE)
    for f in (REPO / "alerts").glob("*.rules.yml"):
        for g in yaml_load(f.read_text())["groups"]:
            known |= {r["record"] for r in g["rules"] if "record" in r}
    known |= {passthrough_name(k) for k in verl_keys()}
    known |= {v for k, v in vars(external).items() if k.isupper() and isinstance(v, str)}
    for body in (FIXTURES / "endpoints").glob("*.metrics.txt"):
        known |= set(re.findall(r"^# TYPE (\S+)", body.read_text(), re.M))
    return known | {n + suffix for n in list(known) for suffix in ("_bucket", "_sum", "_count")}


def snippets() -> list[str]:
    return CODE.findall(RUNBOOKS.read_text())


def test_every_series_a_runbook_names_exists():
    known = known_series()
    named = {tok for code in snippets() for tok in TOKEN.findall(code)
             if tok.startswith(METRIC_PREFIXES) or ":omniwatch_" in tok}
    named = {tok for tok in named if not tok.endswith((":", "_"))}  # "vllm_omni:" is a prefix, not a series
    assert len(named) > 15, named
    missing = sorted(named - known)
    assert not missing, f"docs/runbooks.md names series nothing exports: {missing}"


def test_verl_selectors_use_the_family_their_key_maps_to():
    keys = verl_keys()
    found = 0
    for code in snippets():
        for family, matchers in SELECTOR.findall(code):
            for key in re.findall(r'key="([^"]+)"', matchers):
                found += 1
                assert key in keys, key
                assert passthrough_name(key) == family, f"{family}{{key={key!r}}} matches nothing: the family is {passthrough_name(key)}"
    assert found, "the runbooks show no verl_ selector with a key"


def test_the_old_query_that_matched_nothing_is_gone():
    assert 'verl_critic{' not in RUNBOOKS.read_text()
