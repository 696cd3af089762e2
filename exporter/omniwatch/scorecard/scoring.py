"""The scorecard's figures: every run of the corpus backtested in one pass (``backtest_many``: the repository's
rule files evaluated by a real Prometheus), what Prometheus sends fed to the Alertmanager model of
``alerts/alertmanager.yml`` (``amsim``), and each injected fault judged against what fired and what a person
received.

Definitions (docs/scorecard.md says how to read them):

- a fault's **steps** are the step lines whose step number lies in its [first, last] (both incarnations of a
  resumed run); its **window** runs from the start of its first step to ``GRACE_STEPS`` lines after its last
  (a window statistic lags its fault by a few steps, a 10-step median by up to 10), or to the end of the run;
- **caught**: a firing notification carrying an alert that names its cause (``named_by``) arrived in its window;
  **steps to detect**: step lines from its first step to the line in force when that notification arrived
  (0: on its first step's line);
- **held**: the share of its steps during which an alert naming its cause was firing (in Prometheus);
  **held after detection**: the same share counted from the first such step of each trainer incarnation;
- **notifications**: firing notifications (warning or critical) a person received for the fault's run inside its
  window, whatever the alert; info notices are counted apart. Per alert, its notifications in fault windows over
  all faults (the per-alert figures add up to the total);
- **false notifications**: firing notifications (warning or critical) on healthy runs; on faulty runs, those
  outside every fault's and change's window;
- **hangs** are timed in seconds from the last line before the hung step, and as a multiple of the run's
  step (its warm-up step when the truth gives one).
"""
from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..backtest.backtest import LOOKBACK
from ..backtest.ruleset import GAPS_ONLY
from . import amsim
from .truth import FaultTruth, Matcher, RunTruth

FORMAT = 1
GRACE_STEPS = 10     # a fault's window runs this many step lines past its last step (the 10-step drift median)
START = 1_700_000_000.0  # every run starts here on the simulated clock (a fixed start: the same figures anywhere)
AM_PHASE = 7.0       # Alertmanager started this long before the first evaluation (its cleanup ticks fall between
#                      evaluations, so no timer coincides with a send)
PAGING = ("warning", "critical")
EARLY_OR_RESUME_STEPS = 5  # the bar: a fault inside the reference or across a resume caught within 5 steps


def _median(xs):
    if not xs:
        return None
    m = statistics.median(xs)
    return int(m) if m == int(m) else m


def _r(x, nd=3):
    return None if x is None else round(float(x), nd)


@dataclass
class RunView:
    truth: RunTruth
    result: object  # BacktestResult
    notes: list = field(default_factory=list)  # this run's notifications (amsim.Notification)
    eval_interval: float = 15.0

    @property
    def arrivals(self) -> list[float]:
        return self.result.timeline.arrivals

    @property
    def steps(self) -> list[int]:
        return self.result.timeline.steps

    def at(self, i: int) -> float:
        """When line ``i`` arrived (before the first: when the run started)."""
        return self.arrivals[i] if i >= 0 else self.result.timeline.start

    def index_at(self, t: float) -> int:
        i = self.result.timeline.index_at(t)
        return -1 if i is None else i

    def incarnations(self) -> list[range]:
        """Line index ranges of the trainer incarnations: a new one where the file was truncated or the step
        went back."""
        cuts = set(self.result.run.truncated_before)
        starts = [0] + [i for i in range(1, len(self.steps)) if i in cuts or self.steps[i] <= self.steps[i - 1]]
        ends = starts[1:] + [len(self.steps)]
        return [range(a, b) for a, b in zip(starts, ends)]

    def typical_step(self) -> float:
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]
        return statistics.median(gaps) if gaps else (self.arrivals[0] - self.result.timeline.start)


@dataclass
class Window:
    t0: float
    t1: float

    def has(self, t: float) -> bool:
        return self.t0 <= t < self.t1


def fault_lines(v: RunView, f: FaultTruth) -> list[int]:
    return [i for i, s in enumerate(v.steps) if f.first_step <= s <= f.last_step]


