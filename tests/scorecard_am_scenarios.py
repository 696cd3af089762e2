"""Scripted Alertmanager scenarios, shared by the model's unit test (tests/test_scorecard_amsim.py: the literal
notifications the model must send) and the real-Alertmanager test (tests/test_scorecard_alertmanager.py: a real
Alertmanager 0.25 must send what the model predicts for the very posts made).

The configuration is alerts/alertmanager.yml with its times scaled down (``scaled``): group_wait and
group_interval / 100 (10 s -> 0.1 s, 20 s -> 0.2 s, 5 m -> 3 s), repeat_interval / 6000 (24 h -> 14.4 s). Every
scenario is one run (its own ``experiment``) and a list of posts (seconds from the scenario's start, the alerts of
one request); an alert is firing (``endsAt`` one minute ahead) or resolved at the post (``endsAt`` = the post)."""
from __future__ import annotations

import copy
from dataclasses import dataclass

from omniwatch import names as n, rules

GROUP_FACTOR = 0.01
REPEAT_FACTOR = 1 / 6000  # 24 h -> 14.4 s
FIRING_FOR = 60.0  # a firing alert's endsAt: this far ahead (Prometheus: 4 x max(resend delay, eval interval))
PROJECT = "scorecard-am"


def _scale(text: str, factor: float) -> str:
    from omniwatch.scorecard.amsim import _dur
    ms = round(_dur(text, "scaled") * factor * 1000)
    return f"{ms}ms"


def scaled(doc: dict) -> dict:
    """alerts/alertmanager.yml's routes with their times scaled down (every other key as it is)."""
    doc = copy.deepcopy(doc)
    todo = [doc["route"]]
    while todo:
        r = todo.pop()
        for k, f in (("group_wait", GROUP_FACTOR), ("group_interval", GROUP_FACTOR), ("repeat_interval", REPEAT_FACTOR)):
            if r.get(k) is not None:
                r[k] = _scale(str(r[k]), f)
        todo.extend(r.get("routes") or [])
    return doc


def rule_labels(alertname: str, severity: str | None = None) -> dict[str, str]:
    """The static labels the rule files give an alert (a label removed there changes the scenario)."""
    for a in rules.load_alerts():
        if a.name == alertname and (severity is None or a.labels.get("severity") == severity):
            return {k: str(v) for k, v in a.labels.items()} | {"alertname": alertname}
    raise AssertionError(f"no alert {alertname} ({severity}) in the rule files")


@dataclass(frozen=True)
class Post:
    at: float                     # seconds from the scenario's start
    alerts: tuple                 # (labels, "firing" | "resolved", starts offset or None: the post itself)


def _a(scenario: str, alertname: str, state: str = "firing", severity: str | None = None, starts: float | None = None,
       **extra) -> tuple:
    labels = rule_labels(alertname, severity) | {n.L_PROJECT: PROJECT, n.L_EXPERIMENT: scenario} | extra
    return (labels, state, starts)


S1, S2, S3, S4, S5 = ("cause_inhibits_regression", "flap_inside_group_interval", "critical_mutes_warning",
                      "repeat_interval", "new_group_after_cleanup")
STR, RBR = n.ALERT_STEP_REGRESSION, n.ALERT_REWARD_BOUND
SCENARIOS: dict[str, list[Post]] = {
    # RewardBoundRollout mutes StepTimeRegression{cause=reward} (not cause=actor); cause=rollout has its own route
    # (group_wait 20 s); once RewardBoundRollout resolves, the reward regression is a new firing alert of its group.
    S1: [Post(0.0, (_a(S1, RBR), _a(S1, STR, cause="reward"), _a(S1, STR, cause="actor"), _a(S1, STR, cause="rollout"))),
         Post(1.5, (_a(S1, RBR, "resolved", starts=0.0),))],
    # One alert of a group resolves and fires again between two flushes: nothing is sent; a resolve across a flush is
    # sent (another alert still fires: status firing), and so is the re-fire after it.
    S2: [Post(0.0, (_a(S2, n.ALERT_MFU_DROP, role="actor_infer"), _a(S2, n.ALERT_MFU_DROP, role="actor"))),
         Post(0.8, (_a(S2, n.ALERT_MFU_DROP, "resolved", starts=0.0, role="actor"),)),
         Post(1.6, (_a(S2, n.ALERT_MFU_DROP, role="actor"),)),
         Post(4.0, (_a(S2, n.ALERT_MFU_DROP, "resolved", starts=1.6, role="actor"),)),
         Post(7.0, (_a(S2, n.ALERT_MFU_DROP, role="actor"),))],
    # TrainingStalled's warning mutes its info notice (another route) and the run's step alerts; its critical stage
    # mutes the warning: the group's next message carries the critical alone, at the escalation route's next flush
    # (group_interval 30 s, scaled 0.3 s: flushes at 0.1, 0.4, 0.7, 1.0, 1.3; the post falls between two).
    S3: [Post(0.0, (_a(S3, n.ALERT_STALLED, severity="warning"), _a(S3, n.ALERT_STALLED, severity="info"))),
         Post(1.15, (_a(S3, n.ALERT_STALLED, severity="critical"), _a(S3, RBR)))],
    # Nothing changes: the group is sent again after repeat_interval (14.4 s), at its next flush.
    S4: [Post(0.0, (_a(S4, n.ALERT_IDLE, evidence="timers"),))],
    # A group whose alerts all resolved is dropped at the dispatcher's next 30-second cleanup: a later alert starts a
    # new group and is sent after group_wait (an existing group would wait for its next flush, at 36.1 s).
    S5: [Post(0.0, (_a(S5, STR, cause="weight_sync"),)),
         Post(0.5, (_a(S5, STR, "resolved", starts=0.0, cause="weight_sync"),)),
         Post(34.6, (_a(S5, STR, cause="weight_sync"),))],
}
DURATION = {S1: 7.0, S2: 11.0, S3: 5.0, S4: 17.0, S5: 38.0}


def model_alerts(post: Post, t0: float, t: float):
    """The alerts of ``post`` (made at ``t``, its scenario started at ``t0``) as the model's input."""
    from omniwatch.scorecard.amsim import AmAlert
    out = []
    for labels, state, starts in post.alerts:
        s = t if starts is None else t0 + starts
        out.append(AmAlert(dict(labels), s, t + FIRING_FOR if state == "firing" else t))
    return out


def summary(note) -> tuple:
    """A notification as compared: (experiment, status, firing alerts, resolved alerts), each alert by its name and
    the labels that tell it apart in its group."""
    def ident(a: dict) -> str:
        extra = ",".join(f"{k}={a[k]}" for k in ("severity", "cause", "role", "evidence") if k in a
                         and not (k == "severity" and a.get("alertname") != n.ALERT_STALLED))
        return f"{a['alertname']}{{{extra}}}" if extra else a["alertname"]
    exp = dict(note.group).get(n.L_EXPERIMENT) if hasattr(note, "group") else note["experiment"]
    firing = note.firing if hasattr(note, "firing") else note["firing"]
    resolved = note.resolved if hasattr(note, "resolved") else note["resolved"]
    status = note.status if hasattr(note, "status") else note["status"]
    return (exp, status, tuple(sorted(ident(a) for a in firing)), tuple(sorted(ident(a) for a in resolved)))
