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

A run whose latest step was its planned last (``omniwatch_run_finished`` 1) never stalls. The exporter
counts (planned.py); the numbers live here and in config.py; the staging holds without any live
evidence, so a backtest of a finished file judges it the same way.
"""
from __future__ import annotations


from .. import names as n
from . import remedies
from .holder import HOLDER
from .config import Config
from .prose import RUN, P, Query, SeriesValue, Value
from .rule import Alert, Record, sel
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

