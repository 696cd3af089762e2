"""TrainingStalled in three stages, as data: recording rules for the thresholds, the three alerts (one
name; severity info, warning, critical), their prose and their promtool cases.

Planned work never pages. A checkpoint save or a validation pass makes a step arrive late, and the
first of each cannot be announced by the log, so the alert escalates in stages (numbers in
``config.Stall``; ``T`` = the run's typical step, ``omniwatch_typical_step_seconds``):

- **info** after ``notice_steps`` x T without a step: perhaps planned work;
- **warning** after ``notice_steps`` x T + the planned work that may come before the next step
  (``omniwatch_planned_allowance_seconds``: the run's longest recent checkpoint / validation that are
  due, or may be forced because the next step may be the last) + ``unseen_planned_steps`` x T while the
  run has not shown a checkpoint or a validation yet (``omniwatch_planned_unseen_kinds`` > 0);
- **critical** after the warning threshold + ``critical_extra_steps`` x T.

A run whose latest step was its planned last (``omniwatch_run_finished`` 1) never stalls. The exporter
counts (planned.py); the numbers live here and in config.py; the staging holds without any live
evidence, so a backtest of a finished file judges it the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import names as n
from . import remedies
from .holder import HOLDER
from .config import Config
from .prose import RUN, Ctx, P, Query, SeriesValue, Value, key_of
from .rule import Alert, Record, sel
from .testcase import INTERVAL, JOB, Case, Check, Expect, Series, dur
from .records import (REC_AGE, REC_STALL_CRITICAL, REC_STALL_INFO, REC_STALL_PREFIX, REC_STALL_TYPICAL,
                      REC_STALL_WARNING)

from ..names import RUN_BY  # noqa: E402  (one definition: names.py)
REC = REC_STALL_PREFIX
AGE = REC_AGE
SEVERITIES = ("info", "warning", "critical")


def planned(kind: str, prefix: str) -> SeriesValue:
    return SeriesValue(n.PLANNED_WORK, "dur", prefix, fixed=(("kind", kind),))


def records(cfg: Config) -> list:
    s = cfg.stall
    typ = REC_STALL_TYPICAL
    allowance = f"max by ({RUN_BY}) ({sel(cfg, n.PLANNED_ALLOWANCE)})"
    unseen = f"max by ({RUN_BY}) ({sel(cfg, n.PLANNED_UNSEEN)})"
    return [
        Record(REC_STALL_TYPICAL,
               f"max by ({RUN_BY}) ({sel(cfg, n.TYPICAL_STEP)})\n"
               f"  or {s.provisional_factor:g} * max by ({RUN_BY}) ({sel(cfg, n.WARMUP_STEP)})",
               comment="The run's typical step; until it has one (warm-up steps only), a provisional one: the longest\n"
                       "warm-up step x stall.provisional_factor, so a hang in step 2 or 3 pages."),
        Record(REC_STALL_INFO, f"{s.notice_steps:g} * {typ}",
               comment="TrainingStalled's thresholds per run (seconds without a step), in stages: info = notice x the\n"
                       "typical step; warning adds the planned work that may come before the next step (the\n"
                       "exporter's allowance; 0 if it publishes none) and, while the run has not shown a checkpoint\n"
                       "and a validation yet, a reserve of typical steps (assumed when the exporter does not say);\n"
                       "critical adds more typical steps. Thresholds: exporter/omniwatch/alerting/config.py (stall)."),
        Record(REC_STALL_WARNING,
               f"{REC_STALL_INFO}\n"
               f"  + on ({RUN_BY}) ({allowance} or 0 * {typ})\n"
               f"  + on ({RUN_BY}) {s.unseen_planned_steps:g} * {typ}\n"
               f"    * on ({RUN_BY}) (clamp_max({unseen}, 1) or 0 * {typ} + 1)"),
        Record(REC_STALL_CRITICAL, f"{REC_STALL_WARNING}\n  + on ({RUN_BY}) {s.critical_extra_steps:g} * {typ}"),
    ]


def _expr(cfg: Config, severity: str) -> str:
    out = (f"{AGE}\n  > on ({RUN_BY}) {REC}{severity}\n"
           f"unless on ({RUN_BY}) max by ({RUN_BY}) ({sel(cfg, n.RUN_FINISHED)} == 1)")
    if severity != "info":
        # history, not news: a run first seen long after its last line is reported once, at info
        out += f"\nunless on ({RUN_BY}) max by ({RUN_BY}) ({sel(cfg, n.RUN_STALE)} == 1)"
        # live evidence (--checkpoint-root): the next step's checkpoint is being written
        out += (f"\nunless on ({RUN_BY})\n  time() - max by ({RUN_BY}) ({sel(cfg, n.CHECKPOINT_WRITE_TS)})\n"
                f"  < on ({RUN_BY}) {cfg.stall.checkpoint_write_idle_steps:g} * {REC_STALL_TYPICAL}")
    return out


TYP = Query(REC_STALL_TYPICAL, "dur", prefix=" (", suffix=" each)")
PROVISIONAL = f"{n.WARMUP_STEP} unless {n.TYPICAL_STEP}"
NO_CONFIG = (" No trainer configuration was read for this run: omniwatch cannot tell its end from a hang "
             "(total_training_steps unknown) and assumes a first checkpoint or validation may still come "
             "(save_freq / test_freq unknown); give it the config (VeRL-Omni's console log, Hydra's "
             ".hydra/config.yaml or --trainer-config).")


def _provisional(cfg: Config) -> Query:
    return Query(n.WARMUP_STEP, "dur", prefix=f"; provisional: no normal step yet, {cfg.stall.provisional_factor:g} x "
                 "the longest warm-up step of ", post=f" unless {n.TYPICAL_STEP}")


STALE = SeriesValue(n.RUN_STALE, "f0", " This run's last line was already older than the stale horizon when omniwatch "
                    "first saw it: history, reported at info only.", cond="== 1", show=False)
NONE = SeriesValue(n.TRAINER_CONFIG_INFO, "f0", NO_CONFIG, fixed=(("source", "none"),), show=False)
LAST = Query(n.STEP, "f0", prefix="; last step ")
ALLOWANCE = SeriesValue(n.PLANNED_ALLOWANCE, "dur", " (", ")")


def _unseen(text: str) -> SeriesValue:
    return SeriesValue(n.PLANNED_UNSEEN, "f0", text, cond="> 0", show=False)


def descriptions(cfg: Config) -> dict[str, object]:
    s = cfg.stall
    allowed = lambda steps: P(  # noqa: E731
        " allowed for ", f"{steps:g}", " typical steps", TYP, _provisional(cfg), " and the planned work that may come before the next "
        "step", ALLOWANCE, _unseen(f", plus {s.unseen_planned_steps:g} typical steps for a first checkpoint or "
                                   "validation not seen yet"))
    return {
        "info": P(RUN, ": no step for ", Value("dur"), f", more than {s.notice_steps:g} typical steps", TYP,
                  _provisional(cfg), LAST,
                  ". Planned work may explain it", planned("checkpoint", "; checkpoints of this run took up to "),
                  planned("validation", "; its validations up to "),
                  _unseen("; a first checkpoint or validation cannot be announced by the log"), ".",
                  SeriesValue(REC_STALL_WARNING, "dur", " Warning after "),
                  SeriesValue(REC_STALL_CRITICAL, "dur", ", critical after ", " without a step."), STALE, NONE),
        "warning": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_WARNING, "dur", ", more than the "),
                     allowed(s.notice_steps), LAST, ".",
                     SeriesValue(REC_STALL_CRITICAL, "dur", " Critical after ", " without a step."), NONE),
        "critical": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_CRITICAL, "dur", ", more than the "),
                      allowed(s.notice_steps + s.critical_extra_steps), LAST,
                      ". The trainer crashed, hangs (NCCL, Ray actor death, OOM kill) or its log stopped reaching "
                      "omniwatch; the run's GPUs sit idle.", NONE),
    }


SUMMARIES = {
    "info": "Training has not logged a step for longer than usual; planned work may explain it.",
    "warning": "Training has not logged a step for longer than its planned work explains.",
    "critical": "Training stopped producing steps.",
}


def alerts(cfg: Config) -> list:
    desc = {sev: text + HOLDER for sev, text in descriptions(cfg).items()}  # + who holds the step (holder.py)
    out = []
    for sev in SEVERITIES:
        out.append(Alert(
            n.ALERT_STALLED, _expr(cfg, sev), sev, SUMMARIES[sev], desc[sev], cfg.step_for, {},
            remedies.stalled_notice() if sev == "info" else remedies.stalled(), step=True,
            comment=("TrainingStalled in stages (info, warning, critical): the thresholds above; a finished run (its\n"
                     "last step was the planned last) never stalls. Alertmanager inhibits info by warning/critical\n"
                     "and warning by critical of the same run." if sev == "info" else "")))
    return out


def rules(cfg: Config) -> list:
    return records(cfg) + alerts(cfg)


# --- promtool cases ------------------------------------------------------------------------------------------
def thresholds(cfg: Config, typical: float, allowance: float, unseen: int) -> dict[str, float]:
    s = cfg.stall
    info = s.notice_steps * typical
    warning = info + allowance + s.unseen_planned_steps * typical * min(1, unseen)
    return {"info": info, "warning": warning, "critical": warning + s.critical_extra_steps * typical}


@dataclass
class Stall:
    """One run in a promtool case: a step every ``typical`` seconds until the one observed at ``stop``;
    then the next arrives ``gap`` seconds later (None: never) and steps go on every ``typical`` seconds.
    Step numbers count up from 10."""
    experiment: str
    typical: float
    stop: int
    gap: float | None = None
    allowance: float = 0.0
    unseen: int = 2
    checkpoint: float | None = None
    validation: float | None = None
    finished: bool = False
    project: str = "flowgrpo"
    provisional: bool = False  # no typical step yet: ``typical`` is the longest warm-up step
    stale: bool = False        # first seen as history
    no_config: bool = False    # no trainer configuration read (omniwatch_trainer_config_info{source="none"})

    def effective(self, cfg: Config) -> float:
        """The typical step the thresholds count in (provisional: the warm-up step x the factor)."""
        return self.typical * cfg.stall.provisional_factor if self.provisional else self.typical

    def labels(self) -> dict:
        return {**JOB, "project": self.project, "experiment": self.experiment}

    def steps(self, samples: int, interval: int) -> tuple[list[float], list[int]]:
        ts, steps = [], []
        last, step = 0.0, 10

        def after(t: float) -> float | None:
            if t != self.stop:
                return t + self.typical
            return None if self.gap is None else t + self.gap
        for k in range(samples):
            t = k * interval
            nxt = after(last)
            while nxt is not None and nxt <= t:
                last, step = nxt, step + 1
                nxt = after(last)
            ts.append(last)
            steps.append(step)
        return ts, steps

    def series(self, samples: int, interval: int) -> list:
        ts, steps = self.steps(samples, interval)
        lab = self.labels()
        out = [Series(n.LAST_STEP_TS, lab, " ".join(f"{t:g}" for t in ts)),
               Series(n.STEP, lab, " ".join(str(x) for x in steps)),
               Series(n.WARMUP_STEP if self.provisional else n.TYPICAL_STEP, lab, f"{self.typical:g}x{samples - 1}"),
               Series(n.PLANNED_ALLOWANCE, lab, f"{self.allowance:g}x{samples - 1}"),
               Series(n.PLANNED_UNSEEN, lab, f"{self.unseen}x{samples - 1}"),
               Series(n.RUN_FINISHED, lab, f"{int(self.finished)}x{samples - 1}")]
        for kind, v in (("checkpoint", self.checkpoint), ("validation", self.validation)):
            if v is not None:
                out.append(Series(n.PLANNED_WORK, {**lab, "kind": kind}, f"{v:g}x{samples - 1}"))
        if self.stale:
            out.append(Series(n.RUN_STALE, lab, f"1x{samples - 1}"))
        if self.no_config:
            out.append(Series(n.TRAINER_CONFIG_INFO, {**lab, "source": "none", "engine": "unknown", "trainer": "unknown",
                                                      "async_mode": "unknown", "lora": "unknown"}, f"1x{samples - 1}"))
        return out

    def ctx(self, cfg: Config, at: int, interval: int) -> Ctx:
        ts, steps = self.steps(at // interval + 1, interval)
        th = thresholds(cfg, self.effective(cfg), self.allowance, self.unseen)
        series = {REC_STALL_TYPICAL: self.effective(cfg), n.STEP: steps[-1], n.PLANNED_ALLOWANCE: self.allowance,
                  n.PLANNED_UNSEEN: self.unseen, **{REC + k: v for k, v in th.items()}}
        if self.provisional:
            series[PROVISIONAL] = self.typical
        else:
            series[n.TYPICAL_STEP] = self.typical
        if self.stale:
            series[n.RUN_STALE] = 1
        if self.no_config:
            series[key_of(n.TRAINER_CONFIG_INFO, 'source="none"')] = 1
        for kind, v in (("checkpoint", self.checkpoint), ("validation", self.validation)):
            if v is not None:
                series[key_of(n.PLANNED_WORK, f'kind="{kind}"')] = v
        return Ctx({"project": self.project, "experiment": self.experiment}, at - ts[-1], series, None)


def _stage_times(cfg: Config, run: Stall, interval: int, hold: int) -> dict[str, int]:
    """When each stage fires (first evaluation past its threshold, + for:) for a run that never steps again."""
    th = thresholds(cfg, run.effective(cfg), run.allowance, run.unseen)
    return {sev: next(t for t in range(0, 100_000, interval) if t - run.stop > th[sev]) + hold for sev in SEVERITIES}


def cases(cfg: Config) -> list:
    hold = dur(cfg.step_for)
    out = []

    def expect(run: Stall, at: int, sevs) -> list:
        return [Expect({"severity": sev, "project": run.project, "experiment": run.experiment}, run.ctx(cfg, at, INTERVAL))
                for sev in sevs]

    def staged(title: str, run: Stall, comment: str = "") -> Case:
        """Checks just before and at each stage's firing; every stage below stays firing."""
        at = _stage_times(cfg, run, INTERVAL, hold)
        samples = at["critical"] // INTERVAL + 3
        checks = []
        for i, sev in enumerate(SEVERITIES):
            checks.append(Check(at[sev] - INTERVAL, n.ALERT_STALLED, expect(run, at[sev] - INTERVAL, SEVERITIES[:i])))
            checks.append(Check(at[sev], n.ALERT_STALLED, expect(run, at[sev], SEVERITIES[:i + 1])))
        return Case(title, run.series(samples, INTERVAL), checks, comment)

    s = cfg.stall
    th0 = thresholds(cfg, 30, 0, 2)
    out.append(staged(
        f"TrainingStalled stages with nothing planned known: info after {s.notice_steps:g}, warning after "
        f"{th0['warning'] / 30:g}, critical after {th0['critical'] / 30:g} typical steps",
        Stall("qwen_ocr", 30, 90)))
    ck, val = 4.5 * 30, 1.0 * 30
    out.append(staged(
        "TrainingStalled stages add the planned work that may come before the next step (checkpoint and validation "
        "seen: no reserve)", Stall("qwen_ocr_planned", 30, 90, allowance=ck + val, unseen=0, checkpoint=ck,
                                   validation=val)))
    # Planned work stays below warning: a heavy first checkpoint, a long validation the run has shown, a
    # checkpoint due by the seen cadence; the step after it resolves the info notice.
    quiet_runs = [
        Stall("first_checkpoint", 30, 90, gap=30 + 4.5 * 30),                      # 4.5x the step, never seen
        Stall("first_checkpoint_and_validation", 30, 90, gap=30 + 4 * 30 + 0.5 * 30, unseen=2),
        Stall("long_validation", 30, 90, gap=30 + 6 * 30, allowance=6 * 30 + 60, unseen=0, validation=6 * 30,
              checkpoint=60),
        Stall("cadence_checkpoint", 30, 90, gap=30 + 5 * 30, allowance=5 * 30, unseen=0, checkpoint=5 * 30,
              validation=0.5 * 30),
        Stall("finished", 30, 90, finished=True),
    ]
    end = 90 + max(r.gap or 0 for r in quiet_runs)
    samples = (end + 4 * INTERVAL) // INTERVAL + 2
    series = [x for r in quiet_runs for x in r.series(samples, INTERVAL)]
    info_at = {r.experiment: _stage_times(cfg, r, INTERVAL, hold)["info"] for r in quiet_runs}
    checks = []
    for t in range(0, samples * INTERVAL, INTERVAL):
        firing = [r for r in quiet_runs if not r.finished and t >= info_at[r.experiment]
                  and (r.gap is None or t < 90 + r.gap)]
        checks.append(Check(t, n.ALERT_STALLED, [e for r in firing for e in expect(r, t, ("info",))]))
    out.append(Case("TrainingStalled stays at info for a heavy first checkpoint, a first checkpoint with a validation, "
                    "a long validation and a checkpoint due by the cadence; never for a finished run", series, checks,
                    "Every evaluation is checked: no warning or critical at any time; info only while the planned "
                    "step is running."))
    # --checkpoint-root: warning and critical wait while the next checkpoint keeps being written.
    run = Stall("checkpoint_writing", 30, 90)
    idle = cfg.stall.checkpoint_write_idle_steps * run.typical
    th = thresholds(cfg, run.typical, run.allowance, run.unseen)
    first, last_write = 105, int(th["critical"]) + 90 + 4 * INTERVAL  # writes past the critical threshold
    resume = next(t for t in range(last_write, 100_000, INTERVAL) if t - last_write >= idle)
    samples = (resume + hold) // INTERVAL + 3
    writes = (f"_x{first // INTERVAL} {first}+{INTERVAL}x{(last_write - first) // INTERVAL} "
              f"{last_write}x{samples - last_write // INTERVAL - 2}")
    mid = (last_write // INTERVAL - 2) * INTERVAL
    out.append(Case(
        f"TrainingStalled waits at info while the next step's checkpoint directory is written (--checkpoint-root), "
        f"and escalates once it was not written for {cfg.stall.checkpoint_write_idle_steps:g} typical steps",
        run.series(samples, INTERVAL) + [Series(n.CHECKPOINT_WRITE_TS, run.labels(), writes)],
        [Check(mid, n.ALERT_STALLED, expect(run, mid, ("info",))),
         Check(resume, n.ALERT_STALLED, expect(run, resume, ("info",))),
         Check(resume + hold, n.ALERT_STALLED, expect(run, resume + hold, SEVERITIES))]))
    # The numbers: a 50-minute hang on a 4-minute step must page (critical) while it lasts.
    for title, run in (
            ("nothing planned known", Stall("hang_unknown", 240, 720)),
            ("a 4.5x checkpoint and a 1x validation known", Stall("hang_planned", 240, 720, allowance=5.5 * 240,
                                                                 unseen=0, checkpoint=4.5 * 240, validation=240))):
        crit = _stage_times(cfg, run, INTERVAL, hold)["critical"]
        assert crit - run.stop <= 50 * 60, f"{title}: critical only after {(crit - run.stop) / 60:g} min"
        samples = crit // INTERVAL + 2
        out.append(Case(f"TrainingStalled pages within a 50-minute hang on a 4-minute step ({title}): critical "
                        f"{(crit - run.stop) / 60:g} min after the last step", run.series(samples, INTERVAL),
                        [Check(crit - INTERVAL, n.ALERT_STALLED, expect(run, crit - INTERVAL, ("info", "warning"))),
                         Check(crit, n.ALERT_STALLED, expect(run, crit, SEVERITIES))]))
    # Hangs from step 1: no typical step yet (warm-up steps only), a provisional one from the warm-up step.
    f = cfg.stall.provisional_factor
    out.append(staged(
        f"TrainingStalled pages a hang in step 2 (one 5-minute warm-up step, no typical step yet): stages in "
        f"provisional typical steps of {f:g} x the warm-up step; the annotation says so and that no trainer "
        "configuration was read", Stall("hang_in_step2", 300, 0, provisional=True, no_config=True)))
    # History is not news: a run first seen long after its last line fires info once, never more.
    run = Stall("stale_history", 30, 90, stale=True)
    at = _stage_times(cfg, run, INTERVAL, hold)
    late = at["critical"] + 20 * INTERVAL
    out.append(Case("TrainingStalled reports a run first seen as history (omniwatch_run_stale 1) at info only: "
                    "never warning or critical", run.series(late // INTERVAL + 2, INTERVAL),
                    [Check(at["info"] - INTERVAL, n.ALERT_STALLED, []),
                     Check(at["info"], n.ALERT_STALLED, expect(run, at["info"], ("info",))),
                     Check(at["critical"], n.ALERT_STALLED, expect(run, at["critical"], ("info",))),
                     Check(late, n.ALERT_STALLED, expect(run, late, ("info",)))]))
    return out
