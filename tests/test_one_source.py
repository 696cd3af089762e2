"""A threshold number lives in one place: the alert configuration (omniwatch/config.py).

Every generated artefact (the rule files, their annotations, the dashboards' queries and descriptions, the
remedies table) is rendered from a configuration in which every number differs from its default
(tests/one_source_render.py). A default number that survives where a threshold is stated — a PromQL
comparison, a ``for:``, a rule's range window, or a sentence that says when an alert fires — was written a
second time by hand, and this test names it.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omniwatch import names
from omniwatch.yamlio import load as yaml_load

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

HERE = Path(__file__).resolve().parent
ALERTS = sorted({getattr(names, a) for a in dir(names) if a.startswith("ALERT_")} - {"Watchdog"})
SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?![\s)]|$))+(?:[.!?]|$)")  # "0.4" and "e.g." do not end one
WORDS = {"s": ("second", "seconds"), "m": ("minute", "minutes"), "h": ("hour", "hours"), "d": ("day", "days")}


@pytest.fixture(scope="module")
def sentinel():
    out = subprocess.run([sys.executable, str(HERE / "one_source_render.py")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def forms(v, path: str = "") -> list[str]:
    """How a default value reads in PromQL (the first form) and in prose (all of them)."""
    if isinstance(v, str):  # a duration: 2m, "2 minutes", "2 min"
        num, unit = v[:-1], v[-1]
        one, many = WORDS[unit]
        out = [v, f"{num} {many if num != '1' else one}", f"{num} {unit}"]
        return out + [f"{num} min"] if unit == "m" else out
    if isinstance(v, int):
        if path.endswith("_seconds"):  # ttf_seconds: 300, "300 s", "5 minutes"
            return [str(v), f"{v} s", f"{v} seconds"] + ([f"{v // 60} minutes"] if v % 60 == 0 else [])
        # A count of steps reads "3 steps", "3 typical steps" (a bare 3 in a sentence is too common to judge).
        return [str(v)] + [f"{v} {w}" for w in ("steps", "typical steps", "normal steps", "window steps")]
    if v == 1.0:  # MFU's ceiling: "1" is every boolean comparison (== 1); it reads 1.0 or 100 % when meant
        return ["1.0", "100%", "100 %"]
    out = [f"{v:g}"]
    if v < 1:
        out += [f"{v * 100:g}%", f"{v * 100:g} %"]
    return out


def number(f: str) -> str:
    return r"(?<![\w.])" + re.escape(f) + r"(?![\w]|\.\d)"


def comparisons(expr: str, v) -> list[str]:
    """``> 0.4``, ``0.4 <``, ``for:``-like durations in range selectors and offsets."""
    hits = []
    for f in forms(v)[:1]:
        if f == "1.0":
            continue  # MFU's ceiling compares as "> 1": indistinguishable from a boolean
        pat = (rf"(?:[<>]=?|==|!=)\s*(?:bool\s+)?{number(f)}|{number(f)}\s*(?:[<>]=?|==|!=)" if not isinstance(v, str)
               else rf"\[{re.escape(f)}(?::[^\]]*)?\]|offset\s+{re.escape(f)}\b")
        hits += [expr[max(0, m.start() - 50):m.end() + 30] for m in re.finditer(pat, expr)]
    return hits


def alert_sentences(text: str) -> list[str]:
    """Sentences that say something about one of omniwatch's alerts (where a threshold would be quoted)."""
    text = re.sub(r"\{\{.*?\}\}", "\n", text)  # a Go-template branch ends a sentence
    return [s for s in SENTENCE.findall(text) if any(re.search(rf"\b{a}\b", s) for a in ALERTS)]


def in_prose(text: str, v, path: str = "") -> list[str]:
    fs = forms(v, path)
    if isinstance(v, int) and not path.endswith("_seconds"):
        fs = fs[1:]  # counts are judged with their unit ("3 steps"), see forms()
    return [s.strip() for s in alert_sentences(text) for f in fs if re.search(number(f), s)]


def test_the_sentinel_config_changes_every_number(sentinel):
    """The render under test really moved every threshold: nothing of the default survives in its own field."""
    changed = sentinel["changed"]
    assert len(changed) >= 40, sorted(changed)
    for path, (old, new) in changed.items():
        assert old != new, path
    assert len({json.dumps(new) for _, new in changed.values()}) == len(changed), "sentinel values must be distinct"
    assert not {json.dumps(new) for _, new in changed.values()} & {json.dumps(old) for old, _ in changed.values()}


