"""TrainingStalled in three stages, as data: recording rules for the thresholds, the three alerts (one
name; severity info, warning, critical), their prose (their promtool cases: alerts/tests/health.test.yml).

Planned work never pages. A checkpoint save or a validation pass makes a step arrive late, and the
first of each cannot be announced by the log, so the alert escalates in stages (numbers in
``config.Stall``; ``T`` = the run's typical step, ``omniwatch_typical_step_seconds``):

- **info** after ``notice_steps`` x T without a step: perhaps planned work;
- **warning** after ``notice_steps`` x T + the planned work that may come before the next step
  (``omniwatch_planned_allowance_seconds``: the run's longest recent checkpoint / validation that are
  due, or may be forced because the next step may be the last) + ``unseen_planned_steps`` x T while the
  run has not shown a checkpoint or a validation yet (``omniwatch_planned_unseen_kinds`` > 0);
- **critical** after the warning threshold + ``critical_extra_steps`` x T.

**Early hangs** (no normal step yet, so no typical step): counted in ``W``, the run's longest warm-up step
(``omniwatch_warmup_step_seconds``), from the end of the last warm-up step: info after
``provisional_factor`` x W, warning after ``early_warning_warmups`` x W and critical after
``early_critical_warmups`` x W, each plus the planned work the log has shown and, only where the trainer's
config says a first checkpoint or validation may come before the next step
(``omniwatch_planned_unseen_configured_kinds``), ``early_unseen_planned_warmups`` x W (issue 30 item 5).

A run whose latest step was its planned last (``omniwatch_run_finished`` 1) never stalls. The exporter
counts (core/planned.py); the numbers live here and in config.py; the staging holds without any live
evidence, so a backtest of a finished file judges it the same way.
"""
from __future__ import annotations


from .. import names as n
from . import remedies
from .holder import HOLDER
from ..config import Config
from .prose import RUN, IfSeries, P, Query, QueryLabel, SeriesValue, Value
from .rule import AlertSpec, Record, sel
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
    t = f"max by ({RUN_BY}) ({sel(cfg, n.TYPICAL_STEP)})"
    w = f"max by ({RUN_BY}) ({sel(cfg, n.WARMUP_STEP)})"
    allowance = f"max by ({RUN_BY}) ({sel(cfg, n.PLANNED_ALLOWANCE)})"
    unseen = f"max by ({RUN_BY}) ({sel(cfg, n.PLANNED_UNSEEN)})"
    unseen_cfg = f"max by ({RUN_BY}) ({sel(cfg, n.PLANNED_UNSEEN_CONFIGURED)})"
    return [
        Record(REC_STALL_TYPICAL,
               f"{t}\n  or {s.provisional_factor:g} * {w}",
               comment="The run's typical step; until it has one (warm-up steps only), a provisional one: the longest\n"
                       "warm-up step x stall.provisional_factor."),
        Record(REC_STALL_INFO, f"{s.notice_steps:g} * {t}\n  or {s.provisional_factor:g} * {w}",
               comment="TrainingStalled's thresholds per run (seconds without a step), in stages: info = notice x the\n"
                       "typical step; warning adds the planned work that may come before the next step (the\n"
                       "exporter's allowance; 0 if it publishes none) and, while the run has not shown a checkpoint\n"
                       "and a validation yet, a reserve of typical steps (assumed when the exporter does not say);\n"
                       "critical adds more typical steps. Early hangs (no normal step yet, so no typical step):\n"
                       "counted in the longest warm-up step W since it ended: info after one provisional step,\n"
                       "warning at early_warning x W and critical at early_critical x W (each less the delivery\n"
                       "allowance: min(W / 4, early_delivery_seconds)), plus the planned work, plus\n"
                       "a reserve of W only where the trainer's config says a first checkpoint or validation may\n"
                       "come. Thresholds: exporter/omniwatch/config.py (stall)."),
        Record(REC_STALL_WARNING,
               f"{s.notice_steps:g} * {t}\n"
               f"  + on ({RUN_BY}) ({allowance} or 0 * {t})\n"
               f"  + on ({RUN_BY}) {s.unseen_planned_steps:g} * {t}\n"
               f"    * on ({RUN_BY}) (clamp_max({unseen}, 1) or 0 * {t} + 1)\n"
               f"or\n"
               f"{s.early_warning_warmups:g} * {w} - clamp_max(0.25 * {w}, {s.early_delivery_seconds:g})\n"
               f"  + on ({RUN_BY}) ({allowance} or 0 * {w})\n"
               f"  + on ({RUN_BY}) {s.early_unseen_planned_warmups:g} * {w}\n"
               f"    * on ({RUN_BY}) (clamp_max({unseen_cfg}, 1) or 0 * {w})"),
        Record(REC_STALL_CRITICAL,
               f"{REC_STALL_WARNING}\n  + on ({RUN_BY}) ({s.critical_extra_steps:g} * {t}"
               f" or {s.early_critical_warmups - s.early_warning_warmups:g} * {w})"),
    ]