def fault_window(v: RunView, f: FaultTruth) -> tuple[Window, Window, list[int]]:
    """(the window notifications are counted in, the span the fault itself lasts, its lines)."""
    lines = fault_lines(v, f)
    n = len(v.steps)
    if f.is_hang and not lines:  # the log stopped: the hung step never logged
        span = Window(v.arrivals[-1], v.result.gaps_end)
        return Window(span.t0, math.inf), span, lines
    if not lines:
        raise ValueError(f"{v.truth.name}: fault {f.kind} at steps {f.first_step}-{f.last_step} has no line")
    t0 = v.at(lines[0] - 1)
    span_end = v.arrivals[lines[-1]]
    tail = lines[-1] + GRACE_STEPS
    t1 = v.arrivals[tail] if tail < n and lines[-1] < n - 1 else math.inf  # to the end of the run: all it raised
    return Window(t0, t1), Window(t0, span_end), lines


def change_window(v: RunView, first: int, last: int) -> Window:
    lines = [i for i, s in enumerate(v.steps) if first <= s <= last]
    t1 = math.inf if lines[-1] == len(v.steps) - 1 else v.arrivals[lines[-1]]
    return Window(v.at(lines[0] - 1), t1)


def _named(matchers: list[Matcher], alertname: str, labels: dict) -> bool:
    return any(m.matches(alertname, labels) for m in matchers)


def _firing_names(note: amsim.Notification, matchers: list[Matcher] | None = None) -> list[str]:
    return sorted({a.get("alertname", "") for a in note.firing
                   if matchers is None or _named(matchers, a.get("alertname", ""), a)})


def _paging(note: amsim.Notification) -> bool:
    return note.status == "firing" and note.severity in PAGING


def _info(note: amsim.Notification) -> bool:
    return note.status == "firing" and note.severity not in PAGING


def _last_index(v: RunView, h, incs: list[range]) -> int:
    """The last line a hit fired through, without what only the backfill shows: when a trainer restarts, the
    exporter drops the run's window statistics and live scraping marks them stale at once, while a backfill (no
    staleness markers) keeps them visible for the lookback; an alert of the old incarnation that ends within that
    lookback after the new one's first line ended, live, at its restart."""
    last = h.last_index
    for inc in incs[1:]:
        b = inc[0]
        if h.first_index < b <= last and h.last_t <= v.arrivals[b] + LOOKBACK + 2 * v.eval_interval:
            last = b - 1
    return last


def judge_fault(v: RunView, f: FaultTruth, matchers: list[Matcher] | None = None) -> dict:
    """One fault judged (by its own ``named_by``, or by ``matchers``: one alert's share)."""
    matchers = f.named_by if matchers is None else matchers
    win, span, lines = fault_window(v, f)
    hits = [h for h in v.result.alerts if _named(matchers, h.alertname, h.labels)]
    notes = [x for x in v.notes if win.has(x.t)]
    named_notes = [x for x in notes if x.status == "firing" and _firing_names(x, matchers)]
    out: dict = {"caught": bool(named_notes),
                 "caught_by": sorted({nm for x in named_notes for nm in _firing_names(x, matchers)}),
                 "notifications": sum(1 for x in notes if _paging(x)),
                 "info_notifications": sum(1 for x in notes if _info(x))}
    if f.is_hang:
        fired = [(max(h.first_t, span.t0), min(h.resolved_t or span.t1, span.t1)) for h in hits
                 if h.first_t < span.t1 and (h.resolved_t or math.inf) > span.t0]
        first_fire = min((a for a, b in fired if b > a), default=None)
        on = 0.0
        if first_fire is not None:  # firing time share after it first fired, up to the fault's end
            spans = sorted((max(a, first_fire), b) for a, b in fired if b > a)
            end = -math.inf
            for a, b in spans:
                a = max(a, end)
                if b > a:
                    on += b - a
                    end = b
        ref = v.truth.warmup_step_s or v.typical_step()
        detect_s = named_notes[0].t - span.t0 if named_notes else None
        out.update({"detect_s": _r(detect_s, 1), "step_s": _r(ref, 1),
                    "detect_x_step": _r(detect_s / ref if detect_s is not None and ref else None, 2),
                    "held": _r(on / (span.t1 - first_fire) if first_fire is not None and span.t1 > first_fire else 0.0),
                    "held_after_detect": _r(on / (span.t1 - first_fire) if first_fire is not None and span.t1 > first_fire
                                            else 0.0)})
        return out
    incs = v.incarnations()
    held = set()
    for h in hits:
        held.update(range(h.first_index, _last_index(v, h, incs) + 1))
    held &= set(lines)
    num = den = 0
    redetect = None
    for k, inc in enumerate(incs):
        mine = [i for i in lines if i in inc]
        first = min((i for i in mine if i in held), default=None)
        if first is None:
            den += len(mine) if any(i in held for i in lines) else 0
            continue
        after = [i for i in mine if i >= first]
        num += sum(1 for i in after if i in held)
        den += len(after)
        if f.resume and k > 0 and redetect is None:
            redetect = first - inc[0]
    detect = None
    if named_notes:
        detect = max(0, v.index_at(named_notes[0].t) - lines[0])
    out.update({"detect_steps": detect, "held": _r(len(held) / len(lines)),
                "held_after_detect": _r(num / den if den else 0.0)})
    if f.resume:
        out["redetect_steps"] = redetect
    return out


