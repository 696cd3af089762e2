"""Facts of finished runs: each run replayed through the exporter's own RunStore at its reconstructed
arrivals (as ``omniwatch backfill`` does) while the backtest engine scrapes that store and evaluates
the real rule files — all runs in one temporary Prometheus (:func:`~omniwatch.backtest.backtest.backtest_many`).

After every ingested line the store's state is read: the ledger (``run.gpu_seconds``, what
``omniwatch_gpu_seconds_total`` exposes), the step record and the window statistics. So the report's
numbers are the live exporter's numbers for the same lines, by construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import trainer_config
from ..core import ledger
from ..config import DEFAULT, Config
from ..backtest.backtest import backtest_many
from ..backtest.runfile import RecordedRun, load_run
from ..core.model import MAX_LABEL_CHARS, RunStore
from ..runlabel import fit_label
from .facts import AlertSpan, RunFacts, StepPoint


class _Collector:
    """``observe`` hook: one StepPoint per applied line, per run."""

    def __init__(self, n: int):
        self.points: list[list[StepPoint]] = [[] for _ in range(n)]
        self.prev: list[dict[str, float]] = [{} for _ in range(n)]
        self.runs: list = [None] * n  # RunSummary after the last step

    def state(self, ri: int):
        """What a forked render worker saw of run ``ri`` (picklable)."""
        return self.points[ri], self.runs[ri]

    def restore(self, ri: int, st) -> None:
        self.points[ri], self.runs[ri] = st

    def __call__(self, ri: int, i: int, store: RunStore, rec) -> None:
        if rec is None:  # a duplicate line: nothing applied, nothing counted
            return
        key = next(iter(store.runs))
        run = store.runs[key]
        now = dict(run.gpu_seconds)
        prev = self.prev[ri]
        delta = {b: v - prev.get(b, 0.0) for b, v in now.items() if v - prev.get(b, 0.0) > 0}
        self.prev[ri] = now
        n = run.gpus.count if run.gpus else 1
        st = run.stats
        self.points[ri].append(StepPoint(
            index=i, step=rec.step, duration=rec.duration, flags=sorted(rec.flags), gpu_seconds=delta,
            wall={b: v / n for b, v in delta.items()}, reward_bound=rec.reward_bound_ratio,
            reward_share=rec.reward_step_share, idle=rec.idle_ratio, mfu=dict(rec.mfu),
            mfu_baseline=dict(st.mfu_baseline), duration_baseline=st.duration_baseline,
            regression=dict(st.regression), causes=dict(rec.causes), cause_reference=dict(st.cause_reference),
            reward_bound_min=st.reward_bound["min"] if st.reward_bound else None,
            idle_min=st.idle["min"] if st.idle else None,
            mfu_max={r: s["max"] for r, s in st.mfu.items()},
            images=rec.values.get(ledger.K_IMAGES), throughput=rec.throughput,
            per_day=run.cost_per_day()[0]))
        typ = run.window.typical_step()
        if typ is None and run.warm:
            durs = [r.duration for r in run.warm if r.duration]
            typ = store.provisional_factor * max(durs) if durs else None
        last = run.last.step if run.last else None
        self.runs[ri] = RunSummary(now, run.gpus, dict(run.modes), run.config, run.planned.finished(last), typ,
                                   run.planned.allowance(last), run.last_arrival, store.stall_tolerance_steps)


@dataclass
class RunSummary:
    """The run's state after its last line: the ledger, its GPUs, its detected layout."""
    gpu_seconds: dict[str, float]
    gpus: object
    modes: dict[str, str]
    config: object = None  # trainer_config.TrainerConfig
    finished: bool = False           # its last step was its planned last (cadence, the config's total)
    typical: float | None = None     # the typical step (provisional before the first normal one)
    allowance: float = 0.0           # the planned work that may come before the next step
    last_arrival: float | None = None
    tolerance_steps: float = 2.0


def end_of(run: "RunSummary | None", gpus: int, until: float | None) -> tuple[str, float, dict[str, float]]:
    """How a replayed run ended and the stall still open at ``until`` (the report's end; None: the file's own
    end, i.e. nothing open): (end_state, open stall wall seconds, the ledger with the open stall in ``stalled``)."""
    if run is None:
        return "", 0.0, {}
    ledger_s = dict(run.gpu_seconds)
    if run.finished:
        return "finished", 0.0, ledger_s
    open_s = 0.0
    if until is not None and run.last_arrival is not None:
        open_s = ledger.open_stall(until - run.last_arrival, run.typical, run.tolerance_steps, run.allowance)
        if open_s > 0:
            ledger_s[ledger.STALLED] = ledger_s.get(ledger.STALLED, 0.0) + open_s * gpus
    return "unfinished", open_s, ledger_s