def _expr(cfg: Config, severity: str) -> str:
    out = (f"{AGE}\n  > on ({RUN_BY}) {REC}{severity}\n"
           f"unless on ({RUN_BY}) max by ({RUN_BY}) ({sel(cfg, n.RUN_FINISHED)} == 1)\n"
           # a crash its Ray job reported pages as TrainingCrashed, not as a stall
           f"unless on ({RUN_BY}) max by ({RUN_BY}) ({sel(cfg, n.RUN_CRASHED)} == 1)")
    if severity != "info":
        # history, not news: a run first seen long after its last line is reported once, at info
        out += f"\nunless on ({RUN_BY}) max by ({RUN_BY}) ({sel(cfg, n.RUN_STALE)} == 1)"
        # live evidence (--checkpoint-root): the next step's checkpoint is being written
        out += (f"\nunless on ({RUN_BY})\n  time() - max by ({RUN_BY}) ({sel(cfg, n.CHECKPOINT_WRITE_TS)})\n"
                f"  < on ({RUN_BY}) {cfg.stall.checkpoint_write_idle_steps:g} * {REC_STALL_TYPICAL}")
    return out


TYP = Query(REC_STALL_TYPICAL, "dur", prefix=" (", suffix=" each)")
WARM = Query(n.WARMUP_STEP, "dur", prefix=" (", suffix=")")
NO_CONFIG = (" No trainer configuration was read for this run: omniwatch cannot tell its end from a hang "
             "(total_training_steps unknown) and assumes a first checkpoint or validation may still come "
             "(save_freq / test_freq unknown); give it the config (VeRL-Omni's console log, Hydra's "
             ".hydra/config.yaml or --trainer-config).")
NO_CONFIG_EARLY = (" No trainer configuration was read for this run: no first checkpoint or validation is "
                   "assumed before the next step (save_freq / test_freq unknown) and its end cannot be told from a "
                   "hang (total_training_steps unknown); give it the config (VeRL-Omni's console log, Hydra's "
                   ".hydra/config.yaml or --trainer-config).")


STALE = SeriesValue(n.RUN_STALE, "f0", " This run's last line was already older than a few of its typical steps and "
                    "its planned work when omniwatch first saw it: history, reported at info only.", cond="== 1",
                    show=False)
NONE = SeriesValue(n.TRAINER_CONFIG_INFO, "f0", NO_CONFIG, fixed=(("source", "none"),), show=False)
NONE_EARLY = SeriesValue(n.TRAINER_CONFIG_INFO, "f0", NO_CONFIG_EARLY, fixed=(("source", "none"),), show=False)
LAST = Query(n.STEP, "f0", prefix="; last step ")
ALLOWANCE = SeriesValue(n.PLANNED_ALLOWANCE, "dur", " (", ")")
EARLY = " and no normal step yet"


# The remedy past warning starts where the step is held (issue 31 item 3): the holder and the frames the held call is
# stuck in, from the Ray task-event source; without it, nothing (the rest of the remedy stands alone).
HOLDER_REMEDY = P(QueryLabel(n.STEP_HOLDER_INFO, n.L_HOLDER, prefix="Start where the step is held: "),
                  QueryLabel(n.RAY_STACK_INFO, n.L_STACK, prefix=", stuck in ", matchers=f"{n.L_STACK_OF}=`holder`"),
                  IfSeries(n.STEP_HOLDER_INFO, P(" (`omniwatch ps`; the whole stack at the exporter's /stacks). "), P()))


def _unseen(text: str) -> SeriesValue:
    return SeriesValue(n.PLANNED_UNSEEN, "f0", text, cond="> 0", show=False)


def _unseen_configured(text: str) -> SeriesValue:
    return SeriesValue(n.PLANNED_UNSEEN_CONFIGURED, "f0", text, cond="> 0", show=False)