def _run_class(t: RunTruth) -> str:
    return "healthy" if t.healthy else ("fault" if t.faults else "change")


def score(truths: list[RunTruth], results: list, notes: list[amsim.Notification], meta: dict | None = None,
          horizon: float = 0.0, eval_interval: float = 15.0) -> dict:
    """The scorecard (a JSON-able dict) of backtest ``results`` (in ``truths``' order) and Alertmanager's
    notifications; a run's notifications count up to ``horizon`` seconds after its last evaluation (what its last
    evaluations raised, sent after Alertmanager's group wait or interval)."""
    by_run: dict[tuple, RunView] = {}
    views = []
    for t, r in zip(truths, results):
        v = RunView(t, r, eval_interval=eval_interval)
        views.append(v)
        by_run[(t.project, t.experiment)] = v
    for x in notes:
        g = x.group_labels
        key = (g.get("project"), g.get("experiment"))
        if key not in by_run and (x.firing or x.resolved):
            a = (x.firing or x.resolved)[0]
            key = (a.get("project"), a.get("experiment"))
        v = by_run.get(key)
        if v is not None and x.t <= max(v.result.eval_end, v.result.gaps_end) + horizon:
            v.notes.append(x)
    faults_out, runs_out = [], []
    per_alert: dict[str, dict] = {}
    n_faults = sum(len(t.faults) for t in truths)
    totals = {"notifications": 0, "info_notifications": 0, "false_healthy": 0, "info_healthy": 0,
              "false_faulty_runs": 0, "workload_change_warnings": 0}
    false_by_alert: dict[str, int] = {}
    info_by_alert: dict[str, int] = {}
    in_fault_by_alert: dict[str, int] = {}
    for v in views:
        t = v.truth
        windows = []
        for f in t.faults:
            row = {"run": t.experiment, "kind": f.kind, "shape": f.shape, "first_step": f.first_step,
                   "last_step": f.last_step, "named_by": [m.text() for m in f.named_by], **judge_fault(v, f)}
            faults_out.append(row)
            windows.append(fault_window(v, f)[0])
            for name in sorted({m.labels.get("alertname") for m in f.named_by}):
                ms = [m for m in f.named_by if m.labels.get("alertname") == name]
                j = judge_fault(v, f, ms)
                pa = per_alert.setdefault(name, {"faults_named": 0, "caught": 0, "held": [], "detect": []})
                pa["faults_named"] += 1
                pa["caught"] += int(j["caught"])
                pa["held"].append(j["held"])
                if j["caught"] and not f.is_hang:
                    pa["detect"].append(j["detect_steps"])
        changes = [change_window(v, c.first_step, c.last_step) for c in t.changes]
        run_false = run_info = run_in = 0
        for x in v.notes:
            if x.status != "firing":
                continue
            names_ = _firing_names(x)
            in_fault = any(w.has(x.t) for w in windows)
            if in_fault:
                if _paging(x):
                    run_in += 1
                    totals["notifications"] += 1
                    for nm in names_:
                        in_fault_by_alert[nm] = in_fault_by_alert.get(nm, 0) + 1
                else:
                    totals["info_notifications"] += 1
                continue
            if any(w.has(x.t) for w in changes):
                if _paging(x):
                    totals["workload_change_warnings"] += 1
                    run_false += 1
                continue
            if _paging(x):
                run_false += 1
                totals["false_healthy" if t.healthy else "false_faulty_runs"] += 1
                if t.healthy:
                    for nm in names_:
                        false_by_alert[nm] = false_by_alert.get(nm, 0) + 1
            else:
                run_info += 1
                if t.healthy:
                    totals["info_healthy"] += 1
                    for nm in names_:
                        info_by_alert[nm] = info_by_alert.get(nm, 0) + 1
        runs_out.append({
            "run": t.experiment, "class": _run_class(t), "lines": t.lines, "note": t.note,
            "notifications": run_in + run_false, "false_notifications": run_false, "info_notifications": run_info,
            "received": [{"step": v.steps[max(0, v.index_at(x.t))], "status": x.status, "reason": x.reason,
                          "severity": x.severity, "alerts": _firing_names(x) or sorted(
                              {a.get("alertname", "") for a in x.resolved})} for x in v.notes],
            "fired": [{"alertname": h.alertname, "severity": h.severity, "first_step": h.first_step,
                       "last_step": h.last_step,
                       "labels": {k: val for k, val in h.labels.items()
                                  if k not in ("project", "experiment", "severity", "persistence")}}
                      for h in v.result.alerts],
        })
    step_faults = [f for f in faults_out if "detect_steps" in f]
    caught_steps = [f["detect_steps"] for f in step_faults if f["caught"]]
    held = [f["held"] for f in faults_out]
    early = [f for f in step_faults if f["shape"] in ("early", "resume")]

    def within(f) -> bool:
        d = f.get("redetect_steps") if f["shape"] == "resume" else f["detect_steps"]
        return f["caught"] and d is not None and d <= EARLY_OR_RESUME_STEPS
    hangs_after_warmup = [f for f, tr in ((f, next(t for t in truths if t.experiment == f["run"])) for f in faults_out)
                          if f["kind"] == "hang" and tr.warmup_step_s]
    tot = {
        "runs": len(truths), "healthy_runs": sum(t.healthy for t in truths),
        "change_runs": sum(bool(t.changes) and not t.faults for t in truths), "faults": n_faults,
        "lines": sum(t.lines for t in truths),
        "caught": sum(f["caught"] for f in faults_out),
        "held_mean": _r(sum(held) / len(held) if held else None),
        "held_min": _r(min(held) if held else None),
        "held_after_detect_full": sum(1 for f in faults_out if f["caught"] and f["held_after_detect"] >= 1.0),
        "detect_steps_median": _median(caught_steps), "detect_steps_max": max(caught_steps) if caught_steps else None,
        "notifications_per_fault": _r(totals["notifications"] / n_faults if n_faults else None, 2),
        **totals,
        "early_or_resume_faults": len(early),
        "early_or_resume_within_5": sum(1 for f in early if within(f)),
        "hang_after_warmup_detect_x_step": max((f["detect_x_step"] for f in hangs_after_warmup
                                                if f["detect_x_step"] is not None), default=None)
        if hangs_after_warmup and all(f["caught"] for f in hangs_after_warmup) else None,
    }
    bar = [
        _bar("every fault announced by an alert naming its cause", tot["caught"], f"= {n_faults}", tot["caught"] == n_faults),
        _bar("... and held from its first firing to its end", tot["held_after_detect_full"], f"= {n_faults}",
             tot["held_after_detect_full"] == n_faults),
        _bar("notifications per fault", tot["notifications_per_fault"], "<= 1.2",
             tot["notifications_per_fault"] is not None and tot["notifications_per_fault"] <= 1.2),
        _bar("warning/critical notifications on healthy runs", tot["false_healthy"], "= 0", tot["false_healthy"] == 0),
        _bar("faults inside the reference or across a resume caught within 5 steps", tot["early_or_resume_within_5"],
             f"= {len(early)}", tot["early_or_resume_within_5"] == len(early)),
        _bar("warnings for a workload change", tot["workload_change_warnings"], "= 0", tot["workload_change_warnings"] == 0),
        _bar("hang after a long warm-up step: warned within (x that step)", tot["hang_after_warmup_detect_x_step"], "<= 2",
             tot["hang_after_warmup_detect_x_step"] is not None and tot["hang_after_warmup_detect_x_step"] <= 2),
    ]
    alerts_out = []
    for name in sorted(set(per_alert) | set(false_by_alert) | set(info_by_alert) | set(in_fault_by_alert)):
        pa = per_alert.get(name, {"faults_named": 0, "caught": 0, "held": [], "detect": []})
        alerts_out.append({
            "alertname": name, "faults_named": pa["faults_named"], "caught": pa["caught"],
            "held": _r(sum(pa["held"]) / len(pa["held"]) if pa["held"] else None),
            "detect_steps_median": _median(pa["detect"]), "detect_steps_max": max(pa["detect"]) if pa["detect"] else None,
            "notifications_in_faults": in_fault_by_alert.get(name, 0),
            "notifications_per_fault": _r(in_fault_by_alert.get(name, 0) / n_faults if n_faults else None, 2),
            "false_healthy": false_by_alert.get(name, 0), "info_healthy": info_by_alert.get(name, 0)})
    return {"format": FORMAT, **(meta or {}), "totals": tot, "bar": bar, "alerts": alerts_out,
            "faults": faults_out, "runs": runs_out}


