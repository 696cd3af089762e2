"""Which alerts would have fired, and when: rule expressions evaluated by a real Prometheus over the
backfilled blocks (``query_range`` at the evaluation interval), then Prometheus' own alert state
machine replayed over those evaluations.

The state machine follows ``rules/alerting.go`` (``AlertingRule.Eval``) per label set: the first true
evaluation makes the alert *pending* with ``activeAt = t``; it is *firing* once ``t - activeAt >= for``
(at once when ``for`` is 0); an evaluation without the label set resolves it — unless it was firing and
``keep_firing_for`` has not run out since the first missing evaluation; the next true evaluation after
a resolve starts a new pending alert.

An alert with hysteresis (alerting.rule.hysteresis: ``(HOLD) * on (by) group_left (sticky) ALERTS{this alert, firing}
or on (by) FIRE``) reads its own state: Prometheus writes ``ALERTS{alertstate="firing"}`` at each evaluation and the next
evaluation sees it (a resolved alert's series is marked stale at once). ``true_at`` then queries both halves, and
:func:`hysteresis_intervals` runs the state machine of every label set of one run together: at each evaluation an
instance that was firing at the previous one stays active, labels and all, while HOLD holds for its ``by`` labels; a
FIRE label set is active where no instance is held for its ``by`` labels.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..alerting.rule import matches, split_hysteresis
from ..rules import LoadedAlert


@dataclass
class Interval:
    """One firing interval of one alert label set, as evaluation-timestamp indices (inclusive)."""
    first: int
    last: int


def firing_intervals(true_at: list[bool], times: list[float], hold: float,
                     keep_firing_for: float = 0.0) -> list[Interval]:
    """Firing intervals of one label set from the per-evaluation truth of its expression."""
    out: list[Interval] = []
    state = "inactive"
    active_at = 0.0
    keep_since: float | None = None
    cur: Interval | None = None
    for k, (t, true) in enumerate(zip(times, true_at)):
        if true:
            keep_since = None
            if state == "inactive":
                state, active_at = "pending", t
            if state == "pending" and t - active_at >= hold:
                state = "firing"
        elif state == "firing" and keep_firing_for > 0:
            if keep_since is None:
                keep_since = t
            if t - keep_since >= keep_firing_for:
                state = "inactive"
        else:
            state = "inactive"
        if state == "firing":
            if cur is None:
                cur = Interval(k, k)
                out.append(cur)
            cur.last = k
        else:
            cur = None
    return out


def alert_labels(rule: LoadedAlert, metric: dict[str, str]) -> dict[str, str]:
    """The alert's label set: the sample's labels without ``__name__``, then the rule's labels (static
    values; a templated label value is kept as written), then ``alertname``."""
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    labels.update(rule.labels)
    labels["alertname"] = rule.name
    return labels


@dataclass
class Firing:
    rule: LoadedAlert
    labels: dict[str, str]
    first_t: float
    last_t: float
    resolved_t: float | None = None  # the first evaluation without it after last_t (None: firing to the end)


def _truth(prom, rule: LoadedAlert, expr: str, times: list[float]) -> dict[tuple, tuple[dict, list[bool]]]:
    step = times[1] - times[0] if len(times) > 1 else 15.0
    index = {round(t * 1000): k for k, t in enumerate(times)}
    truth: dict[tuple, tuple[dict, list[bool]]] = {}
    for series in prom.query_range(expr, times[0], times[-1], step):
        labels = alert_labels(rule, series["metric"])
        key = tuple(sorted(labels.items()))
        _, flags = truth.setdefault(key, (labels, [False] * len(times)))
        for ts, _value in series["values"]:
            k = index.get(round(float(ts) * 1000))
            if k is not None:
                flags[k] = True
    return truth


def true_at(prom, rule: LoadedAlert, times: list[float]) -> list[tuple[dict, list[bool], list[bool] | None]]:
    """One range query of the rule's condition over ``times`` (an even grid): per alert label set, whether
    it held at each timestamp. An alert with hysteresis: the label sets of its firing condition, and (third item) for
    each the truth of its hold condition at the same ``by`` labels; the hold condition's own ``by`` label sets that
    no firing label set has are listed too, with no firing truth (their instances can only be held)."""
    if not times:
        return []
    h = split_hysteresis(rule.eval_expr)
    if h is None:
        return [(labels, flags, None) for labels, flags in _truth(prom, rule, rule.eval_expr, times).values()]
    fire = _truth(prom, rule, h.fire, times)
    held: dict[tuple, list[bool]] = {}
    for labels, flags in _truth(prom, rule, h.hold, times).values():
        key = tuple(labels.get(b, "") for b in h.by)
        cur = held.setdefault(key, [False] * len(times))
        for k, f in enumerate(flags):
            cur[k] = cur[k] or f
    out = [(labels, flags, held.get(tuple(labels.get(b, "") for b in h.by), [False] * len(times)))
           for labels, flags in fire.values()]
    return out + [({b: v for b, v in zip(h.by, key)}, [False] * len(times), flags) for key, flags in held.items()]


def hysteresis_by(rule: LoadedAlert) -> tuple[tuple[str, ...], str]:
    """The ``by`` labels of a rule with hysteresis and the matchers of the instances it holds (else ``()``)."""
    h = split_hysteresis(rule.eval_expr)
    return (h.by, h.matchers) if h is not None else ((), "")


def hysteresis_intervals(series: list[tuple[dict, list[bool], list[bool]]], times: list[float], hold: float,
                         by: tuple[str, ...], keep_firing_for: float = 0.0,
                         held_matchers: str = "") -> list[tuple[dict, list[Interval]]]:
    """Firing intervals of every instance of one rule with hysteresis over one run's evaluations (``series``: as
    ``true_at`` returns them), run together. At evaluation k the ``by`` label sets whose hold condition holds and
    that had a firing instance at k - 1 are held: those instances stay active with their labels; every other
    ``by`` label set is active where its firing condition holds (Prometheus' state machine per instance, as
    ``firing_intervals``). ``held_matchers``: the rule's ALERTS matchers; an instance they do not select is never held."""
    hold_of: dict[tuple, list[bool]] = {}
    fire_sets: list[tuple[dict, tuple, list[bool]]] = []
    for labels, fire, held in series:
        key = tuple(labels.get(b, "") for b in by)
        hold_of[key] = held if key not in hold_of else [a or b for a, b in zip(hold_of[key], held)]
        if any(fire):
            fire_sets.append((labels, key, fire))
    state: dict[tuple, list] = {}  # instance (sorted labels) -> [state, active_at, keep_since, labels, key]
    out: dict[tuple, list[Interval]] = {}
    cur: dict[tuple, Interval] = {}
    firing_prev: dict[tuple, set] = {}  # by key -> instances firing at k - 1
    for k, t in enumerate(times):
        held_keys = {key for key, insts in firing_prev.items() if insts and hold_of.get(key, [False] * (k + 1))[k]}
        active = {inst for key in held_keys for inst in firing_prev[key]}
        for labels, key, fire in fire_sets:
            if key not in held_keys and fire[k]:
                inst = tuple(sorted(labels.items()))
                active.add(inst)
                state.setdefault(inst, ["inactive", 0.0, None, labels, key])
        firing_now: dict[tuple, set] = {}
        for inst, st in state.items():
            if inst in active:
                st[2] = None
                if st[0] == "inactive":
                    st[0], st[1] = "pending", t
                if st[0] == "pending" and t - st[1] >= hold:
                    st[0] = "firing"
            elif st[0] == "firing" and keep_firing_for > 0:
                if st[2] is None:
                    st[2] = t
                if t - st[2] >= keep_firing_for:
                    st[0] = "inactive"
            else:
                st[0] = "inactive"
            if st[0] == "firing" and matches(held_matchers, st[3]):
                firing_now.setdefault(st[4], set()).add(inst)
            if st[0] == "firing":
                if inst not in cur:
                    cur[inst] = Interval(k, k)
                    out.setdefault(inst, []).append(cur[inst])
                cur[inst].last = k
            else:
                cur.pop(inst, None)
        firing_prev = firing_now
    return [(state[inst][3], ivs) for inst, ivs in out.items()]