def descriptions(cfg: Config) -> dict[str, object]:
    """Each stage's description: the normal staging while the run has a typical step, the early one (counted in
    its longest warm-up step) before."""
    s = cfg.stall
    allowed = lambda steps: P(  # noqa: E731
        " allowed for ", f"{steps:g}", " typical steps", TYP, " and the planned work that may come before the next "
        "step", ALLOWANCE, _unseen(f", plus {s.unseen_planned_steps:g} typical steps for a first checkpoint or "
                                   "validation not seen yet"))
    early_allowed = lambda warmups: P(  # noqa: E731
        " allowed with no normal step yet: ", f"{warmups:g}", " x its longest warm-up step", WARM,
        f", less up to {s.early_delivery_seconds:g} s for the message to arrive,",
        " and the planned work that may come before the next step", ALLOWANCE,
        _unseen_configured(f", plus {s.early_unseen_planned_warmups:g} warm-up steps for a first checkpoint or "
                           "validation the trainer's config says may come"))
    thresholds = P(SeriesValue(REC_STALL_WARNING, "dur", " Warning after "),
                   SeriesValue(REC_STALL_CRITICAL, "dur", ", critical after ", " without a step."))
    normal = {
        "info": P(RUN, ": no step for ", Value("dur"), f", more than {s.notice_steps:g} typical steps", TYP, LAST,
                  ". Planned work may explain it", planned("checkpoint", "; checkpoints of this run took up to "),
                  planned("validation", "; its validations up to "),
                  _unseen("; a first checkpoint or validation cannot be announced by the log"), ".",
                  thresholds, STALE, NONE),
        "warning": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_WARNING, "dur", ", more than the "),
                     allowed(s.notice_steps), LAST, ".",
                     SeriesValue(REC_STALL_CRITICAL, "dur", " Critical after ", " without a step."), NONE),
        "critical": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_CRITICAL, "dur", ", more than the "),
                      allowed(s.notice_steps + s.critical_extra_steps), LAST,
                      ". The trainer crashed, hangs (NCCL, Ray actor death, OOM kill) or its log stopped reaching "
                      "omniwatch; the run's GPUs sit idle.", NONE),
    }
    early = {
        "info": P(RUN, ": no step for ", Value("dur"), EARLY, f", more than {s.provisional_factor:g} x its longest "
                  "warm-up step", WARM, LAST, ". The next step may just be slower than the warm-up",
                  planned("checkpoint", "; checkpoints of this run took up to "),
                  planned("validation", "; its validations up to "),
                  _unseen_configured("; the trainer's config says a first checkpoint or validation may come"), ".",
                  thresholds, STALE, NONE_EARLY),
        "warning": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_WARNING, "dur", ", more than the "),
                     early_allowed(s.early_warning_warmups), LAST, ". The first update and the first weight sync are "
                     "where OOMs and NCCL hangs happen.",
                     SeriesValue(REC_STALL_CRITICAL, "dur", " Critical after ", " without a step."), NONE_EARLY),
        "critical": P(RUN, ": no step for ", Value("dur"), SeriesValue(REC_STALL_CRITICAL, "dur", ", more than the "),
                      early_allowed(s.early_critical_warmups), LAST,
                      ". The trainer crashed or hangs before its first normal step (OOM, NCCL init, the first weight "
                      "sync) or its log stopped reaching omniwatch; the run's GPUs sit idle.", NONE_EARLY),
    }
    return {sev: P(IfSeries(n.TYPICAL_STEP, normal[sev], early[sev])) for sev in SEVERITIES}


SUMMARIES = {
    "info": "Training has not logged a step for longer than usual; planned work may explain it.",
    "warning": "Training has not logged a step for longer than its planned work explains.",
    "critical": "Training stopped producing steps.",
}


def alerts(cfg: Config) -> list:
    desc = {sev: text + HOLDER for sev, text in descriptions(cfg).items()}  # + who holds the step (holder.py)
    out = []
    for sev in SEVERITIES:
        out.append(AlertSpec(
            n.ALERT_STALLED, _expr(cfg, sev), sev, SUMMARIES[sev], desc[sev], cfg.step_for, {},
            remedies.stalled_notice() if sev == "info" else remedies.stalled(), step=True,
            comment=("TrainingStalled in stages (info, warning, critical): the thresholds above; a finished run (its\n"
                     "last step was the planned last) never stalls. Alertmanager inhibits info by warning/critical\n"
                     "and warning by critical of the same run." if sev == "info" else "")))
    return out


CRASH_JOB = QueryLabel(n.RAY_JOB_INFO, n.L_JOB, prefix=" (Ray job ", suffix=")")
CRASH_ERROR = QueryLabel(n.RAY_JOB_INFO, n.L_ERROR, prefix=": ")


def crashed(cfg: Config) -> AlertSpec:
    """TrainingCrashed: the run's Ray job failed (discovery/jobs.py). Pages at once (no for:): a failed job is a
    fact Ray recorded, not a reading that jitters; TrainingStalled stays quiet for the run meanwhile."""
    return AlertSpec(
        n.ALERT_CRASHED, f"max by ({RUN_BY}) ({sel(cfg, n.RUN_CRASHED)}) == 1", "critical",
        "Training crashed: its Ray job failed.",
        P(RUN, ": the trainer's Ray job failed", CRASH_JOB, LAST, CRASH_ERROR,
          ". Not a hang: the job ended, and the GPUs it reserved are free or idle until it is resumed."),
        None, {}, remedies.crashed(), step=True,
        comment="TrainingCrashed: the run's Ray job FAILED (a submitted job's status, or a driver job whose\n"
                "TaskRunner.run failed): Ray's error in the description.")


def rules(cfg: Config) -> list:
    return records(cfg) + alerts(cfg) + [crashed(cfg)]