def unique_labels(runs: list[RecordedRun]) -> None:
    """Every run gets its own (project, experiment) label, of at most 128 characters (the live exporter's
    :func:`~omniwatch.runlabel.fit_label`): runs under one root that map to the same labels (``q/p/e`` and
    ``p/e``, two long names) get ``experiment~2``, ``~3``... — a suffix no other run's label has (a run
    named ``e~2`` keeps its name). How a run's label was made is its ``label_note``."""
    for r in runs:
        r.project, r.experiment = fit_label(r.project), fit_label(r.experiment)
    taken = {(r.project, r.experiment) for r in runs}
    seen: set[tuple[str, str]] = set()
    for r in runs:
        k = (r.project, r.experiment)
        if k not in seen:
            seen.add(k)
            continue
        n = 2
        while True:
            tail = f"~{n}"
            new = (r.project, r.experiment[:MAX_LABEL_CHARS - len(tail)] + tail)
            if new not in taken:
                break
            n += 1
        taken.add(new)
        seen.add(new)
        note = f"experiment label {new[1]!r}: {r.experiment!r} is the label of another run under the root"
        r.label_note = "; ".join(x for x in (r.label_note, note) if x)
        r.experiment = new[1]


def facts_of_runs(runs: list[RecordedRun], *, gpus: int | None = None, rules_dir=None, progress=None,
                  starts: list[float | None] | None = None, eval_interval: float = 15.0,
                  scrape_interval: float = 15.0, alerts: bool = True, workers: int | None = None,
                  annotations: bool = True, alert_config: Config = DEFAULT,
                  until: float | None = None) -> list[RunFacts]:
    """Replay and backtest every run (one Prometheus pass); one RunFacts per run, in order. ``gpus``
    is ``--gpus``: used where a run's keys cannot tell (as the live exporter's flag). ``annotations``:
    render each alert's annotations as Prometheus would have (``--json``'s alerts, as ``backtest --json``).
    ``alert_config``: the config the rules were made with (the ledger's stall tolerance). ``until``: the report's
    end (``report --until``, ``now`` for a run still hung): an unfinished run's open stall up to then is priced in
    its ``stalled`` bucket; without it a file's run ends at its last line."""
    unique_labels(runs)
    col = _Collector(len(runs))
    # Unknown GPUs: the ledger still runs with 1 GPU so wall time is split; reported as "unknown".
    results = backtest_many(runs, rules_dir=rules_dir, progress=progress, observe=col, starts=starts,
                            store_kwargs={"gpus": gpus or 1, "gpus_override": bool(gpus), "alert_config": alert_config},
                            eval_interval=eval_interval,
                            scrape_interval=scrape_interval, evaluate=alerts, workers=workers,
                            annotations=annotations)
    out = []
    for ri, (r, res) in enumerate(zip(runs, results)):
        run = col.runs[ri]
        g = run.gpus if run is not None else None
        if g is None or (g.source == "flag" and not gpus):
            count, source = None, "unknown"
        else:
            count, source = g.count, g.source
        end_state, open_s, ledger_s = end_of(run, count or 1, until)
        out.append(RunFacts(
            run=r.path, project=r.project, experiment=r.experiment, source=r.kind, steps=col.points[ri],
            gpu_seconds=ledger_s, gpus=count, gpus_source=source, end_state=end_state, open_stall_s=open_s,
            stall_end=until if open_s > 0 else None, last_step_at=run.last_arrival if run is not None else None,
            modes=dict(run.modes) if run is not None else {},
            alerts=[AlertSpan(a.alertname, a.severity, a.first_step, a.last_step, a.labels, a.first_index,
                              a.last_index, dict(a.annotations)) for a in res.alerts],
            not_evaluated=dict(res.not_evaluated), skipped=dict(r.skipped), label_note=r.label_note,
            lines=len(r.entries) + sum(r.skipped.values()),
            trainer_config=trainer_config.describe(run.config if run is not None else None),
            assumed=trainer_config.assumptions(run.config if run is not None else None),
            pools=run.config.pools() if run is not None and run.config is not None and run.config.gpus else {},
            pools_source="config" if run is not None and run.config is not None and run.config.gpus else ""))
    return out


def load_runs(paths: list[str | Path], kind: str | None = None, project: str | None = None,
              experiment: str | None = None) -> list[RecordedRun]:
    return [load_run(str(p), kind=kind, project=project, experiment=experiment) for p in paths]
