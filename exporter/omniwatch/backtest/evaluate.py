"""Which alerts would have fired, and when: rule expressions evaluated by a real Prometheus over the
backfilled blocks (``query_range`` at the evaluation interval), then Prometheus' own alert state
machine replayed over those evaluations.

The state machine follows ``rules/alerting.go`` (``AlertingRule.Eval``) per label set: the first true
evaluation makes the alert *pending* with ``activeAt = t``; it is *firing* once ``t - activeAt >= for``
(at once when ``for`` is 0); an evaluation without the label set resolves it — unless it was firing and
``keep_firing_for`` has not run out since the first missing evaluation; the next true evaluation after
a resolve starts a new pending alert.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ruleset import AlertRule


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


def alert_labels(rule: AlertRule, metric: dict[str, str]) -> dict[str, str]:
    """The alert's label set: the sample's labels without ``__name__``, then the rule's labels (static
    values; a templated label value is kept as written), then ``alertname``."""
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    labels.update(rule.labels)
    labels["alertname"] = rule.name
    return labels


@dataclass
class Firing:
    rule: AlertRule
    labels: dict[str, str]
    first_t: float
    last_t: float
    resolved_t: float | None = None  # the first evaluation without it after last_t (None: firing to the end)


def true_at(prom, rule: AlertRule, times: list[float]) -> list[tuple[dict, list[bool]]]:
    """One range query of the rule's condition over ``times`` (an even grid): per alert label set, whether
    it held at each timestamp."""
    if not times:
        return []
    step = times[1] - times[0] if len(times) > 1 else 15.0
    index = {round(t * 1000): k for k, t in enumerate(times)}
    truth: dict[tuple, tuple[dict, list[bool]]] = {}
    for series in prom.query_range(rule.eval_expr, times[0], times[-1], step):
        labels = alert_labels(rule, series["metric"])
        key = tuple(sorted(labels.items()))
        _, flags = truth.setdefault(key, (labels, [False] * len(times)))
        for ts, _value in series["values"]:
            k = index.get(round(float(ts) * 1000))
            if k is not None:
                flags[k] = True
    return list(truth.values())

