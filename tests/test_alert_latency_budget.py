"""Issue 22 item 10: with the shipped defaults, the worst case from the deciding step's arrival to the webhook stays
within 60 s (the measured figure is `make bench`'s alert section, docs/benchmarks.md "Alert latency"). Worst case =
one scrape interval (the step arrives just after a scrape) + one evaluation interval + the step alerts' `for:` +
Alertmanager's group_wait. And every inhibition whose source is evaluated in another rule group than its target
waits at least one evaluation interval, so the inhibitor can arrive before the target's group is flushed."""
from __future__ import annotations


from omniwatch import names
from omniwatch.alerting import rulespec
from omniwatch.config import DEFAULT
from omniwatch.stack import PROFILES

from .conftest import REPO
from omniwatch.yamlio import load as yaml_load

AM = yaml_load((REPO / "alerts" / "alertmanager.yml").read_text())


def dur(text: str) -> int:
    """A Prometheus duration of one unit (``15s``, ``1m``, ``2h``) -> seconds."""
    return int(float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]])


RULES = [yaml_load(p.read_text()) for p in sorted((REPO / "alerts").glob("*.rules.yml"))]


def _group_of() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for doc in RULES:
        for g in doc["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    out.setdefault(r["alert"], set()).add(g["name"])
    return out


def _group_wait(matchers: list[str]) -> int:
    for route in AM["route"].get("routes", []):
        if set(route.get("matchers", [])) <= set(matchers) and "group_wait" in route:
            return dur(route["group_wait"])
    return dur(AM["route"]["group_wait"])


def test_the_worst_case_latency_of_a_step_alert_is_within_60_s():
    prof = PROFILES["default"]
    assert prof["group_wait"] is None  # the default profile ships alertmanager.yml's group_wait
    step_for = max(dur(a.for_) for a in rulespec.alerts(DEFAULT)
                   if a.name in (names.ALERT_REWARD_BOUND, names.ALERT_IDLE, names.ALERT_MFU_DROP,
                                 names.ALERT_MFU_IMPOSSIBLE, names.ALERT_STEP_REGRESSION) and a.for_)
    worst = dur(prof["scrape_interval"]) + dur(prof["evaluation_interval"]) + step_for + dur(AM["route"]["group_wait"])
    assert worst <= 60, worst


def test_an_inhibitor_from_another_rule_group_is_waited_for():
    groups, every = _group_of(), dur(PROFILES["default"]["evaluation_interval"])
    checked = 0
    def alertnames(matchers: list[str]) -> list[str]:  # `alertname = "A"` or `alertname =~ "A|B"`
        return [n for m in matchers if m.startswith("alertname =") for n in m.split('"')[1].split("|")]

    for rule in AM["inhibit_rules"]:
        for src in alertnames(rule["source_matchers"]):
            for tgt in alertnames(rule["target_matchers"]):
                if src == tgt or groups[src] & groups[tgt]:
                    continue  # one evaluation sends both together
                checked += 1
                wait = _group_wait(['alertname = "%s"' % tgt, *rule["target_matchers"]])
                assert wait > every, (rule, wait)
    assert checked >= 1  # RolloutStraggler (omniwatch.signals) -> StepTimeRegression{cause="rollout"} (omniwatch.steps)
