"""The endpoint rules (``alerts/endpoints.rules.yml``) as data: what omniwatch reads from the servers it
discovers (``GET /api/v1/sd``) rather than from the trainer's log.

- ``omniwatch-endpoints-rollout``: vLLM-Omni rollout and vLLM reward server queues per replica, and
  **RolloutQueueSaturated**: requests wait with every slot running for most of ``rollout_queue.window``
  *while the training step waits on that server* (issue 13 item 10). Legacy (and V1 sync) submit the whole
  batch, ``train_batch_size x rollout.n`` requests, at once, so a queue at ``max_num_seqs`` is normal during
  gen; a ``separate_async`` standalone rollout is busy by design and holds the step only when the trainer
  waits for samples (docs/verl-source.md C8). So the alert also needs the phase the server serves (gen for
  rollout servers; gen + reward for reward servers) to take more than ``rollout_queue.critical_path_share``
  of every step over the window.
- ``omniwatch-endpoints-reward``: reward server latency and queueing (dashboard records).
- ``omniwatch-endpoints-transferqueue``: live samples in TransferQueue storage, **TransferQueueBacklog**
  (warning; critical while the run stopped stepping) and **TransferQueueSlowLeak**; numbers calibrated on a
  real TransferQueue 0.1.11 (docs/alerts.md).

Every threshold, window and ``for:`` comes from ``config.rollout_queue`` / ``reward_server`` /
``transferqueue``; prose is :class:`~.prose.Prose` (annotation template and test oracle); remedies come from
:mod:`.remedies`. Record names keep their default windows (``avg10m``, ``deriv2m``, ``floor30m``, ...): the
dashboards read them by name, so a tuned window keeps the name.

The promtool cases (``alerts/tests/endpoints.test.yml`` at 1m, ``transferqueue.test.yml`` at 15 s) place
inputs at the configured thresholds and find when each alert fires with small models of the rules (0/1
averages, minima and maxima over ranges: Prometheus 2.x ranges include both ends). Values that are PromQL
arithmetic over the inputs (a regression's slope and time to full, a rate) are data of the scenario,
measured with promtool, as the hand-written tests had them.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from .. import names as n
from .. import external as x
from . import remedies
from .config import Config
from .prose import AT_STEP, RUN, Ctx, Label, LabelSwitch, P, Query, Value, span
from .rule import Alert, Group, Record, RuleFile, pct, sel
from .testcase import Case, Check, Expect, ExprCheck, Sample, Series, dur, run_labels, secs
from .records import (REC_CEILING, REC_QUEUE_PER_SLOT, REC_REWARD_LATENCY, REC_REWARD_QUEUE_RATIO,
                      REC_REWARD_QUEUE_SECONDS, REC_REWARD_QUEUE_SHARE, REC_ROLLOUT_RUNNING, REC_ROLLOUT_SATURATED,
                      REC_ROLLOUT_SATURATED_GEN, REC_SERVER_SHARE_AVG,
                      REC_ROLLOUT_SLOTS_USED, REC_ROLLOUT_WAITING, REC_SATURATED, REC_SERVER_SHARE,
                      REC_SERVER_SHARE_MIN, REC_TQ_ACTIVE, REC_TQ_BACKLOG, REC_TQ_CAPACITY, REC_TQ_CLEARS,
                      REC_TQ_DERIV, REC_TQ_FLOOR_LONG, REC_TQ_FLOOR_MID, REC_TQ_FLOOR_SHORT, REC_TQ_PARTITION,
                      REC_TQ_SECONDS_TO_FULL, REC_TQ_UNIT_DERIV, REC_TQ_UNIT_TTF, REC_TQ_UTILIZATION, REC_TQ_WRITES)

from ..names import RUN_BY  # noqa: E402  (one definition: names.py)
REPLICA_BY = "project, experiment, role, replica"
ROLE_BY = "project, experiment, role"
UNIT_BY = "project, experiment, storage_unit_id"

# Record names: alerting/records.py (the dashboards and the tests read them from there).
ROLLOUT_FAMILIES = ((x.OMNI_RUNNING, x.OMNI_WAITING), (x.OMNI_V0_RUNNING, x.OMNI_V0_WAITING),
                    (x.VLLM_RUNNING, x.VLLM_WAITING))
# The phases each server role serves on the step's critical path: a rollout server gen; a reward server the
# generation window, gen (a reward pool or function scores while samples generate) + reward (a colocated reward
# model scores inside timing_s/reward).
ROLE_PHASES = {x.ROLE_ROLLOUT: ("gen",), x.ROLE_REWARD: ("gen", "reward")}


def wrap(text: str, width: int = 96) -> str:
    """A rule comment (the renderer prefixes each line with ``# ``), wrapped to stay under 104 columns."""
    return textwrap.fill(text, width, break_on_hyphens=False)


# --- omniwatch-endpoints-rollout ---------------------------------------------------------------------------------
def _first_family(i: int) -> str:
    return "\nor ".join(f"sum by ({REPLICA_BY}) ({fam[i]})" for fam in ROLLOUT_FAMILIES)


def _server_share(cfg: Config, phases: tuple[str, ...]) -> str:
    step = f"max by ({RUN_BY}) ({sel(cfg, n.STEP_DURATION)} > 0)"
    if len(phases) == 1:
        matcher = f'{n.L_PHASE}="{phases[0]}"'
        num = f"max by ({RUN_BY}) ({sel(cfg, n.STAGE_DURATION, matcher)})"
    else:
        matcher = f'{n.L_PHASE}=~"{"|".join(phases)}"'
        num = f"sum by ({RUN_BY}) (max by ({RUN_BY}, {n.L_PHASE}) ({sel(cfg, n.STAGE_DURATION, matcher)}))"
    return f"{num}\n  / on ({RUN_BY})\n{step}"


def rollout_saturated_description(cfg: Config):
    q = cfg.rollout_queue
    phase = LabelSwitch("role", ((x.ROLE_REWARD, P("the generation window (gen + reward)")),), P("gen"))
    slots = LabelSwitch(
        "engine", ((SERIAL, P(" is a serial engine: it ran exactly one request at a time (max_num_seqs 1, or a peak "
                              "of one running request over the last ", span(q.ceiling_window), ") with others waiting "
                              "in ")),),
        P(" had requests waiting with every slot running (max_num_seqs, or its own peak of running requests over the "
          "last ", span(q.ceiling_window), " when omniwatch does not know max_num_seqs) in "))
    return P(RUN, ": the ", Label("role"), " server replica ", Label("replica"), slots, Value("pct"),
             " of the time the step spent in ", phase, " over the last ", span(q.window),
             f" (threshold {pct(q.saturated_share)}; measured over generation time, not wall time, as a colocated "
             "engine sleeps outside it), and ", phase, " took at least ",
             Query(REC_SERVER_SHARE_MIN, "pct", default=f"more than {pct(q.critical_path_share)}",
                   matchers="role=%q", label_args=("role",)),
             f" of every step in that time (threshold {pct(q.critical_path_share)}): the training step waits on "
             "this server", AT_STEP, ". Compare with the other replicas for imbalance.")


SERIAL = "serial"  # the `engine` label of RolloutQueueSaturated on a replica that runs one request at a time


def rollout_group(cfg: Config) -> Group:
    q = cfg.rollout_queue
    # Saturated over the time the server's phase runs (labelled engine="serial" where the ceiling is one running
    # request), now saturated or asleep (a colocated engine between two gens), while the phase holds the step.
    cond = (f"(\n  label_replace({REC_ROLLOUT_SATURATED_GEN}, \"engine\", \"{SERIAL}\", \"\", \"\")\n"
            f"  and on ({REPLICA_BY}) {REC_CEILING} == 1\n"
            f"  or on ({REPLICA_BY}) {REC_ROLLOUT_SATURATED_GEN}\n) >= {q.saturated_share:g}\n"
            f"and on ({REPLICA_BY}) (\n  {REC_SATURATED} == 1\n"
            f"  or ({REC_ROLLOUT_RUNNING} == 0 and on ({REPLICA_BY}) {REC_ROLLOUT_WAITING} == 0)\n)\n"
            f"and on ({ROLE_BY}) {REC_SERVER_SHARE_MIN} > {q.critical_path_share:g}")
    alert_comment = wrap(
        f"A generation burst saturates the queue for part of every step. Saturated in >= {pct(q.saturated_share)} "
        f"of the time the server's phase ran over the last {q.window} (the saturated share of wall time over the "
        f"phase's share of it: a colocated engine sleeps between gens, so a wall-time share would forgive a "
        f"server that queues during all of gen), saturated now or asleep, while the phase takes more than "
        f"{pct(q.critical_path_share)} of every step (rollout_queue.critical_path_share), is a server the step "
        "waits on: not a burst, and not a separate_async standalone rollout that is busy by design. A replica "
        "whose ceiling is one running request is a serial engine (label engine=\"serial\"): VeRL-Omni clamps "
        "max_num_seqs to 1 without step_execution for pipelines without request-level batching.")
    rules = [
        Record(REC_ROLLOUT_RUNNING, _first_family(0) + "\n",
               comment="Running and waiting requests per replica, from whichever family the server exports (the first\n"
                       "present wins: a vLLM-Omni server also exports upstream vllm: per stage, which must not add up)."),
        Record(REC_ROLLOUT_WAITING, _first_family(1) + "\n"),
        Record(REC_CEILING,
               f"max by ({REPLICA_BY}) ({sel(cfg, n.ROLLOUT_MAX_NUM_SEQS)} > 0)\n"
               f"or max_over_time({REC_ROLLOUT_RUNNING}[{q.ceiling_window}])\n",
               comment=wrap(f"max_num_seqs when omniwatch knows it (--max-num-seqs, discovery), else the replica's "
                            f"own {q.ceiling_window} peak of running (rollout_queue.ceiling_window).")),
        Record(REC_ROLLOUT_SLOTS_USED, f"{REC_ROLLOUT_RUNNING}\n/ on ({REPLICA_BY}) ({REC_CEILING} > 0)\n"),
        Record(REC_QUEUE_PER_SLOT, f"{REC_ROLLOUT_WAITING}\n/ on ({REPLICA_BY}) ({REC_CEILING} > 0)\n"),
        Record(REC_SATURATED,
               f"({REC_ROLLOUT_WAITING} > bool 0)\n* on ({REPLICA_BY}) ({REC_ROLLOUT_SLOTS_USED} >= bool 1)\n",
               comment="1 while requests wait although every slot runs, else 0."),
        Record(REC_ROLLOUT_SATURATED, f"avg_over_time({REC_SATURATED}[{q.window}])",
               comment=f"Share of the last {q.window} (wall time) the replica was saturated (rollout_queue.window)."),
        Record(REC_SERVER_SHARE, _server_share(cfg, ROLE_PHASES[x.ROLE_ROLLOUT]), {"role": x.ROLE_ROLLOUT},
               comment="Share of the run's latest step spent in the phases each server role serves: gen for rollout\n"
                       "servers; gen + reward for reward servers (a reward pool or function scores during gen, a\n"
                       "colocated reward model inside timing_s/reward). Label role joins it to the replicas."),
        Record(REC_SERVER_SHARE, _server_share(cfg, ROLE_PHASES[x.ROLE_REWARD]), {"role": x.ROLE_REWARD}),
        Record(REC_SERVER_SHARE_MIN, f"min_over_time({REC_SERVER_SHARE}[{q.window}])",
               comment=f"Lowest of those shares over the last {q.window}: every step logged in the window."),
        Record(REC_SERVER_SHARE_AVG, f"avg_over_time({REC_SERVER_SHARE}[{q.window}])",
               comment=f"Their mean over the last {q.window}: the share of wall time the steps spent in the phase."),
        Record(REC_ROLLOUT_SATURATED_GEN,
               f"clamp_max(\n  {REC_ROLLOUT_SATURATED}\n  / on ({ROLE_BY}) group_left () ({REC_SERVER_SHARE_AVG} > 0),\n  1\n)\n",
               comment=wrap(f"Share of the time the server's phase ran (gen; gen + reward for reward servers) over the "
                            f"last {q.window} that the replica was saturated: its wall-time share over the phase's "
                            "share of wall time, at most 1 (scrapes are not aligned with steps).")),
        Alert(n.ALERT_ROLLOUT_SATURATED, cond,
              "warning", "A rollout or reward server replica is saturated while the training step waits on it.",
              rollout_saturated_description(cfg), q.for_, remedy=remedies.rollout_saturated(), step=True,
              comment=alert_comment),
    ]
    return Group("omniwatch-endpoints-rollout", rules,
                 "vLLM-Omni rollout and vLLM reward servers, per replica (config: rollout_queue).")


# --- omniwatch-endpoints-reward ----------------------------------------------------------------------------------
def reward_group(cfg: Config) -> Group:
    w = cfg.reward_server.rate_window
    reward = f'role="{x.ROLE_REWARD}"'

    def mean(family: str) -> str:
        return (f"sum by ({RUN_BY}) (rate({family}_sum{{{reward}}}[{w}]))\n"
                f"/ (sum by ({RUN_BY}) (rate({family}_count{{{reward}}}[{w}])) > 0)\n")
    return Group("omniwatch-endpoints-reward", [
        Record(REC_REWARD_LATENCY, mean(x.VLLM_E2E)),
        Record(REC_REWARD_QUEUE_SECONDS, mean(x.VLLM_QUEUE_TIME)),
        Record(REC_REWARD_QUEUE_RATIO, f"{REC_REWARD_QUEUE_SECONDS}\n/ on ({RUN_BY}) ({REC_REWARD_LATENCY} > 0)\n",
               comment="Share of a reward request's latency spent queued in the reward server."),
        Record(REC_REWARD_QUEUE_SHARE,
               f"max by ({RUN_BY}) ({sel(cfg, n.REWARD_BOUND_RATIO)})\n* on ({RUN_BY}) {REC_REWARD_QUEUE_RATIO}\n",
               comment="Reward-bound share of the generation window that is queueing at the reward servers:\n"
                       "high = add reward replicas; low while reward-bound = the scorer itself is slow."),
    ], f"Reward server latency and queueing over {w} (dashboards; config: reward_server).")


# --- omniwatch-endpoints-transferqueue ---------------------------------------------------------------------------
TQ_COMMENT = """\
TransferQueue (V1 trainers). What each series means, from the transferqueue 0.1.11 source
(docs/sources.md §2 cites the functions):
 - Live samples are the backlog measure: tq_storage_active_keys_total = keys holding data in a
   storage unit (StorageUnitData._active_keys; capacity is enforced on it, per unit) and
   tq_partition_samples_total = keys registered in a partition (DataPartitionStatus.global_indexes).
   Both are controller gauges refreshed every TQ_METRICS_COLLECT_INTERVAL (default 10 s).
 - tq_controller_request_samples_total{op_type="NOTIFY_DATA_UPDATE"} counts the samples of every
   put of fields, so writing a computed field back to the same keys counts them again (the V1
   pattern writes each sample twice); {op_type="CLEAR_META"} counts cleared samples and
   clear_partition is not counted at all. Their difference is no backlog: shown as rates only.
 - Several gauges end in _total (TQ naming): summed or deriv()-ed, never rate()d.

Thresholds, windows and for: (exporter/omniwatch/alerting/config.py, section transferqueue;
docs/alerts.md says why):"""
TQ_FIELDS = (  # config field -> what it does here
    ("net_rate_window", "deriv() window of active keys per storage unit"),
    ("ttf_seconds", "time to full at that net rate that counts as filling"),
    ("min_utilization", "... only once the fullest unit holds more than this"),
    ("full_utilization", "nearly full fires whatever the rate"),
    ("for", "for: of both TransferQueueBacklog rules"),
    ("stall_factor", "critical when no step for this many typical steps during a backlog"),
    ("leak_min_rise", "floor rise (share of capacity) per window, TransferQueueSlowLeak"),
    ("floor_short", "shortest floor window of TransferQueueSlowLeak (floor30m)"),
    ("floor_mid", "middle floor window (floor1h)"),
    ("floor_long", "longest floor window (floor2h), also the level a backlog must drain back to"),
    ("leak_for", "for: of TransferQueueSlowLeak"),
    ("rate_window", "sample write / clear rates (dashboards)"),
)


def _tq_comment(cfg: Config) -> str:
    t = cfg.transferqueue.model_dump(by_alias=True)
    width = max(len(f) for f, _ in TQ_FIELDS)
    rows = [f"  {f:<{width}}  {str(t[f]):<5} {what}" for f, what in TQ_FIELDS]
    return TQ_COMMENT + "\n" + "\n".join(rows)


DERIV_POS = " > 0"
PER_STEP = f" * on ({RUN_BY}) max by ({RUN_BY}) ({n.TYPICAL_STEP}) > 0"
DRAINING = "-1 * "


def tq_backlog_description(cfg: Config):
    t = cfg.transferqueue
    return P(RUN, ": the fullest TransferQueue storage unit holds ", Value("pct"), " of its capacity",
             Query(REC_TQ_SECONDS_TO_FULL, "dur", prefix=" and is full in ", suffix=f" at the net rate of the last "
                                                                        f"{span(t.net_rate_window)}"),
             Query(REC_TQ_DERIV, post=DERIV_POS, fmt="f1", prefix=" (+", suffix=" live samples/s"),
             Query(REC_TQ_DERIV, post=PER_STEP, fmt="f0", prefix=", about ", suffix=" per training step"),
             Query(REC_TQ_DERIV, post=DERIV_POS, prefix=")", show=False),
             AT_STEP,
             Query(REC_TQ_DERIV, pre=DRAINING, post=DERIV_POS, fmt="f1", prefix="; draining at ",
                   suffix=" live samples/s, not yet back to its usual level"),
             ". Live samples grow when they are written faster than cleared; a full unit fails puts and rollout "
             "stops feeding the trainer.")


def tq_critical_description(cfg: Config):
    t = cfg.transferqueue
    return P(RUN, ": no training step for ", Value("dur"), f" (more than {t.stall_factor:g} typical steps",
             Query(n.TYPICAL_STEP, "dur", prefix=" of "), ")", Query(n.STEP, "f0", prefix=", last step "),
             ", while its TransferQueue storage fills", Query(REC_TQ_UTILIZATION, "pct", prefix=" (fullest unit ", suffix=")"),
             ". The backlog is stalling training: full units fail puts, or the trainer is the slow consumer.")


def tq_leak_description(cfg: Config):
    t = cfg.transferqueue
    return P(RUN, ": the lowest TransferQueue storage utilisation of the last ", span(t.floor_short), " is ",
             Value("pct"), Query(REC_TQ_FLOOR_MID, "pct", prefix=f", of the last {span(t.floor_mid)} "),
             Query(REC_TQ_FLOOR_LONG, "pct", prefix=f", of the last {span(t.floor_long)} "),
             ": the floor that every step drains to keeps rising, so some samples are written and never cleared "
             "(a partition nobody clears, failed samples left behind)", Query(n.STEP, "f0", prefix="; at step "), ".")


def transferqueue_group(cfg: Config) -> Group:
    t = cfg.transferqueue
    rw = t.rate_window
    unit_keys = f"max by ({UNIT_BY}) ({x.TQ_ACTIVE_KEYS})"
    firing = f'ALERTS{{alertname="{n.ALERT_TQ_BACKLOG}", alertstate="firing", severity="warning"}}'
    rules = [
        Record(REC_TQ_PARTITION, f"sum by ({RUN_BY}) ({x.TQ_PARTITION_SAMPLES})",
               comment="Live samples (gauges that end in _total: summed, never rate()d)."),
        Record(REC_TQ_ACTIVE, f"sum by ({RUN_BY}) ({x.TQ_ACTIVE_KEYS})"),
        Record(REC_TQ_CAPACITY, f"sum by ({RUN_BY}) ({x.TQ_CAPACITY})"),
        Record(REC_TQ_UTILIZATION, f"max by ({RUN_BY}) ({x.TQ_UTILIZATION})"),
        Record(REC_TQ_WRITES, f'sum by ({RUN_BY}) (rate({x.TQ_REQUEST_SAMPLES}{{op_type="{x.OP_PRODUCE}"}}[{rw}]))',
               comment="Sample counters as rates, for the dashboards: writes count write-backs again, so writes above\n"
                       "clears is the V1 pattern, not a backlog."),
        Record(REC_TQ_CLEARS, f'sum by ({RUN_BY}) (rate({x.TQ_REQUEST_SAMPLES}{{op_type="{x.OP_CLEAR}"}}[{rw}]))'),
        Record(REC_TQ_UNIT_DERIV, f"max by ({UNIT_BY}) (deriv({x.TQ_ACTIVE_KEYS}[{t.net_rate_window}]))",
               comment=wrap(f"Net rate of live keys (samples/s, linear regression over {t.net_rate_window}: "
                            "transferqueue.net_rate_window) per storage unit, and the time until the unit is full at "
                            "that rate (absent while the unit does not fill). Capacity is per unit and keys are routed "
                            "global_index % units, so the first full unit fails puts.")),
        Record(REC_TQ_DERIV, f"sum by ({RUN_BY}) ({REC_TQ_UNIT_DERIV})"),
        Record(REC_TQ_UNIT_TTF,
               f"(\n  max by ({UNIT_BY}) ({x.TQ_CAPACITY})\n  - {unit_keys}\n)\n/ ({REC_TQ_UNIT_DERIV} > 0)\n"),
        Record(REC_TQ_SECONDS_TO_FULL, f"min by ({RUN_BY}) ({REC_TQ_UNIT_TTF})"),
        Record(REC_TQ_FLOOR_SHORT, f"min_over_time({REC_TQ_UTILIZATION}[{t.floor_short}])",
               comment=wrap(f"Floors: the lowest utilisation of the fullest unit over {t.floor_short} / "
                            f"{t.floor_mid} / {t.floor_long} (windows hold whatever data exists, no offset: they work "
                            "from a fresh start). floor2h is the level a backlog drains back to; the nested floors "
                            "rising is a slow leak.")),
        Record(REC_TQ_FLOOR_MID, f"min_over_time({REC_TQ_UTILIZATION}[{t.floor_mid}])"),
        Record(REC_TQ_FLOOR_LONG, f"min_over_time({REC_TQ_UTILIZATION}[{t.floor_long}])"),
        Record(REC_TQ_BACKLOG,
               f"{REC_TQ_UTILIZATION} > {t.full_utilization:g}\n"
               f"or (\n  {REC_TQ_UTILIZATION} > {t.min_utilization:g}\n"
               f"  and on ({RUN_BY}) {REC_TQ_SECONDS_TO_FULL} < {t.ttf_seconds:g}\n)\n"
               f"or (\n  {REC_TQ_UTILIZATION} > on ({RUN_BY}) {REC_TQ_FLOOR_LONG} + {t.min_utilization:g}\n"
               f"  and on ({RUN_BY}) {firing}\n)\n",
               comment=wrap(f"The backlog: utilisation of the fullest unit while storage fills (time to full under "
                            f"{t.ttf_seconds:g} s once past {pct(t.min_utilization)}), or is nearly full whatever the "
                            f"rate (over {pct(t.full_utilization)}: full storage fails puts, so its net rate is 0), or "
                            f"- once the alert fires - until it has drained to within {t.min_utilization:g} of its "
                            f"{t.floor_long} floor (the level it drains to between steps). So it resolves once "
                            "drained, not at the first sample where the net rate turns.")),
        Alert(n.ALERT_TQ_BACKLOG, REC_TQ_BACKLOG, "warning", "TransferQueue storage is filling up.",
              tq_backlog_description(cfg), t.for_, remedy=remedies.tq_backlog(), step=True),
        Alert(n.ALERT_TQ_BACKLOG,
              f"max by ({RUN_BY}) (\n"
              f"  timestamp({sel(cfg, n.LAST_STEP_TS)}) - {sel(cfg, n.LAST_STEP_TS)}\n)\n"
              f"  > {t.stall_factor:g} * max by ({RUN_BY}) ({sel(cfg, n.TYPICAL_STEP)})\n"
              f"and on ({RUN_BY}) {REC_TQ_BACKLOG}\n",
              "critical", "TransferQueue storage is filling up and training has stopped stepping.",
              tq_critical_description(cfg), t.for_, remedy=remedies.tq_backlog_critical(), step=True,
              comment=wrap(f"The same backlog while the run has not stepped for {t.stall_factor:g} typical steps "
                           "(transferqueue.stall_factor): the backlog now stalls training (Alertmanager lets this "
                           "critical one inhibit the warning). The step age is taken at the exporter's last scrape "
                           "(sample timestamp - last step), not at time(): with steps shorter than two scrape "
                           "intervals, time() - last step would read a stall between scrapes.")),
        Alert(n.ALERT_TQ_SLOW_LEAK,
              f"{REC_TQ_FLOOR_SHORT} > {REC_TQ_FLOOR_MID} + {t.leak_min_rise:g}\n"
              f"and on ({RUN_BY})\n"
              f"{REC_TQ_FLOOR_MID} > {REC_TQ_FLOOR_LONG} + {t.leak_min_rise:g}\n",
              "warning", "TransferQueue storage keeps samples that are never cleared (slow leak).",
              tq_leak_description(cfg), t.leak_for, remedy=remedies.tq_slow_leak(), step=True,
              comment=wrap(f"Slow leak: the storage floor rises across the nested windows (floor30m above floor1h "
                           f"above floor2h, each by {t.leak_min_rise:g} of capacity: transferqueue.leak_min_rise), "
                           "i.e. samples accumulate that no step clears. Needs no history from before a fresh start: "
                           "it can fire once it has seen a rising floor in every window. A one-time rise (the first "
                           "steps filling a healthy run's in-flight level) lifts only one of the two comparisons at a "
                           "time and never fires.")),
    ]
    return Group("omniwatch-endpoints-transferqueue", rules, _tq_comment(cfg))


ENDPOINTS_HEADER = """\
Derived signals from the endpoints omniwatch discovers (GET /api/v1/sd): vLLM-Omni rollout and
vLLM reward servers, TransferQueue. Target labels project, experiment, role, replica come from
discovery. Rollout families exist under three prefixes depending on the vLLM-Omni version
(vllm_omni:, vllm:omni_, and upstream vllm: per engine); the first present wins per replica.

GENERATED by `omniwatch rules generate` from exporter/omniwatch/alerting/ (endpoints.py: expressions and
prose, config.py: every threshold, window and `for:` (rollout_queue, reward_server, transferqueue),
remedies.py: the fix per run layout). Do not edit: change the config (or render your own copy with
`omniwatch rules generate --config my.yml --out DIR`); `make check` fails when this file and its
generator disagree. docs/alerts.md says why each number is what it is.
"""


def rule_file(cfg: Config) -> RuleFile:
    return RuleFile("endpoints.rules.yml", ENDPOINTS_HEADER,
                    [rollout_group(cfg), reward_group(cfg), transferqueue_group(cfg)])


# =================================================================================================================
# promtool cases: alerts/tests/endpoints.test.yml (1m) and alerts/tests/transferqueue.test.yml (15 s)
# =================================================================================================================
ROLLOUT_EVERY = 60   # endpoints.test.yml: evaluation and input interval (a minute-scale window and for:)
TQ_EVERY = 15        # transferqueue.test.yml: production's scrape / evaluation interval


def expand(values: str) -> list[float | None]:
    """promtool's expanding notation, as promtool expands it: ``a`` one value, ``axn`` n+1 copies, ``a+bxn`` /
    ``a-bxn`` n+1 values by repeated addition, ``_`` a missing sample, ``_xn`` n missing, ``stale`` a stale
    marker (absent here too)."""
    out: list[float | None] = []
    for tok in values.split():
        if tok == "stale" or tok == "_":
            out.append(None)
        elif tok.startswith("_x"):
            out += [None] * int(tok[2:])
        elif "x" in tok:
            head, times = tok.rsplit("x", 1)
            k = next((i for i in range(1, len(head)) if head[i] in "+-" and head[i - 1] not in "eE"), None)
            start, inc = (float(head), 0.0) if k is None else (float(head[:k]), float(head[k:]))
            for _ in range(int(times) + 1):
                out.append(start)
                start += inc
        else:
            out.append(float(tok))
    return out


def runs(values: list[float], digits: int = 12) -> str:
    """The shortest promtool notation of ``values`` that expands back to them exactly (runs as ``axn``)."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        v = values[i]
        text = repr(float(v)).removesuffix(".0") if float(v) == round(float(v), digits) else repr(v)
        out.append(text if j == i else f"{text}x{j - i}")
        i = j + 1
    assert expand(" ".join(out)) == [float(v) for v in values], values
    return " ".join(out)


def at(values: list[float | None], t: int, every: int, sample_every: int | None = None) -> float | None:
    """The value a rule sees at evaluation time ``t`` of a series sampled every ``sample_every`` s (default: every
    evaluation): the latest sample at or before ``t`` (promtool's lookback is 5 minutes, longer than any gap here)."""
    k = t // (sample_every or every)
    return values[k] if k < len(values) else values[-1]


def over(rec: list[float | None], i: int, window: str, every: int) -> list[float]:
    """The samples of a recorded series (one per evaluation) in ``[t - window, t]``: Prometheus 2.x ranges hold
    both ends."""
    lo = max(0, i - dur(window) // every)
    return [v for v in rec[lo:i + 1] if v is not None]


def avg_over_time(vals: list[float]) -> float:
    """Prometheus 2.x ``avg_over_time``: an incremental mean."""
    mean, count = 0.0, 0.0
    for v in vals:
        count += 1
        mean += (v - mean) / count
    return mean


def alert_states(cond: list[bool], hold: str, every: int) -> list[bool]:
    """Firing at each evaluation: the condition held at every evaluation for at least ``hold``."""
    out, since = [], None
    for i, c in enumerate(cond):
        since = (since if since is not None else i) if c else None
        out.append(since is not None and (i - since) * every >= dur(hold))
    return out


def first(flags: list[bool], start: int = 0) -> int:
    i = next((k for k in range(start, len(flags)) if flags[k]), None)
    if i is None:
        raise ValueError("the scenario never reaches the condition: lengthen it or check its inputs")
    return i


# --- RolloutQueueSaturated --------------------------------------------------------------------------------------
@dataclass
class Server:
    """One rollout / reward server replica: its running and waiting requests (promtool notation, one sample per
    evaluation), its max_num_seqs if omniwatch knows it, and the family it exports."""
    role: str
    replica: str
    running: str
    waiting: str
    max_num_seqs: str | None = None
    family: tuple[str, str] = (x.OMNI_RUNNING, x.OMNI_WAITING)
    labels: dict = field(default_factory=lambda: {x.L_MODEL: "m"})


@dataclass
class StepRun:
    """A run's step timers as the exporter publishes them (one sample per evaluation): seconds of gen, of reward
    (None: not timed) and of the step, its step number and its detected layout."""
    project: str
    experiment: str
    gen: list[float]
    step: list[float]
    reward: list[float] | None = None
    modes: dict | None = None
    first_step: int = 100
    servers: list[Server] = field(default_factory=list)

    def share(self, role: str, i: int) -> float:
        num = self.gen[i] + (self.reward[i] if role == x.ROLE_REWARD and self.reward is not None else 0.0)
        return num / self.step[i]

    def step_number(self, i: int, every: int) -> int:
        """A step of step[i] seconds finishes every step[i] s: the latest step number at evaluation i."""
        return self.first_step + int(i * every // self.step[i])

    def series(self, samples: int, every: int) -> list:
        lab = run_labels(self.project, self.experiment)
        out = [Series(n.STAGE_DURATION, {**lab, n.L_PHASE: "gen"}, runs(self.gen[:samples])),
               Series(n.STEP_DURATION, lab, runs(self.step[:samples])),
               Series(n.STEP, lab, runs([self.step_number(i, every) for i in range(samples)]))]
        if self.reward is not None:
            out.append(Series(n.STAGE_DURATION, {**lab, n.L_PHASE: "reward"}, runs(self.reward[:samples])))
        if self.modes is not None:
            out.append(Series(n.RUN_INFO, {**lab, **self.modes}, f"1x{samples - 1}"))
        for s in self.servers:
            tl = {"project": self.project, "experiment": self.experiment, "role": s.role, "replica": s.replica}
            out += [Series(s.family[0], {**tl, **s.labels}, s.running), Series(s.family[1], {**tl, **s.labels}, s.waiting)]
            if s.max_num_seqs is not None:
                out.append(Series(n.ROLLOUT_MAX_NUM_SEQS, {**tl, **JOB_OW}, s.max_num_seqs))
        return out


JOB_OW = {"job": "omniwatch", "instance": "127.0.0.1:19095"}


def saturation(cfg: Config, run: StepRun, s: Server, samples: int, every: int = ROLLOUT_EVERY):
    """The rollout group, evaluated in Python for one replica: per evaluation (saturated share of the phase's time,
    saturated now, the lowest server share of the step over the window, the alert's condition). Serial engines
    (ceiling 1) are tested by the hand-written alerts/tests/serial_rollout.test.yml, not modelled here."""
    q = cfg.rollout_queue
    running, waiting = expand(s.running), expand(s.waiting)
    mns = expand(s.max_num_seqs) if s.max_num_seqs else None
    sat: list[float | None] = []
    shares = [run.share(s.role, i) for i in range(samples)]
    out = []
    for i in range(samples):
        r, w = at(running, i * every, every), at(waiting, i * every, every)
        m = at(mns, i * every, every) if mns else None
        ceiling = m if m is not None and m > 0 else max(over([at(running, k * every, every) for k in range(samples)],
                                                             i, q.ceiling_window, every))
        sat.append(None if not ceiling > 0 else float(w > 0) * float(r / ceiling >= 1))
        assert ceiling != 1, "serial engines: alerts/tests/serial_rollout.test.yml"
        share_avg = min(1.0, avg_over_time(over(sat, i, q.window, every)) / avg_over_time(over(shares, i, q.window, every)))
        share_min = min(over(shares, i, q.window, every))
        cond = (share_avg >= q.saturated_share and (sat[i] == 1 or (r == 0 and w == 0))
                and share_min > q.critical_path_share)
        out.append((share_avg, sat[i], share_min, cond))
    return out


def _expect_saturated(cfg: Config, run: StepRun, s: Server, i: int, model, every: int = ROLLOUT_EVERY):
    labels = {"project": run.project, "experiment": run.experiment, "role": s.role, "replica": s.replica}
    share_avg, _, share_min, _ = model[i]
    ctx = Ctx(labels, share_avg, {REC_SERVER_SHARE_MIN: share_min, n.STEP: run.step_number(i, every)}, run.modes)
    return Expect({"severity": "warning", **labels}, ctx)


def _saturation_case(cfg: Config, title: str, run: StepRun, samples: int, comment: str = "", exprs=()):
    """Checks just before and when the replicas of ``run`` fire (each by the model), for ``run``'s servers."""
    every = ROLLOUT_EVERY
    models = {s.replica + s.role: saturation(cfg, run, s, samples) for s in run.servers}
    fire = {k: alert_states([m[3] for m in mod], cfg.rollout_queue.for_, every) for k, mod in models.items()}
    times = sorted({first(f) for f in fire.values()})
    checks = []
    for i in sorted({t - 1 for t in times} | set(times)):
        exp = [_expect_saturated(cfg, run, s, i, models[s.replica + s.role]) for s in run.servers
               if fire[s.replica + s.role][i]]
        checks.append(Check(i * every, n.ALERT_ROLLOUT_SATURATED, exp))
    return Case(title, run.series(samples, every), checks, comment, list(exprs))


def _flat(v: float, samples: int) -> list[float]:
    return [float(v)] * samples


def rollout_cases(cfg: Config) -> list:
    q = cfg.rollout_queue
    every = ROLLOUT_EVERY
    win = dur(q.window) // every
    G = q.critical_path_share
    horizon = 4 * max(win, dur(q.ceiling_window) // every) + dur(q.for_) // every + 8
    legacy = {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}
    separate = {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"}
    out = []

    # Legacy run whose gen dominates the step (gen 190 s of 250 s); the replica saturates from 5m.
    busy = StepRun("p", "e", _flat(190, horizon), _flat(250, horizon), _flat(30, horizon), legacy, servers=[
        Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", f"0x4 3x{horizon - 5}", f"8x{horizon}",
               labels={x.L_MODEL: "m", "job": "rollout", "instance": "a:1"})])
    upstream = Series(x.VLLM_RUNNING, {"project": "p", "experiment": "e", "role": x.ROLE_ROLLOUT, "replica": "0",
                                       "exported_replica": "0", x.L_STAGE: "0", x.L_MODEL: "m", "job": "rollout",
                                       "instance": "a:1"}, f"8x{horizon}")
    lab = {"project": "p", "experiment": "e", "role": x.ROLE_ROLLOUT, "replica": "0"}
    case = _saturation_case(
        cfg, f"RolloutQueueSaturated fires once the replica was saturated in {pct(q.saturated_share)} of the last "
             f"{q.window} and for: elapsed, while gen holds the step (legacy, gen 76% of the step)", busy, horizon,
        "Saturated from 5m; the share of the window and for: decide when it fires. The same server also exports "
        "upstream vllm: per-stage families: vllm_omni: must win, not add up.",
        [ExprCheck(win * every, REC_ROLLOUT_RUNNING, [Sample(REC_ROLLOUT_RUNNING, lab, 8)]),
         ExprCheck(win * every, REC_QUEUE_PER_SLOT, [Sample(REC_QUEUE_PER_SLOT, lab, 3 / 8)]),
         ExprCheck(win * every, REC_SERVER_SHARE,
                   [Sample(REC_SERVER_SHARE, {"project": "p", "experiment": "e", "role": x.ROLE_ROLLOUT}, 190 / 250),
                    Sample(REC_SERVER_SHARE, {"project": "p", "experiment": "e", "role": x.ROLE_REWARD},
                           (190 + 30) / 250)])])
    case.series.append(upstream)
    out.append(case)

    # separate_async: the standalone rollout is always saturated; gen is the trainer's wait for samples, 9 % of the
    # step while the trainer is the bottleneck, just over the share once rollout falls behind (from 5m).
    wait = round((G + 0.05) * 140, 2)
    assert wait / 140 > G
    behind = StepRun("flowgrpo", "sd35_async", [12.6] * 5 + [wait] * (horizon - 5), _flat(140, horizon), None,
                     separate, first_step=40, servers=[Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", f"5x{horizon}",
                                                              f"8x{horizon}")])
    out.append(_saturation_case(
        cfg, f"RolloutQueueSaturated fires for a separate_async run once the trainer waits on generation (gen over "
             f"{pct(G)} of every step of the last {q.window})", behind, horizon,
        f"The standalone rollout is busy by design: quiet while gen is 9 % of the step, fires once gen has held "
        f"{pct(wait / 140)} of every step for {q.window}."))

    # A plain vLLM reward server (vllm: prefix, engine label), no --max-num-seqs: the ceiling is the replica's
    # own peak; the reward server serves gen + reward (a colocated reward model: 108 + 30 s of a 250 s step).
    rm = {x.L_ENGINE: "0", x.L_MODEL: "rm"}
    reward_run = lambda exp, servers: StepRun("p", exp, _flat(108, horizon), _flat(250, horizon),  # noqa: E731
                                              _flat(30, horizon), legacy, servers=servers)
    out.append(_saturation_case(
        cfg, "RolloutQueueSaturated on a vllm reward server without max_num_seqs (the generation window holds the "
             "step)", reward_run("e", [Server(x.ROLE_REWARD, "0", f"6x{horizon}", f"2x{horizon}", None,
                                             (x.VLLM_RUNNING, x.VLLM_WAITING), rm)]), horizon,
        "Saturated from the first sample: fires after for:."))
    out.append(_saturation_case(
        cfg, f"Without max_num_seqs the ceiling is the replica's own peak of the last {q.ceiling_window}: a reward "
             f"server restarted with fewer slots saturates once its old peak is out of that range",
        reward_run("restarted", [Server(x.ROLE_REWARD, "0", f"8x2 6x{horizon - 3}", f"0x2 2x{horizon - 3}", None,
                                        (x.VLLM_RUNNING, x.VLLM_WAITING), rm)]), horizon,
        "8 running until 2m, then 6 with 2 waiting: 6 of 8 slots until the 8 leaves the ceiling range."))

    # Quiet: the conditions hold one at a time, never together.
    quiet_runs = [
        StepRun("p", "e", _flat(190, horizon), _flat(250, horizon), _flat(30, horizon), legacy, servers=[
            # requests wait but only 4 of 8 slots run: waiting for something else
            Server(x.ROLE_ROLLOUT, "0", f"4x{horizon}", f"5x{horizon}", f"8x{horizon}"),
            # generation bursts: saturated 2 minutes of every 5 (share 0.4)
            Server(x.ROLE_ROLLOUT, "1", f"8x{horizon}", " ".join(["3 3 0 0 0"] * (horizon // 5 + 1)), f"8x{horizon}")]),
        # legacy submits the whole batch at once: the queue sits at max_num_seqs for the first part of gen (108 s of
        # 250 s) and drains (saturated 1 minute in 4: 58 % of gen time)
        StepRun("p", "legacy_batch", _flat(108, horizon), _flat(250, horizon), _flat(30, horizon), legacy, servers=[
            Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", " ".join(["40 0 0 0"] * (horizon // 4 + 1)), f"8x{horizon}")]),
        # separate_async, trainer-bound: the standalone rollout always saturated, gen 9 % of the step
        StepRun("p", "async_busy", _flat(12.6, horizon), _flat(140, horizon), None, separate, servers=[
            Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", f"5x{horizon}", f"8x{horizon}")]),
        # separate_async with one long wait for samples inside the window: the window's lowest share counts
        StepRun("p", "async_one_wait", [12.6] * (2 * win - 2) + [70.0] * 2 + [12.6] * (horizon - 2 * win),
                _flat(140, horizon), None, separate, servers=[
                    Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", f"5x{horizon}", f"8x{horizon}")]),
        # gen exactly at the share (256 s steps: the share is exact in floating point)
        StepRun("p", "edge", _flat(G * 256, horizon), _flat(256, horizon), None, separate, servers=[
            Server(x.ROLE_ROLLOUT, "0", f"8x{horizon}", f"5x{horizon}", f"8x{horizon}")]),
    ]
    assert (G * 256) / 256 == G
    series = [s for r in quiet_runs for s in r.series(horizon, every)]
    quiet_at = [k * win for k in (1, 2, 3, 4) if k * win < horizon]
    for r in quiet_runs:
        for s in r.servers:
            fired = alert_states([m[3] for m in saturation(cfg, r, s, horizon)], q.for_, every)
            assert not any(fired[i] for i in quiet_at), (r.experiment, s.replica)
    out.append(Case(
        "RolloutQueueSaturated stays quiet: free slots, bursts under the share, a legacy batch queueing during gen, a "
        "separate_async standalone rollout busy by design, one long wait in the window, a step share at the threshold",
        series, [Check(i * every, n.ALERT_ROLLOUT_SATURATED) for i in quiet_at],
        f"Checked once the {q.window} window is full (before that the share covers only the minutes that exist)."))

    # Reward server latency against the reward-bound ratio (dashboard records; rates of linear counters).
    rl = {"project": "p", "experiment": "e", "role": x.ROLE_REWARD, "replica": "0", **rm}
    run = {"project": "p", "experiment": "e"}
    out.append(Case("reward server latency against the reward-bound ratio", [
        Series(x.VLLM_E2E + "_sum", rl, "0+120x10"), Series(x.VLLM_E2E + "_count", rl, "0+60x10"),
        Series(x.VLLM_QUEUE_TIME + "_sum", rl, "0+90x10"), Series(x.VLLM_QUEUE_TIME + "_count", rl, "0+60x10"),
        Series(n.REWARD_BOUND_RATIO, {**run, "job": "omniwatch"}, "0.5x10"),
    ], [], "Counters of one reward server: 60 requests a minute, 120 s of latency and 90 s of queueing a minute.", [
        # measured with promtool: 2 s per request, 1.5 s of it queued (binary fractions: exact at any rate window),
        # half of the generation window reward-bound
        ExprCheck(600, REC_REWARD_LATENCY, [Sample(REC_REWARD_LATENCY, run, 2)]),
        ExprCheck(600, REC_REWARD_QUEUE_RATIO, [Sample(REC_REWARD_QUEUE_RATIO, run, 0.75)]),
        ExprCheck(600, REC_REWARD_QUEUE_SHARE, [Sample(REC_REWARD_QUEUE_SHARE, run, 0.375)]),
    ]))
    return out


# --- TransferQueue ---------------------------------------------------------------------------------------------
TQ_UNITS = ("TQ_STORAGE_UNIT_1729eee7", "TQ_STORAGE_UNIT_172a0008")
TQ_CONTROLLER = {"job": "transfer_queue", "role": "controller", "instance": "c:1"}
TQ_CAPACITY_PER_UNIT = 2000

# Two storage units of 2,000 keys (total_storage_size 4,000), 24 live samples each; from 5m a consumer clears 16 of
# the 32 samples/s produced (+8 live samples/s per unit), from 8m15s it clears 64/s (-16/s per unit).
BACKLOG_KEYS = "24x20 144+120x11 1224-240x5 24x21"
BACKLOG_UTIL = "0.012x20 0.072+0.06x11 0.612-0.12x5 0.012x21"
BACKLOG_PARTITION = "48x20 288+240x11 2448-480x5 48x21"
# What the regression makes of it, measured with promtool 2.42 (net_rate_window 2m; evaluation every 15 s):
# seconds -> (run:tq_storage_seconds_to_full:min, run:tq_storage_active_keys:deriv2m). At every other evaluation the
# net rate is 0 and there is no time to full. PromQL arithmetic over the inputs: data, not recomputed here.
BACKLOG_MEASURED = {"2m": {
    315: (3480.0, 1.0666666666666667), 330: (1183.6363636363637, 2.933333333333333), 345: (606.0, 5.333333333333333),
    360: (374.0, 8.0), 375: (258.0, 10.666666666666666), 390: (192.24489795918367, 13.066666666666666),
    405: (152.14285714285714, 14.933333333333334), 420: (127.0, 16.0), 435: (112.0, 16.0), 450: (97.0, 16.0),
    465: (82.0, 16.0), 480: (67.0, 16.0), 495: (121.25, 12.8), 510: (282.22222222222223, 7.2),
    540: (None, -8.0), 555: (None, -16.0), 570: (None, -23.2), 585: (None, -26.666666666666668),
    600: (None, -26.133333333333333), 615: (None, -21.333333333333332), 630: (None, -16.0),
    645: (None, -10.666666666666666), 660: (None, -5.866666666666666), 675: (None, -2.1333333333333333),
}}


@dataclass
class Backlog:
    """A run whose storage units follow the measured backlog, and its trainer's steps (promtool notation, one
    sample per 15 s)."""
    experiment: str
    steps: str
    last_step_ts: str
    typical: float = 15.0
    project: str = "p"
    samples: int = 61

    def labels(self, **extra) -> dict:
        return {"project": self.project, "experiment": self.experiment, **extra}

    def series(self) -> list:
        out = []
        for u in TQ_UNITS:
            lab = self.labels(storage_unit_id=u, **TQ_CONTROLLER)
            out += [Series(x.TQ_ACTIVE_KEYS, lab, BACKLOG_KEYS),
                    Series(x.TQ_CAPACITY, lab, f"{TQ_CAPACITY_PER_UNIT}x{self.samples - 1}"),
                    Series(x.TQ_UTILIZATION, lab, BACKLOG_UTIL)]
        ow = self.labels(**JOB_OW)
        return out + [Series(n.STEP, ow, self.steps), Series(n.LAST_STEP_TS, ow, self.last_step_ts),
                      Series(n.TYPICAL_STEP, ow, f"{self.typical:g}x{self.samples - 1}")]

    def model(self, cfg: Config):
        """Per evaluation: (utilisation of the fullest unit, time to full, net rate, warning firing, critical
        firing), the rules of the TransferQueue group in Python over the measured regression."""
        t = cfg.transferqueue
        measured = BACKLOG_MEASURED[t.net_rate_window]
        util, last, steps = expand(BACKLOG_UTIL), expand(self.last_step_ts), expand(self.steps)
        rec_util: list[float | None] = []
        rows, warn, crit_cond, warn_since, firing_prev = [], [], [], None, False
        for i in range(self.samples):
            sec = i * TQ_EVERY
            u = at(util, sec, TQ_EVERY)
            rec_util.append(u)
            ttf, rate = measured.get(sec, (None, 0.0))
            floor_long = min(over(rec_util, i, t.floor_long, TQ_EVERY))
            backlog = (u > t.full_utilization or (u > t.min_utilization and ttf is not None and ttf < t.ttf_seconds)
                       or (u > floor_long + t.min_utilization and firing_prev))
            warn_since = (warn_since if warn_since is not None else i) if backlog else None
            firing = warn_since is not None and (i - warn_since) * TQ_EVERY >= dur(t.for_)
            warn.append(firing)
            firing_prev = firing
            age = sec - at(last, sec, TQ_EVERY)
            crit_cond.append(age > t.stall_factor * self.typical and backlog)
            rows.append({"util": u, "ttf": ttf, "rate": rate, "age": age, "step": at(steps, sec, TQ_EVERY)})
        crit = alert_states(crit_cond, t.for_, TQ_EVERY)
        for i, r in enumerate(rows):
            r["warning"], r["critical"] = warn[i], crit[i]
        return rows

    def expect(self, cfg: Config, row: dict) -> list:
        out = []
        lab = self.labels()
        if row["critical"]:
            series = {n.TYPICAL_STEP: self.typical, n.STEP: row["step"], REC_TQ_UTILIZATION: row["util"]}
            out.append(Expect({"severity": "critical", **lab}, Ctx(lab, row["age"], series)))
        if row["warning"]:
            series = {n.STEP: row["step"]}
            if row["ttf"] is not None:
                series[REC_TQ_SECONDS_TO_FULL] = row["ttf"]
            if row["rate"] > 0:
                series[REC_TQ_DERIV + DERIV_POS] = row["rate"]
                series[REC_TQ_DERIV + PER_STEP] = row["rate"] * self.typical
            elif row["rate"] < 0:
                series[DRAINING + REC_TQ_DERIV + DERIV_POS] = -1 * row["rate"]
            out.append(Expect({"severity": "warning", **lab}, Ctx(lab, row["util"], series)))
        return out


def tq_cases(cfg: Config) -> list:
    t = cfg.transferqueue
    E = TQ_EVERY
    out = []
    unit_labels = lambda exp, u: {"project": "p", "experiment": exp, "storage_unit_id": u, **TQ_CONTROLLER}  # noqa: E731
    if t.net_rate_window in BACKLOG_MEASURED:
        # Fills, fires, drains, resolves once within min_utilization of its long floor; the trainer keeps stepping.
        run = Backlog("e", "1+1x60", "0+15x60")
        rows = run.model(cfg)
        fire = first([r["warning"] for r in rows])
        gone = first([not r["warning"] for r in rows], fire)
        keys = expand(BACKLOG_KEYS)
        out.append(Case(
            "TransferQueueBacklog fires while storage fills and resolves once drained",
            run.series() + [Series(x.TQ_PARTITION_SAMPLES, {"project": "p", "experiment": "e", x.L_PARTITION: "train",
                                                            **TQ_CONTROLLER}, BACKLOG_PARTITION)],
            [Check((fire - 1) * E, n.ALERT_TQ_BACKLOG), Check(fire * E, n.ALERT_TQ_BACKLOG, run.expect(cfg, rows[fire])),
             Check((gone - 1) * E, n.ALERT_TQ_BACKLOG, run.expect(cfg, rows[gone - 1])), Check(gone * E, n.ALERT_TQ_BACKLOG)],
            f"Two storage units of {TQ_CAPACITY_PER_UNIT:,} keys: from 5m +8 live samples/s per unit (time to full "
            f"~4 min), from 8m15s -16/s. The {t.net_rate_window} regression brings the time to full under "
            f"{t.ttf_seconds:g} s at {secs(first([r['ttf'] is not None and r['ttf'] < t.ttf_seconds and r['util'] > t.min_utilization for r in rows]) * E)}, "
            f"for: {t.for_} -> fires at {secs(fire * E)}; it keeps firing while it drains and resolves once within "
            f"{t.min_utilization:g} of its {t.floor_long} floor ({secs(gone * E)}).",
            [ExprCheck(fire * E, REC_TQ_SECONDS_TO_FULL, [Sample(REC_TQ_SECONDS_TO_FULL, run.labels(), rows[fire]["ttf"])]
                       if rows[fire]["ttf"] is not None else []),
             ExprCheck(fire * E, REC_TQ_ACTIVE, [Sample(REC_TQ_ACTIVE, run.labels(), 2 * keys[fire])]),
             ExprCheck(fire * E, REC_TQ_PARTITION, [Sample(REC_TQ_PARTITION, run.labels(),
                                                           expand(BACKLOG_PARTITION)[fire])])]))
        # The same backlog while the trainer stops stepping at 6m.
        stalled = Backlog("e", "1+1x24 25x36", "0+15x24 360x36")
        rows = stalled.model(cfg)
        crit = first([r["critical"] for r in rows])
        out.append(Case(
            "TransferQueueBacklog critical when training stops stepping during a backlog", stalled.series(),
            [Check(i * E, n.ALERT_TQ_BACKLOG, stalled.expect(cfg, rows[i])) for i in (crit - 1, crit)],
            f"Last step at 6m, typical step {stalled.typical:g} s: more than {t.stall_factor:g} typical steps without "
            f"one from {secs(first([r['age'] > t.stall_factor * stalled.typical for r in rows]) * E)}; the "
            f"critical needs its own for: {t.for_}."))

    # Steps of 4 s scraped every minute: between two scrapes time() - last step reaches 48 s, far over the stall
    # factor for three evaluations in a row, yet the run steps fine; the step age at the scrape (3 s) is what counts.
    fast = []
    for u in TQ_UNITS:
        fast += [Series(x.TQ_ACTIVE_KEYS, unit_labels("e", u), "24x5 504+480x3"),
                 Series(x.TQ_CAPACITY, unit_labels("e", u), f"{TQ_CAPACITY_PER_UNIT}x20"),
                 Series(x.TQ_UTILIZATION, unit_labels("e", u), "0.012x5 0.252+0.24x3")]
    ow = {"project": "p", "experiment": "e", **JOB_OW}
    fast += [Series(n.LAST_STEP_TS, ow, "-3+60x20"), Series(n.TYPICAL_STEP, ow, "4x20")]
    out.append(Case(
        "TransferQueueBacklog does not read steps shorter than the scrape interval as a stall", fast, [],
        "Steps of 4 s scraped every minute: time() - last step reaches 48 s between scrapes, yet the step age at the "
        "scrape is 3 s: the warning fires (storage fills), the critical never does.",
        [ExprCheck(540, f'max_over_time(ALERTS{{alertname="{n.ALERT_TQ_BACKLOG}",alertstate="firing"}}[10m])',
                   [Sample("", {"alertname": n.ALERT_TQ_BACKLOG, "alertstate": "firing", "project": "p",
                                "experiment": "e", "severity": "warning"}, 1)])], interval=60))

    # Nearly full whatever the net rate (flat: no time to full); exactly at the threshold stays quiet.
    full = round(t.full_utilization + 0.05, 6)
    assert full > t.full_utilization
    flat_units = []
    for exp, u_val in (("e", full), ("at_threshold", t.full_utilization)):
        u = TQ_UNITS[0]
        flat_units += [Series(x.TQ_ACTIVE_KEYS, unit_labels(exp, u), f"{round(u_val * TQ_CAPACITY_PER_UNIT):g}x30"),
                       Series(x.TQ_CAPACITY, unit_labels(exp, u), f"{TQ_CAPACITY_PER_UNIT}x30"),
                       Series(x.TQ_UTILIZATION, unit_labels(exp, u), f"{u_val!r}x30")]
    hold = dur(t.for_)
    lab = {"project": "p", "experiment": "e"}
    nearly = [Expect({"severity": "warning", **lab}, Ctx(lab, full, {}))]
    out.append(Case(
        "TransferQueueBacklog fires on nearly full storage whatever the net rate", flat_units,
        [Check(hold - E, n.ALERT_TQ_BACKLOG), Check(hold, n.ALERT_TQ_BACKLOG, nearly),
         Check(hold + 10 * E, n.ALERT_TQ_BACKLOG, nearly)],
        f"{pct(full)} full from the start: fires after for: {t.for_}; a unit at exactly {pct(t.full_utilization)} "
        f"does not."))

    # The V1 write-back pattern and per-step batches of 15 % of capacity: quiet.
    batch = " ".join(["0 60 120 180 240 300 300 300"] * 10 + ["0"])
    batch_util = " ".join(["0 0.03 0.06 0.09 0.12 0.15 0.15 0.15"] * 10 + ["0"])
    v1 = {"project": "p", "experiment": "v1", **TQ_CONTROLLER}
    quiet = [Series(x.TQ_REQUEST_SAMPLES, {**v1, x.L_OP: x.OP_PRODUCE}, "0+960x80"),
             Series(x.TQ_REQUEST_SAMPLES, {**v1, x.L_OP: x.OP_CLEAR}, "0+480x80")]
    for u in TQ_UNITS:
        quiet += [Series(x.TQ_ACTIVE_KEYS, unit_labels("v1", u), "16x80"),
                  Series(x.TQ_CAPACITY, unit_labels("v1", u), f"{TQ_CAPACITY_PER_UNIT}x80"),
                  Series(x.TQ_UTILIZATION, unit_labels("v1", u), "0.008x80")]
    for u in TQ_UNITS:
        quiet += [Series(x.TQ_ACTIVE_KEYS, unit_labels("batch", u), batch),
                  Series(x.TQ_CAPACITY, unit_labels("batch", u), f"{TQ_CAPACITY_PER_UNIT}x80"),
                  Series(x.TQ_UTILIZATION, unit_labels("batch", u), batch_util)]
    out.append(Case(
        "TransferQueue alerts stay quiet on the V1 write-back pattern and on per-step batches", quiet,
        [Check(m * 60, n.ALERT_TQ_BACKLOG) for m in (5, 10, 15, 20)],
        "The V1 pattern (tags put, fields put, write-back of a computed field to the same keys, clear): 32 samples/s "
        "in and out, 32 live, but NOTIFY_DATA_UPDATE counts every sample twice (64/s written against 32/s cleared). "
        "And a run putting a 300-key batch per unit (15 % of capacity) over 75 s of every 2-minute step and clearing "
        "it after: the fill reads as filling, but its time to full never drops under 425 s (measured).",
        [ExprCheck(600, REC_TQ_WRITES, [Sample(REC_TQ_WRITES, {"project": "p", "experiment": "v1"}, 64)]),
         ExprCheck(600, REC_TQ_CLEARS, [Sample(REC_TQ_CLEARS, {"project": "p", "experiment": "v1"}, 32)]),
         ExprCheck(1200, f"max_over_time({REC_TQ_BACKLOG}[20m])"),
         ExprCheck(1200, f'min_over_time({REC_TQ_SECONDS_TO_FULL}{{experiment="batch"}}[20m])',
                   [Sample("", {"project": "p", "experiment": "batch"}, 425)])]))

    out.append(_leak_case(cfg))
    return out


def _leak_case(cfg: Config):
    """A slow leak from a fresh start (+0.25 % of capacity per minute, 15 %/h) fires; a run whose in-flight level
    rises once to 30 % never does. One sample per minute, rules every 15 s."""
    t = cfg.transferqueue
    E, every_input = TQ_EVERY, 60
    leak_rate, rise_at = 0.0025, 10
    model_minutes = 3 * dur(t.floor_long) // 60 + dur(t.leak_for) // 60 + 20
    vals = {"leak": expand(f"0+{leak_rate}x{model_minutes}"),
            "ramp": expand(f"0x{rise_at} 0.3x{model_minutes - rise_at}")}
    evals = model_minutes * every_input // E + 1
    floors: dict[str, list] = {}
    for exp, v in vals.items():
        rec = [at(v, i * E, E, every_input) for i in range(evals)]
        fl = [(min(over(rec, i, t.floor_short, E)), min(over(rec, i, t.floor_mid, E)), min(over(rec, i, t.floor_long, E)))
              for i in range(evals)]
        floors[exp] = fl
    states = {exp: alert_states([s > m + t.leak_min_rise and m > lg + t.leak_min_rise for s, m, lg in fl], t.leak_for, E)
              for exp, fl in floors.items()}
    assert not any(states["ramp"]), "a one-time rise must never fire"
    fire = first(states["leak"])
    minutes = max(200, fire * E // every_input + 20)
    leak, ramp = f"0+{leak_rate}x{minutes}", f"0x{rise_at} 0.3x{minutes - rise_at}"
    last = minutes * every_input // E

    def expect(i: int) -> list:
        s, m, lg = floors["leak"][i]
        lab = {"project": "p", "experiment": "leak"}
        return [Expect({"severity": "warning", **lab}, Ctx(lab, s, {REC_TQ_FLOOR_MID: m, REC_TQ_FLOOR_LONG: lg}))]
    onset = fire - dur(t.leak_for) // E
    return Case(
        "TransferQueueSlowLeak fires from a fresh start and stays quiet on a one-time rise",
        [Series(x.TQ_UTILIZATION, {"project": "p", "experiment": exp, "storage_unit_id": "u", "job": "transfer_queue"},
                v) for exp, v in (("leak", leak), ("ramp", ramp))],
        [Check((fire - 1) * E, n.ALERT_TQ_SLOW_LEAK), Check(fire * E, n.ALERT_TQ_SLOW_LEAK, expect(fire)),
         Check(last * E, n.ALERT_TQ_SLOW_LEAK, expect(last))],
        f"Utilisation +{leak_rate:g} per minute (15 % of capacity per hour) from 0. The windows hold only what exists "
        f"since the start: both nested floors are {t.leak_min_rise:g} apart from {secs(onset * E)}, for: "
        f"{t.leak_for} -> fires at {secs(fire * E)}. A run whose in-flight level rises once to 30 % (its first "
        f"steps) never fires.", interval=every_input)


def test_specs(cfg: Config) -> dict[str, tuple]:
    """Test file name -> (cases, rule file, header, evaluation interval); promtests.test_files renders them."""
    head = """\
promtool unit tests of {what} (alerts/endpoints.rules.yml, group {group}), evaluated every {every}.
GENERATED by `omniwatch rules generate` from exporter/omniwatch/alerting/endpoints.py: inputs at the thresholds
of config.py, checks just before and just after each `for:`, expected annotations rendered from the alerts' own
prose; values that are PromQL arithmetic over the inputs (a regression, a rate) are measured data of the
scenario. Do not edit. Run: promtool test rules alerts/tests/*.yml
"""
    tq_head = head.format(what="the TransferQueue rules", group="omniwatch-endpoints-transferqueue", every="15s")
    if cfg.transferqueue.net_rate_window not in BACKLOG_MEASURED:
        tq_head += (f"The backlog ramp cases are left out: their regression was measured with net_rate_window "
                    f"{' / '.join(BACKLOG_MEASURED)}, not {cfg.transferqueue.net_rate_window}.\n")
    return {
        "endpoints.test.yml": (rollout_cases(cfg), "endpoints.rules.yml",
                               head.format(what="the rollout / reward server rules",
                                           group="omniwatch-endpoints-rollout and -reward", every="1m"),
                               ROLLOUT_EVERY),
        "transferqueue.test.yml": (tq_cases(cfg), "endpoints.rules.yml", tq_head, TQ_EVERY),
    }
