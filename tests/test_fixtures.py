"""The recorded fixtures are the repository's own: present, byte-identical to their sources
(tests/fixtures/SHA256SUMS), described in tests/fixtures/README.md, and the real endpoint captures
still carry every name our rules and dashboards read from them."""
from __future__ import annotations

import hashlib
import re

from prometheus_client.parser import text_string_to_metric_families

from conftest import FIXTURES, REPO, fixture

LISTED = dict(reversed(line.split(None, 1)) for line in (FIXTURES / "SHA256SUMS").read_text().splitlines() if line.strip())


def test_every_fixture_is_listed_and_byte_identical():
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*")
               if p.is_file() and p.name not in ("README.md", "SHA256SUMS")}
    assert on_disk == set(LISTED), "tests/fixtures/SHA256SUMS must list exactly the files present"
    for rel, digest in LISTED.items():
        assert hashlib.sha256(fixture(rel).read_bytes()).hexdigest() == digest, f"{rel} changed"


def test_readme_says_where_each_fixture_came_from():
    readme = (FIXTURES / "README.md").read_text()
    for rel in LISTED:
        stem = rel.split("/", 1)[1].split(".")[0]
        assert stem in readme, f"tests/fixtures/README.md does not describe {rel}"


def _families(rel: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(fixture(rel).read_text())}


def _used_names(prefix: str) -> set[str]:
    """Metric names with ``prefix`` read by the rule files and the generated dashboards."""
    text = "".join(p.read_text() for p in [*(REPO / "alerts").glob("*.rules.yml"), *(REPO / "dashboards").glob("*.json")])
    used = set(re.findall(rf"(?<![:\w])({prefix}[a-z0-9_]+)", text))
    return {re.sub(r"_(bucket|sum|count)$", "", u) for u in used}


CONTROLLER = "endpoints/transferqueue_0.1.11_controller.metrics.txt"
STORAGE_UNIT = "endpoints/transferqueue_0.1.11_storage_unit.metrics.txt"


def _declared(rel: str) -> set[str]:
    """The families as declared (# TYPE), with their exposed names: counters keep _total there even
    where the capture has no sample yet (no request had been made, no error happened)."""
    assert _families(rel), f"{rel} does not parse"
    return set(re.findall(r"^# TYPE (\S+) ", fixture(rel).read_text(), re.M))


def test_transferqueue_names_we_read_exist_in_a_real_controller_capture():
    used = _used_names("tq_")
    assert used, "no tq_ metric used by rules or dashboards?"
    missing = sorted(u for u in used if u not in _declared(CONTROLLER) | _declared(STORAGE_UNIT))
    assert not missing, f"names not exported by a TransferQueue 0.1.11 controller or storage unit: {missing}"


def test_storage_unit_names_we_read_exist_in_a_real_storage_unit_capture():
    """Names the rules and dashboards read that the controller does not export must be the storage
    units' own (their request histogram, read windowed), and those series carry no storage_unit_id of
    their own: discovery adds it as a target label so they join the controller's per-unit series."""
    unit_only = _used_names("tq_") - _declared(CONTROLLER)
    assert unit_only, "no storage-unit series read? the latency and request panels read the units' histograms"
    missing = sorted(unit_only - _declared(STORAGE_UNIT))
    assert not missing, f"names in neither real capture: {missing}"
    unit_samples = [s for f in _families(STORAGE_UNIT).values() for s in f.samples]
    assert unit_samples and not any("storage_unit_id" in s.labels for s in unit_samples)
    ctl = [s for f in _families(CONTROLLER).values() if f.name.startswith("tq_storage_") for s in f.samples]
    assert ctl and all("storage_unit_id" in s.labels for s in ctl)


def test_ray_node_series_carry_the_labels_our_rules_join_on():
    fams = _families("endpoints/ray_2.60_node.metrics.txt")
    node = [s for f in fams.values() if f.name.startswith("ray_node_") for s in f.samples]
    assert node and all("ip" in s.labels for s in node), "ray_node_* series without the `ip` label"
    rules = "".join(p.read_text() for p in (REPO / "alerts").glob("*.rules.yml"))
    assert '"node", "$1", "ip"' in rules, "the Ray GPU memory rule no longer maps ip -> node"
