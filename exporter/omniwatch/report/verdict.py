"""The verdict: the bottlenecks the alert rules found, ranked by the GPU-hours they cost, each with the
remedy the alert itself carries for the run's detected layout.

What a bottleneck costs, from the ledger (every step's GPU-seconds by bucket) at the steps where its
alert fired (Alertmanager's inhibitions applied, so nothing is counted twice):

- ``RewardBoundRollout``: the ``reward_critical_path`` bucket (the time a reward pool or a faster scorer
  takes off the critical path);
- ``InterStageIdleGPU``: the ``inter_stage_idle`` bucket (GPUs reserved and idle);
- ``MFUDrop``: the part of the role's phase the drop added: phase seconds x (1 - the step's MFU / the
  anchored reference's MFU);
- ``StepTimeRegression``: the growth of its cause in each step over the anchored reference's median
  (``omniwatch_step_regression_seconds`` is the same over the window) x GPUs, at steps where the
  cause's own alert is not on (Alertmanager inhibits it then: ``alerts/alertmanager.yml``); a step change and a
  creep are the same alert;

These regressions are priced for **every step they lasted**, not only where the alert fired: from
the first step of the window that made it fire (the k-step window) to the
last step it fired, each step against the anchored reference (the median of the trainer incarnation's
first normal steps: ``config.REFERENCE_STEPS``), so a slowdown that lasts to the end of the run is
priced to the end, and the steps it took the window to see it are priced too.
- ``TrainingStalled``: the ``stalled`` bucket: stalls between steps (live runs; a finished file has none) and the
  stall still open at the report's end (a live report's now, ``report --until``): GPUs x the time past the last step
  beyond the tolerance and the planned work (``ledger.open_stall``); a run whose Ray job failed is priced as
  ``TrainingCrashed`` up to the crash instead;
- ``TimeOutsideStep``: the ``outside_step_timer`` bucket (live runs).

Other alerts (an impossible or missing MFU, reward saturation, memory) are findings without a GPU-time
cost of their own: listed with 0 GPU-hours and their remedy. Remedy text: ``alert.remedy.expect`` of
the alert's spec (:mod:`omniwatch.alerting.remedies`), the one source shared with the annotations.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from .. import names
from ..core import ledger
from ..alerting import rulespec
from ..config import DEFAULT, Config
from ..prosetext import Ctx
from ..core.analytics import CAUSE_OF_PHASE
from .facts import HOUR, RunFacts
from ..rules import alertmanager_config_path
from ..yamlio import load as yaml_load

# Regressions priced for every step they lasted against the anchored reference: alert -> the normal steps of
# the window that made it fire (the episode starts at its first).
LASTING = (names.ALERT_MFU_DROP, names.ALERT_STEP_REGRESSION)


def lasting_window(alertname: str, cfg: Config) -> int:
    """The normal steps whose window made ``alertname`` fire, in the alert config the rules were made with."""
    return cfg.window.k
COST_RULE = {
    names.ALERT_MFU_DROP: "every step from the first of the window that fired it to its last firing step: the role's "
                          "phase seconds x (1 - the step's MFU / the reference MFU) x GPUs",
    names.ALERT_STEP_REGRESSION: "every step from the first of the window that fired it to its last firing step: the "
                                 "cause's seconds over the reference's median x GPUs (0 while the cause's own alert is on)",
}
REFERENCE_NOTE = ("reference: the median of the first normal steps of the trainer incarnation "
                  "(warm-up, validation and checkpoint steps left out); a restart starts a new one")
# Alerts whose cost is a whole bucket: the rate of that bucket (omniwatch_gpu_hours_per_day) is what they cost per day.
RATE_ALERTS = {names.ALERT_REWARD_BOUND: (ledger.REWARD,), names.ALERT_IDLE: (ledger.IDLE,),
               names.ALERT_OUTSIDE_STEP: (ledger.OUTSIDE,)}
ROLE_PHASE = {"actor": "update_actor", "actor_infer": "old_log_prob"}  # MFU role -> the phase it times
COST_NOTE = {
    names.ALERT_MFU_IMPOSSIBLE: "a measurement error: MFU comparisons are meaningless until fixed",
    names.ALERT_MFU_LOW: "a measurement or starvation finding",
    names.ALERT_MFU_UNSUPPORTED: "no estimator: read throughput instead",
    names.ALERT_REWARD_SATURATION: "a learning-signal finding, not GPU time",
    names.ALERT_GRAD_NONFINITE: "a learning-signal finding, not GPU time",
    names.ALERT_RS_REJECTION: "a learning-signal finding, not GPU time",
    names.ALERT_STRAGGLER: "the slow samples' tail is inside gen (no bucket of its own)",
    names.ALERT_TIMERS_EXCEED: "a measurement finding: nested or overlapping timers",
}


@dataclass
class Bottleneck:
    alertname: str
    gpu_seconds: float
    remedy: str
    labels: list[dict[str, str]]
    steps: list[tuple[int, int]]        # (first, last) of each firing span
    note: str = ""
    buckets: list[str] = field(default_factory=list)
    per_day: float | None = None  # GPU-hours/day its buckets cost at the rate of its last firing step
    priced: list[tuple[int, int]] = field(default_factory=list)  # (first, last) step of each priced episode
    rule: str = ""                # how its GPU-hours were computed (the page says it)
    action: str = ""              # the remedy's one-line action (issue 32 item 2)
    severity: str = ""            # the most severe severity it fired at
    firing_at_end: bool = False   # still firing at the run's last step ("now", for a live run)
    now_per_day: float = 0.0      # what it costs now: GPU-hours per day at the rate of the run's last step (0: none)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / HOUR

    def as_json(self) -> dict:
        return {"bottleneck": self.alertname, "gpu_hours": round(self.gpu_hours, 6), "remedy": self.remedy,
                "action": self.action, "severity": self.severity, "firing_at_end": self.firing_at_end,
                "gpu_hours_per_day_now": round(self.now_per_day, 3),
                "steps": [list(s) for s in self.steps], "buckets": self.buckets, "note": self.note,
                "gpu_hours_per_day": None if self.per_day is None else round(self.per_day, 3),
                "priced_steps": [list(s) for s in self.priced], "cost_rule": self.rule}


def cause_buckets(cause: str) -> list[str]:
    """Ledger buckets of a StepTimeRegression cause (analytics.CAUSE_OF_PHASE through ledger.bucket_of)."""
    out = {ledger.bucket_of(ph) for ph, c in CAUSE_OF_PHASE.items() if c == cause}
    if cause == "reward":
        out.add(ledger.REWARD)
    return ledger.ordered(out)


@lru_cache(maxsize=4)
def inhibitors(path: str | None = None) -> dict[str, str]:
    """StepTimeRegression cause -> the alert that inhibits it, read from alerts/alertmanager.yml."""
    doc = yaml_load(open(path or alertmanager_config_path(), encoding="utf-8")) or {}
    out: dict[str, str] = {}
    for rule in doc.get("inhibit_rules") or []:
        src = _matchers(rule.get("source_matchers"))
        tgt = _matchers(rule.get("target_matchers"))
        if tgt.get("alertname") == names.ALERT_STEP_REGRESSION and "cause" in tgt and "alertname" in src:
            out[tgt["cause"]] = src["alertname"]
    return out


def _matchers(ms) -> dict[str, str]:
    out = {}
    for m in ms or []:
        g = re.fullmatch(r'\s*(\w+)\s*=\s*"([^"]*)"\s*', str(m))
        if g:
            out[g[1]] = g[2]
    return out


SEVERITY_RANK = {"critical": 3, "warning": 2, "info": 1}


def _spec(alertname: str, labels: dict[str, str], cfg: Config, severity: str | None = None):
    """The alert spec whose severity and static labels the alert carries (TrainingStalled: its stage)."""
    cands = [a for a in rulespec.alerts(cfg) if a.name == alertname and a.remedy is not None]
    sev = severity or labels.get("severity")
    if sev:
        cands = [a for a in cands if a.severity == sev] or cands
    best = [a for a in cands if all(labels.get(k) == str(v) for k, v in a.labels.items())] or cands
    return best[0] if best else None


def _ctx(labels: dict[str, str], modes: dict[str, str] | None, series: dict[str, float] | None,
         trainer_config: dict | None) -> Ctx:
    from ..prosetext import setting_series
    from ..trainer_config import info_labels
    extra = dict(series or {})
    if trainer_config is not None:
        extra.update(setting_series(trainer_config.get("settings") or {}, info_labels(trainer_config)))
    else:
        extra.update(setting_series(None))
    return Ctx(labels, None, extra, modes if modes else None)


def remedy(alertname: str, labels: dict[str, str], modes: dict[str, str] | None,
           series: dict[str, float] | None = None, cfg: Config = DEFAULT, severity: str | None = None,
           trainer_config: dict | None = None) -> str:
    """The remedy annotation of the alert (the spec of its severity and static labels), rendered for the run's
    detected modes and trainer config (``trainer_config.describe``'s ``settings``), as Prometheus renders it."""
    a = _spec(alertname, labels, cfg, severity)
    return "" if a is None else a.remedy.expect(_ctx(labels, modes, series, trainer_config))


def action(alertname: str, labels: dict[str, str], modes: dict[str, str] | None,
           series: dict[str, float] | None = None, cfg: Config = DEFAULT, severity: str | None = None,
           trainer_config: dict | None = None) -> str:
    """The remedy's one-line action, rendered like :func:`remedy`."""
    a = _spec(alertname, labels, cfg, severity)
    act = getattr(a.remedy, "action", None) if a is not None else None
    return "" if act is None else act.expect(_ctx(labels, modes, series, trainer_config))


def onset_index(f: RunFacts, first_index: int, window: int) -> int:
    """The line index of the first of the ``window`` normal steps that made an alert fire at ``first_index``
    (fewer when the run has fewer before it)."""
    onset, seen = first_index, 0
    for p in sorted((p for p in f.steps if p.index <= first_index), key=lambda p: -p.index):
        if p.normal:
            onset, seen = p.index, seen + 1
            if seen == window:
                break
    return onset


def episodes(f: RunFacts, cfg: Config = DEFAULT) -> list[tuple[object, int, int]]:
    """Each alert span with the first line index it is on from (a step-based alert: the first step of the
    window that fired it, so inhibitions cover the same steps) and the first it is priced from (the lasting
    regressions: that onset; the others: their firing start)."""
    out = []
    for a in f.alerts:
        steps_based = a.labels.get("persistence") == "steps"
        on = onset_index(f, a.first_index, lasting_window(a.alertname, cfg)) if steps_based else a.first_index
        out.append((a, on, on if a.alertname in LASTING else a.first_index))
    return out


def verdict(f: RunFacts, cfg: Config = DEFAULT) -> list[Bottleneck]:
    """The run's bottlenecks, priced; ``cfg``: the alert config its rules were made with (``report --config``)."""
    by_index = f.index_of()
    firing: dict[int, set[str]] = {}
    spans = episodes(f, cfg)
    for a, on, _ in spans:
        for i in range(on, a.last_index + 1):
            firing.setdefault(i, set()).add(a.alertname)
    inhib = inhibitors()
    out: dict[str, Bottleneck] = {}
    priced: dict[tuple, set[int]] = {}  # (alert, labels) -> line indexes already priced (overlapping episodes)
    last_index = max((p.index for p in f.steps), default=None)
    for a, _, start in sorted(spans, key=lambda s: -SEVERITY_RANK.get(s[0].severity, 0)):
        b = out.get(a.alertname)
        if b is None:
            labels = {**a.labels, "severity": a.severity}
            ann = a.annotations or {}
            b = out[a.alertname] = Bottleneck(
                a.alertname, 0.0,
                ann.get("remedy") or remedy(a.alertname, labels, f.modes, f.series, cfg, a.severity, f.trainer_config),
                [], [], COST_NOTE.get(a.alertname, ""),
                action=ann.get("action") or action(a.alertname, labels, f.modes, f.series, cfg, a.severity,
                                                   f.trainer_config),
                severity=a.severity)
            if a.alertname in COST_RULE:
                b.rule = f"{COST_RULE[a.alertname]} ({REFERENCE_NOTE})"
        if last_index is not None and a.last_index >= last_index:
            b.firing_at_end = True
            b.now_per_day = max(b.now_per_day, now_cost(a.alertname, {**a.labels, "severity": a.severity},
                                                         by_index.get(last_index), f.gpus or 1))
        b.labels.append(a.labels)
        b.steps.append((a.first_step, a.last_step))
        done = priced.setdefault((a.alertname, tuple(sorted(a.labels.items()))), set())
        if a.alertname in LASTING and by_index.get(start) is not None:
            b.priced.append((by_index[start].step, a.last_step))
        for i in range(start, a.last_index + 1):
            p = by_index.get(i)
            if p is None or i in done:
                continue
            done.add(i)
            cost, buckets = _cost(a.alertname, a.labels, p, f.gpus or 1, firing.get(i, set()), inhib)
            b.gpu_seconds += cost
            b.buckets = ledger.ordered(set(b.buckets) | set(buckets))
        last = by_index.get(a.last_index)
        if last is not None and last.per_day and a.alertname in RATE_ALERTS:
            b.per_day = sum(last.per_day.get(k, 0.0) for k in RATE_ALERTS[a.alertname])
    for b in out.values():
        if b.alertname == names.ALERT_STEP_REGRESSION and b.gpu_seconds == 0 and not b.note:
            b.note = "inhibited at every firing step by the alert of its cause, which counts that time"
    stalled = f.gpu_seconds.get(ledger.STALLED, 0.0)
    if stalled > 0:  # the ledger's stalled bucket is TrainingStalled's cost, whether or not its alert was seen
        # (with the stall still open at the report's end: report --until, a live report's now; issue 31 item 3)
        name = names.ALERT_CRASHED if f.end_state == "crashed" else names.ALERT_STALLED
        b = out.get(name) or Bottleneck(name, 0.0, "", [], [], severity="critical")
        # past the tolerance: the hang's (or the crash's) remedy, not the info stage's notice
        b.remedy = remedy(name, {}, f.modes, f.series, cfg, "critical", f.trainer_config)
        b.action = action(name, {}, f.modes, f.series, cfg, "critical", f.trainer_config)
        b.gpu_seconds, b.buckets = stalled, [ledger.STALLED]
        if f.open_stall_s > 0:
            open_h = f.open_stall_s * (f.gpus or 1) / HOUR
            b.note = (f"{open_h:,.2f} GPU-h of it still open at the report's end: no step for "
                      f"{(f.stall_end - f.last_step_at) / 60:,.1f} min, {f.open_stall_s / 60:,.1f} min of it beyond "
                      "the stall tolerance and the planned work" if f.stall_end and f.last_step_at else
                      "still open at the report's end")
            if name == names.ALERT_CRASHED:
                b.note += f"; the run crashed: {f.crash_error}" if f.crash_error else "; the run crashed"
        else:
            b.note = b.note or "time with no step beyond the stall tolerance"
        out[name] = b
        if name == names.ALERT_CRASHED and names.ALERT_STALLED in out and out[names.ALERT_STALLED].gpu_seconds == 0:
            del out[names.ALERT_STALLED]
    return rank(out.values())


def rank(bs) -> list[Bottleneck]:
    """The costliest cause first (issue 32 item 1): what still fires at the run's last step, by what it costs now
    (GPU-hours per day at the last step's rate), ties by severity; then what fired earlier, by the GPU-hours it cost."""
    return sorted(bs, key=lambda b: (not b.firing_at_end, -b.now_per_day if b.firing_at_end else 0.0,
                                     -SEVERITY_RANK.get(b.severity, 0) if b.firing_at_end else 0.0,
                                     -b.gpu_seconds, b.alertname))


def now_cost(alertname: str, labels: dict, p, gpus: int) -> float:
    """GPU-hours per day the alert costs at step ``p``'s rate: its ledger bucket's rate (reward on the critical path,
    inter-stage idle, outside the step timer); a regression's growth over the reference as a share of the step x GPUs
    x 24 h (StepTimeRegression: its cause; MFUDrop: the actor); 0 for findings."""
    if p is None:
        return 0.0
    if alertname == names.ALERT_STALLED:  # past its warning every GPU of the run waits
        return gpus * 24.0 if labels.get("severity") in ("warning", "critical") else 0.0
    if alertname == names.ALERT_CRASHED:  # every GPU of the run is held until someone restarts it
        return gpus * 24.0
    if alertname in RATE_ALERTS:
        return sum(p.per_day.get(k, 0.0) for k in RATE_ALERTS[alertname])
    if not p.duration:
        return 0.0

    def grown(cause: str) -> float:
        if cause in p.causes and cause in p.cause_reference:
            return max(0.0, p.causes[cause] - p.cause_reference[cause])
        return max(0.0, p.regression.get(cause, 0.0))
    if alertname == names.ALERT_STEP_REGRESSION:
        extra = grown(labels.get("cause", "other"))
    elif alertname == names.ALERT_MFU_DROP:
        extra = grown("actor")
    else:
        return 0.0
    return extra / p.duration * gpus * 24.0


def _cost(alertname: str, labels: dict, p, gpus: int, firing: set[str], inhib: dict[str, str]):
    if alertname == names.ALERT_REWARD_BOUND:
        return p.gpu_seconds.get(ledger.REWARD, 0.0), [ledger.REWARD]
    if alertname == names.ALERT_IDLE:
        return p.gpu_seconds.get(ledger.IDLE, 0.0), [ledger.IDLE]
    if alertname == names.ALERT_OUTSIDE_STEP:
        return p.gpu_seconds.get(ledger.OUTSIDE, 0.0), [ledger.OUTSIDE]
    if alertname == names.ALERT_MFU_DROP:
        role = labels.get("role", "actor")
        phase = ROLE_PHASE.get(role)
        v, base = p.mfu.get(role), p.mfu_baseline.get(role)
        if not phase or not v or not base or v >= base:
            return 0.0, [phase] if phase else []
        return p.gpu_seconds.get(phase, 0.0) * (1 - v / base), [phase]
    if alertname == names.ALERT_STEP_REGRESSION:
        cause = labels.get("cause", "other")
        if inhib.get(cause) in firing:
            return 0.0, []
        if cause in p.causes and cause in p.cause_reference:
            grown = p.causes[cause] - p.cause_reference[cause]
        else:  # a live run's series: the window's growth
            grown = p.regression.get(cause, 0.0)
        return max(0.0, grown) * gpus, cause_buckets(cause)
    return 0.0, []


def lost_gpu_hours(bs: list[Bottleneck]) -> float:
    return sum(b.gpu_hours for b in bs)