def test_no_default_number_survives_in_the_rules(sentinel):
    found = []
    for fname, text in sentinel["rules"].items():
        for group in yaml_load(text)["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                for path, (old, _) in sentinel["changed"].items():
                    found += [(fname, name, path, old, "expr", h) for h in comparisons(rule["expr"], old)]
                    if isinstance(old, str) and rule.get("for") == old:
                        found.append((fname, name, path, old, "for", old))
                    for key, text_ in (rule.get("annotations") or {}).items():
                        if key != "runbook_url":
                            found += [(fname, name, path, old, key, s) for s in in_prose(text_, old, path)]
    assert not found, "\n".join(map(str, found))


def test_no_default_number_survives_in_the_dashboards_or_the_remedies(sentinel):
    found = []
    for p in sentinel["panels"]:
        for path, (old, _) in sentinel["changed"].items():
            for e in p["exprs"]:
                found += [(p["dashboard"], p["title"], path, old, "expr", h) for h in comparisons(e, old)
                          if not isinstance(old, str)]
            found += [(p["dashboard"], p["title"], path, old, "description", s) for s in in_prose(p["description"], old, path)]
    for path, (old, _) in sentinel["changed"].items():
        found += [("remedies", "", path, old, "text", s) for s in in_prose(sentinel["remedies"], old, path)]
    assert not found, "\n".join(map(str, found))


@pytest.fixture(scope="module")
def explicit():
    out = subprocess.run([sys.executable, str(HERE / "one_source_render.py"), "--explicit"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_a_config_passed_to_the_dashboards_words_every_panel_description(explicit):
    """`dashboards generate --config tuned.yml` (the defaults imported, the config only passed): no panel
    description quotes a default number where the passed config says another (issue 23 item 4)."""
    found = []
    for p in explicit["panels"]:
        for path, (old, _) in explicit["changed"].items():
            found += [(p["dashboard"], p["title"], path, old, s) for s in in_prose(p["description"], old, path)]
    assert not found, "\n".join(map(str, found))


def test_a_config_passed_to_the_dashboards_leaves_no_default_anywhere_in_the_json(explicit):
    """Issue 32 item 5: `dashboards generate --config` with another selectors.job, other windows and other thresholds
    (the defaults imported, the config only passed): no query, legend or description of the generated JSON keeps a
    default — the exporter's job, the runbook base, $window's default, a threshold or a window in a comparison, a
    legend or a sentence about an alert."""
    (default_job, job), (default_base, base) = explicit["job"], explicit["runbook_base"]
    found = []
    for uid, text in explicit["dashboards"].items():
        doc = json.loads(text)
        for bad in (f'job=\\"{default_job}\\"', f'job=\"{default_job}\"', default_base):
            if bad in text:
                found.append((uid, "text", bad))
        assert f'job=\\"{job}\\"' in text or "job=" not in text.replace(f"job=\\\"{job}", ""), uid
        for v in doc["templating"]["list"]:
            if v["name"] == "window":
                k = explicit["changed"]["window.k"][1]
                if v["current"]["value"] != str(k) or v["query"].split(",")[0] != str(k):
                    found.append((uid, "$window", v["current"], v["query"]))
    for p in explicit["panels"]:
        for path, (old, _) in explicit["changed"].items():
            for e in p["exprs"]:
                found += [(p["dashboard"], p["title"], path, old, "expr", h) for h in comparisons(e, old)
                          if not isinstance(old, str)]
            for lg in p["legends"]:
                # a count reads with its unit ("last 10 steps"; a bare small integer is too common to judge)
                fs = forms(old, path)[1:] if isinstance(old, int) else forms(old, path)[:1]
                for f in fs:
                    if f not in ("1.0",) and re.search(number(f), re.sub(r"\{\{[^}]*\}\}", "", lg)):
                        found.append((p["dashboard"], p["title"], path, old, "legend", lg))
            found += [(p["dashboard"], p["title"], path, old, "description", s) for s in in_prose(p["description"], old, path)]
        if "window (default:" in p["description"] or "(default: " in p["description"]:
            k = explicit["changed"]["window.k"]
            if f"(default: {k[0]})" in p["description"]:
                found.append((p["dashboard"], p["title"], "window.k", k[0], "description", "(default: ...)"))
    assert not found, "\n".join(map(str, found))
    assert any(f'job=\\"{job}\\"' in t for t in explicit["dashboards"].values())


@pytest.mark.parametrize("where,text,default", [
    ("expr", "project_experiment:omniwatch_reward_bound_ratio:min_k > 0.4", 0.4),
    ("expr", "avg_over_time(x[10m])", "10m"),
    ("prose", "TransferQueueBacklog fires when a unit is over 90 % full.", 0.9),
    ("prose", "RolloutQueueSaturated holds for 10 minutes of saturation.", "10m"),
])
def test_the_checks_find_a_hand_written_copy(where, text, default):
    """Negative control: each kind of hand-written copy is found (the checks above can fail)."""
    assert (comparisons(text, default) if where == "expr" else in_prose(text, default))