def _bar(what: str, value, target: str, met: bool) -> dict:
    return {"criterion": what, "value": value, "target": target, "met": bool(met)}


# --- the whole pass ----------------------------------------------------------------------------------------------
def corpus_digest(truths: list[RunTruth]) -> str:
    """SHA-256 over every corpus file a scorecard reads (truths, replayed files, configs), in order."""
    h = hashlib.sha256()
    for t in truths:
        here = Path(t.path).parent
        files = [Path(t.path).name, *t.replay, *([t.trainer_config] if t.trainer_config else [])]
        for name in files:
            h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return h.hexdigest()


def firings(results: list, eval_interval: float) -> list[amsim.Firing]:
    out = []
    for r in results:
        for h in r.alerts:
            end = r.gaps_end if h.alertname in GAPS_ONLY else r.eval_end
            active = h.first_t - math.ceil(h.hold / eval_interval - 1e-9) * eval_interval
            out.append(amsim.Firing({"alertname": h.alertname, **h.labels}, h.first_t, h.last_t, h.resolved_t,
                                    active, end))
    return out


@dataclass
class Backtested:
    """The corpus backtested (one pass): what Alertmanager is then applied to."""
    truths: list[RunTruth]
    results: list
    rules_dir: str | None
    eval_interval: float
    scrape_interval: float


