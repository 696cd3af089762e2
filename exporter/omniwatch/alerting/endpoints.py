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
``transferqueue``; prose is :class:`~.prose.Prose` (the annotation template); remedies come from
:mod:`.remedies`. Record names carry no window (``:avg``, ``:deriv``, ``:floor_long``, ...): the config tunes
the windows, the dashboards read the records by name (alerting/records.py).

The promtool tests (``alerts/tests/endpoints.test.yml`` at 1m, ``transferqueue.test.yml`` at 15 s) are written
by hand with literal inputs and expected text; nothing here writes them.
"""
from __future__ import annotations

import textwrap

from .. import names as n
from .. import external as x
from . import remedies
from ..config import Config
from .prose import AT_STEP, RUN, Label, LabelSwitch, P, Query, Value, span
from .rule import AlertSpec, Group, Record, RuleFile, pct, sel
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
        AlertSpec(n.ALERT_ROLLOUT_SATURATED, cond,
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

Thresholds, windows and for: (exporter/omniwatch/config.py, section transferqueue;
docs/alerts.md says why):"""
TQ_FIELDS = (  # config field -> what it does here
    ("net_rate_window", "deriv() window of active keys per storage unit"),
    ("ttf_seconds", "time to full at that net rate that counts as filling"),
    ("min_utilization", "... only once the fullest unit holds more than this"),
    ("full_utilization", "nearly full fires whatever the rate"),
    ("for", "for: of both TransferQueueBacklog rules"),
    ("stall_factor", "critical when no step for this many typical steps during a backlog"),
    ("leak_min_rise", "floor rise (share of capacity) per window, TransferQueueSlowLeak"),
    ("floor_short", "shortest floor window of TransferQueueSlowLeak (record :floor_short)"),
    ("floor_mid", "middle floor window (:floor_mid)"),
    ("floor_long", "longest floor window (:floor_long), also the level a backlog must drain back to"),
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
                            "from a fresh start). floor_long is the level a backlog drains back to; the nested floors "
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
        AlertSpec(n.ALERT_TQ_BACKLOG, REC_TQ_BACKLOG, "warning", "TransferQueue storage is filling up.",
                  tq_backlog_description(cfg), t.for_, remedy=remedies.tq_backlog(), step=True),
        AlertSpec(n.ALERT_TQ_BACKLOG,
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
        AlertSpec(n.ALERT_TQ_SLOW_LEAK,
                  f"{REC_TQ_FLOOR_SHORT} > {REC_TQ_FLOOR_MID} + {t.leak_min_rise:g}\n"
                  f"and on ({RUN_BY})\n"
                  f"{REC_TQ_FLOOR_MID} > {REC_TQ_FLOOR_LONG} + {t.leak_min_rise:g}\n",
                  "warning", "TransferQueue storage keeps samples that are never cleared (slow leak).",
                  tq_leak_description(cfg), t.leak_for, remedy=remedies.tq_slow_leak(), step=True,
                  comment=wrap(f"Slow leak: the storage floor rises across the nested windows (floor_short above floor_mid "
                               f"above floor_long, each by {t.leak_min_rise:g} of capacity: transferqueue.leak_min_rise), "
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

