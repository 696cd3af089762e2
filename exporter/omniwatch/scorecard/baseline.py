"""Is a scorecard worse than the committed baseline (``benchmarks/scorecard.json``)? Better is fine; any figure
that got worse is named, and the remedy is to fix the rules or, when the change is wanted, re-baseline with
``make scorecard``.

Compared: the totals (caught, held, steps to detect, notifications per fault, false notifications, faults inside
the reference or across a resume caught within 5 steps, workload-change warnings, the hang after a long warm-up),
every fault's row (caught, held, held after detection, steps to detect — seconds for hangs —, steps to re-detect
after a resume, notifications) and every run's false notifications. Info notices are reported, not compared
(planned work announces itself by design). The comparison is exact (the scorecard is deterministic: fixed run
starts, one Prometheus evaluation) and needs the same corpus: a changed corpus must be re-baselined.
"""
from __future__ import annotations

import math

HIGHER = "higher"
LOWER = "lower"
TOTALS = {
    "caught": HIGHER, "held_mean": HIGHER, "held_min": HIGHER, "held_after_detect_full": HIGHER,
    "detect_steps_median": LOWER, "detect_steps_max": LOWER, "notifications_per_fault": LOWER,
    "false_healthy": LOWER, "false_faulty_runs": LOWER, "early_or_resume_within_5": HIGHER,
    "workload_change_warnings": LOWER, "hang_after_warmup_detect_x_step": LOWER,
}
FAULT = {"caught": HIGHER, "held": HIGHER, "held_after_detect": HIGHER, "detect_steps": LOWER, "detect_s": LOWER,
         "redetect_steps": LOWER, "notifications": LOWER}
RUN = {"false_notifications": LOWER}
EPS = 1e-9
REBASELINE = "re-baseline with `make scorecard` if the change is wanted"


def _num(x, direction: str) -> float:
    """A figure as a number; missing (never caught, not measured) is the worst value."""
    if x is None:
        return math.inf if direction == LOWER else -math.inf
    return float(x)


def _worse(old, new, direction: str) -> bool:
    a, b = _num(old, direction), _num(new, direction)
    if a == b:
        return False
    return b > a + EPS if direction == LOWER else b < a - EPS


def fault_key(f: dict) -> str:
    return f"{f['run']}:{f['kind']}@{f['first_step']}"


def regressions(current: dict, baseline: dict) -> list[str]:
    """Every figure of ``current`` worse than in ``baseline`` (one line each); [] when none is."""
    if current.get("corpus", {}).get("digest") != baseline.get("corpus", {}).get("digest"):
        return [f"the corpus changed (its files' digest differs from the baseline's): {REBASELINE}"]
    out = []
    for k, d in TOTALS.items():
        old, new = baseline["totals"].get(k), current["totals"].get(k)
        if _worse(old, new, d):
            out.append(f"totals.{k}: {old} -> {new} ({d} is better)")
    base_faults = {fault_key(f): f for f in baseline["faults"]}
    for f in current["faults"]:
        b = base_faults.get(fault_key(f))
        if b is None:
            out.append(f"fault {fault_key(f)} is not in the baseline: {REBASELINE}")
            continue
        for k, d in FAULT.items():
            if (k in f or k in b) and _worse(b.get(k), f.get(k), d):
                out.append(f"fault {fault_key(f)} {k}: {b.get(k)} -> {f.get(k)} ({d} is better)")
    base_runs = {r["run"]: r for r in baseline["runs"]}
    for r in current["runs"]:
        b = base_runs.get(r["run"])
        if b is None:
            out.append(f"run {r['run']} is not in the baseline: {REBASELINE}")
            continue
        for k, d in RUN.items():
            if _worse(b.get(k), r.get(k), d):
                out.append(f"run {r['run']} {k}: {b.get(k)} -> {r.get(k)} ({d} is better)")
    return out