def backtest_corpus(corpus: str | Path, *, rules_dir=None, eval_interval: float = 15.0, scrape_interval: float = 15.0,
                    progress=None) -> Backtested:
    """Every run of the corpus backtested in one pass (``backtest_many``), each from the same fixed start."""
    from ..backtest.backtest import backtest_many
    from .truth import load_all, load_run
    truths = load_all(corpus)
    runs = [load_run(t) for t in truths]
    results = backtest_many(runs, rules_dir=rules_dir, eval_interval=eval_interval, scrape_interval=scrape_interval,
                            starts=[START] * len(runs), silence=[t.silence_after_s for t in truths],
                            annotations=False, progress=progress)
    return Backtested(truths, results, str(rules_dir) if rules_dir else None, eval_interval, scrape_interval)


def judge(bt: Backtested, cfg: amsim.AMConfig, am_name: str = "alertmanager.yml") -> dict:
    """Alertmanager (``cfg``) applied to what Prometheus sent for the backtested corpus, and the scorecard."""
    ei = bt.eval_interval
    horizon = cfg.longest_wait() + ei
    posts = amsim.prometheus_posts(firings(bt.results, ei), ei, hold_open=horizon)
    first_eval = min(r.timeline.arrivals[0] for r in bt.results)
    started = math.floor(first_eval / ei) * ei - AM_PHASE
    until = max(max(r.eval_end, r.gaps_end) for r in bt.results) + horizon
    notes = amsim.simulate(cfg, posts, until, started)
    r0 = bt.results[0]
    meta = {"corpus": {"digest": corpus_digest(bt.truths), "runs": len(bt.truths)},
            "inputs": {"rules": sorted(Path(f).name for f in _rule_files(bt.rules_dir)), "alertmanager": am_name,
                       "eval_interval_s": ei, "scrape_interval_s": bt.scrape_interval, "horizon_s": horizon,
                       "evaluated": sorted(set(r0.evaluated)), "not_evaluated": sorted(r0.not_evaluated)}}
    return score(bt.truths, bt.results, notes, meta, horizon, ei)


def run_scorecard(corpus: str | Path, *, rules_dir=None, alertmanager=None, eval_interval: float = 15.0,
                  scrape_interval: float = 15.0, progress=None) -> dict:
    """Backtest the whole corpus in one pass, apply Alertmanager (``alertmanager``: default the rules directory's
    alertmanager.yml), score."""
    from .. import rules as rules_mod
    am_path = Path(alertmanager) if alertmanager else rules_mod.alertmanager_config_path(
        Path(rules_dir) if rules_dir else None)
    cfg = amsim.load_config(am_path)  # a bad file fails before the backtest
    bt = backtest_corpus(corpus, rules_dir=rules_dir, eval_interval=eval_interval, scrape_interval=scrape_interval,
                         progress=progress)
    return judge(bt, cfg, am_path.name)


def _rule_files(rules_dir) -> list[str]:
    from ..backtest.ruleset import load
    return load(rules_dir).files
