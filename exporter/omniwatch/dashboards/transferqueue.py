"""TransferQueue (V1 trainers), read as TransferQueue 0.1.11 means its metrics (docs/sources.md §2 cites
the source): live samples are the backlog, sample counters are rates of writes and clears, controller
requests are batches, storage latency and request rates come windowed from the storage units' own
histograms. Controller series of a storage unit and the unit's own series share ``storage_unit_id``
(discovery sets it as a target label on the unit). Several TQ gauges end in ``_total``
(external.TQ_GAUGES_NAMED_TOTAL); they are plotted as gauges, never rate()-d. Every aggregation keeps
``project, experiment``; legends start with ``{{experiment}}``."""
from __future__ import annotations

from ..config import Config
from ..alerting.prose import span
from ..alerting.records import (REC_TQ_DERIV, REC_TQ_FLOOR_LONG, REC_TQ_FLOOR_MID, REC_TQ_FLOOR_SHORT,
                                REC_TQ_SECONDS_TO_FULL, REC_TQ_UTILIZATION)
from .. import external as x
from .. import names as n
from .panels import Dashboard, Panel, Row, Step, Target, cfg_step, default_tags, hist_mean, hist_quantile, rate, sel

TQ_BAND = "TransferQueue's own guidance (its bundled dashboard), not an omniwatch alert threshold"

OP = x.L_OP
SU = x.L_STORAGE_UNIT
RUN = "project, experiment"
EXP = "{{experiment}}"
STORAGE = {x.L_ROLE: x.ROLE_TQ_STORAGE}
NOT_POLL = {OP: "!=" + x.OP_METRICS_POLL}
CAP_S = 3600  # the time-to-full panel's ceiling: "an hour or more", also while storage does not fill

def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    TQ = cfg.transferqueue
    BACKLOG = Row("Backlog: live samples", (
        Panel("Live samples", "What TransferQueue holds now: the backlog measure. Active keys = keys holding data in "
              "the storage units (what capacity limits); partition samples = keys registered in each partition, "
              "counted from the first kv_put of a key (tags included), before its fields arrive. A healthy V1 run "
              "drains to the same floor every step; a backlog rises step over step. Writing a computed field back "
              "to the same keys changes neither. Against capacity: Storage utilisation. The controller refreshes "
              "both every TQ_METRICS_COLLECT_INTERVAL (default 10 s).",
              (Target(f"sum by ({RUN}) ({sel(x.TQ_ACTIVE_KEYS)})", f"{EXP} active keys (storage)"),
               Target(f"sum by ({RUN}, {x.L_PARTITION}) ({sel(x.TQ_PARTITION_SAMPLES)})",
                      f"{EXP} {{{{partition_id}}}} samples", dashed=True)),
              unit="none", min=0, w=9, runbook=n.ALERT_TQ_BACKLOG),
        Panel("Net change of live samples", lambda CONFIG: ("Live samples per second gained (+) or drained (-), the linear "
              f"regression of active keys over {span(CONFIG.transferqueue.net_rate_window)} (recording rule {REC_TQ_DERIV}, what "
              "TransferQueueBacklog reads). Oscillating around 0 is healthy; positive for minutes is a backlog."),
              (Target(f"sum by ({RUN}) ({sel(REC_TQ_DERIV)})", EXP),),
              unit="suffix: samples/s", w=5, runbook=n.ALERT_TQ_BACKLOG),
        Panel("Time to full at the current net rate", lambda CONFIG: ("Seconds until the first storage unit is full if the net rate "
              f"of the last {span(CONFIG.transferqueue.net_rate_window)} holds ({REC_TQ_SECONDS_TO_FULL}). Shown as 1 h when it is an "
              f"hour or more or storage does not fill. TransferQueueBacklog fires when it stays under "
              f"{CONFIG.transferqueue.ttf_seconds:g} s with the fullest unit above {CONFIG.transferqueue.min_utilization * 100:g} %, or when a unit is over "
              f"{CONFIG.transferqueue.full_utilization * 100:g} % full."),
              (Target(f"min by ({RUN}) (clamp_max({sel(REC_TQ_SECONDS_TO_FULL)}, {CAP_S})) or on ({RUN}) "
                      f"(0 * max by ({RUN}) ({sel(x.TQ_UTILIZATION)}) + {CAP_S})", EXP),),
              unit="s", min=0, max=CAP_S, thresholds=(Step(None, "red"), cfg_step(cfg, "transferqueue.ttf_seconds", "green")),
              show_thresholds="dashed", w=5, runbook=n.ALERT_TQ_BACKLOG),
        Panel("Storage utilisation", lambda CONFIG: ("Active keys / capacity per storage unit. Capacity is per unit "
              "(total_storage_size / units) and keys are spread global_index % units, so the first full unit "
              f"fails puts. Red from {CONFIG.transferqueue.full_utilization * 100:g} % (TransferQueueBacklog fires whatever the rate)."),
              (Target(f"max by ({RUN}, {SU}) ({sel(x.TQ_UTILIZATION)})", f"{EXP} {{{{storage_unit_id}}}}"),),
              unit="percentunit", kind="bargauge", min=0, max=1,
              thresholds=(Step(None, "green"), Step(0.7, "yellow", note=TQ_BAND), cfg_step(cfg, "transferqueue.full_utilization", "red")),
              w=5, runbook=n.ALERT_TQ_BACKLOG),
        Panel("Utilisation floors (slow leak)",
              lambda CONFIG: ("The series TransferQueueSlowLeak reads: the fullest storage unit's utilisation and its lowest value over "
              f"the last {span(CONFIG.transferqueue.floor_short)}, {span(CONFIG.transferqueue.floor_mid)} and {span(CONFIG.transferqueue.floor_long)} (the level every step "
              f"drains to). Each shorter floor above the next longer one by {CONFIG.transferqueue.leak_min_rise:g} of capacity, for "
              f"{CONFIG.transferqueue.leak_for}, fires: samples are written and never cleared (a partition nobody clears, failed samples "
              "left behind). Flat floors under a saw-tooth utilisation are healthy."),
              (Target(f"max by ({RUN}) ({sel(REC_TQ_UTILIZATION)})", EXP + " utilisation"),
               Target(f"max by ({RUN}) ({sel(REC_TQ_FLOOR_SHORT)})", EXP + f" floor {TQ.floor_short}", dashed=True),
               Target(f"max by ({RUN}) ({sel(REC_TQ_FLOOR_MID)})", EXP + f" floor {TQ.floor_mid}", dashed=True),
               Target(f"max by ({RUN}) ({sel(REC_TQ_FLOOR_LONG)})", EXP + f" floor {TQ.floor_long}", dashed=True)),
              unit="percentunit", min=0, max=1, w=24, h=7, runbook=n.ALERT_TQ_SLOW_LEAK),
    ))

    SAMPLES = Row("Sample writes and clears (rates, not the backlog)", (
        Panel("Samples written and cleared", "Samples per second by op_type. NOTIFY_DATA_UPDATE counts the samples of "
              "every put of fields, so a write-back of a computed field to the same keys counts them again (the V1 "
              "pattern writes each sample twice); CLEAR_META counts cleared samples, clear_partition is not counted. "
              "Writes above clears is therefore no backlog: read Live samples.",
              (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUEST_SAMPLES))})", f"{EXP} {{{{op_type}}}}"),),
              unit="suffix: samples/s", min=0, w=12),
        Panel("Production / consumption progress (streaming API)", "Produced/total and consumed/total per partition "
              "and consumer task, for consumers of the streaming API (get_meta with a task_name, StreamingDataLoader): "
              "only they register tasks. The KV API (kv_batch_put / kv_batch_get / kv_clear, what verl-omni V1 uses) "
              "registers none, so this panel stays empty for V1 runs; the task_name=\"all\" production series is "
              "left out because under the KV API it only says whether the partition holds data (1) or not (0).",
              (Target(f"max by ({RUN}, {x.L_PARTITION}, {x.L_TASK}) ({sel(x.TQ_PRODUCTION, task_name='!=' + x.TASK_ALL)})",
                      f"{EXP} {{{{partition_id}}}} produced for {{{{task_name}}}}"),
               Target(f"max by ({RUN}, {x.L_PARTITION}, {x.L_TASK}) ({sel(x.TQ_CONSUMPTION)})",
                      f"{EXP} {{{{partition_id}}}} consumed by {{{{task_name}}}}", dashed=True)),
              unit="percentunit", min=0, max=1, w=12),
    ))

    REQUESTS = Row("Controller requests (batches)", (
        Panel("Controller requests by op_type", "Controller requests per second. One request is one batch, whatever "
              "its size: a kv_batch_put of fields is one KV_RETRIEVE_META, one NOTIFY_DATA_UPDATE and one "
              "SET_CUSTOM_META; a kv_clear is KV_RETRIEVE_META, MARK_CLEARING and CLEAR_META. Samples are in "
              "'Samples written and cleared'. A high KV_LIST rate is the trainer's replay buffer polling (every "
              "2 s) while it waits for rollout samples.",
              (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUESTS))})", f"{EXP} {{{{op_type}}}}"),),
              unit="reqps", min=0, w=8),
        Panel("Controller request latency P50 / P99", "Controller request latency by op_type from its duration "
              "histogram, over the rate window. P99 above 0.1 s stalls every producer and consumer of the queue "
              "(the controller handles requests one at a time).",
              (Target(hist_quantile(0.5, x.TQ_REQUEST_DURATION, f"{RUN}, {OP}"), f"{EXP} p50 {{{{op_type}}}}"),
               Target(hist_quantile(0.99, x.TQ_REQUEST_DURATION, f"{RUN}, {OP}"), f"{EXP} p99 {{{{op_type}}}}",
                      dashed=True)),
              unit="s", min=0, thresholds=(Step(None, "green"), Step(0.1, "red", note=TQ_BAND)), show_thresholds="dashed", w=8),
        Panel("Controller request errors", "Controller request errors per second by op_type (0 for the ops that "
              "had requests and no error: TQ creates an op's error series at its first error). Any sustained rate "
              "breaks data flow between rollout and training.",
              (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUEST_ERRORS))}) or "
                      f"0 * sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUESTS))})", f"{EXP} {{{{op_type}}}}"),),
              unit="reqps", min=0, w=8),
    ))

    STORAGE_ROW = Row("Storage units", (
        Panel("Storage requests by op_type", "Storage requests per second by op_type: completed, from the units' own "
              "duration histograms (PUT_DATA, GET_DATA, CLEAR_DATA), against arrivals by op from the controller's "
              "collection, leaving out GET_METRICS (the controller's own polls of the units). Arrivals above "
              "completions means requests arrive and do not finish. Needs the storage units scraped (discovery "
              "finds them).",
              (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_STORAGE_DURATION + '_count', **STORAGE))})",
                      f"{EXP} completed {{{{op_type}}}}"),
               Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_STORAGE_ARRIVALS_BY_OP, **NOT_POLL))})",
                      f"{EXP} arrived {{{{op_type}}}}", dashed=True)),
              unit="reqps", min=0, w=12),
        Panel("Storage request latency", "Mean and P99 storage request latency by op_type over the rate window, from "
              "the storage units' own histograms. (The controller's tq_storage_request_latency_avg and _p99 gauges are over "
              "the unit's whole life and hide a recent slowdown.)",
              (Target(hist_mean(x.TQ_STORAGE_DURATION, f"{RUN}, {OP}", **STORAGE), f"{EXP} mean {{{{op_type}}}}"),
               Target(hist_quantile(0.99, x.TQ_STORAGE_DURATION, f"{RUN}, {OP}", **STORAGE), f"{EXP} p99 {{{{op_type}}}}",
                      dashed=True)),
              unit="s", min=0, w=12),
        Panel("PUT latency P99 per storage unit", "P99 of PUT_DATA per storage unit from its own histogram, labelled "
              "with the storage_unit_id the controller's per-unit series (utilisation, active keys, RSS) carry: one "
              "unit slower than the others while fuller is that unit's memory or host.",
              (Target(hist_quantile(0.99, x.TQ_STORAGE_DURATION, f"{RUN}, {SU}", op_type="PUT_DATA", **STORAGE),
                      f"{EXP} {{{{storage_unit_id}}}}"),),
              unit="s", min=0, w=12),
        Panel("Storage RSS", "Resident memory per storage unit. Growing with live samples is data held; growing while "
              "live samples stay flat is the unit's own memory.",
              (Target(f"max by ({RUN}, {SU}) ({sel(x.TQ_STORAGE_RSS)})", f"{EXP} {{{{storage_unit_id}}}}"),),
              unit="bytes", min=0, w=12),
    ))

    CONTROLLER = Row("Controller", (
        Panel("Uptime", "Controller exporter uptime. Resetting to 0 mid-run means the controller actor restarted "
              "(its partitions are gone).",
              (Target(f"max by ({RUN}) ({sel(x.TQ_UPTIME)})", EXP),), unit="s", kind="stat", w=5, h=5),
        Panel("Controller RSS", "Controller resident memory. Green < 2 GB, yellow 2-4 GB, red > 4 GB (TQ's own "
              "guidance); growth with flat live samples is metadata kept per partition or key.",
              (Target(f"max by ({RUN}) ({sel(x.TQ_RSS)})", EXP),), unit="bytes", kind="stat", w=5, h=5,
              thresholds=(Step(None, "green"), Step(2e9, "yellow", note=TQ_BAND), Step(4e9, "red", note=TQ_BAND))),
        Panel("Active partitions", "tq_partitions_total (a gauge despite its name). verl-omni V1 uses 'train' and "
              "'val'; more means partitions are created and never cleared.",
              (Target(f"max by ({RUN}) ({sel(x.TQ_PARTITIONS)})", EXP),), unit="none", kind="stat", w=4, h=5),
        Panel("Global indexes", "Bookkeeping of the controller's index pool, not live samples: allocated = indexes "
              "created fresh (the pool was empty) and not released yet; reusable = released indexes waiting to be "
              "handed out again; an index taken from the pool is counted in neither. So allocated is above 0 only "
              "while live samples exceed their earlier peak and falls to 0 on a healthy run that recycles its "
              "indexes. For the backlog read Live samples.",
              (Target(f"max by ({RUN}) ({sel(x.TQ_INDEX_ALLOCATED)})", f"{EXP} allocated"),
               Target(f"max by ({RUN}) ({sel(x.TQ_INDEX_REUSABLE)})", f"{EXP} reusable")),
              unit="none", kind="stat", w=10, h=5),
    ))

    return Dashboard(
        config=cfg,
        uid="omniwatch-transferqueue",
        title="omniwatch / TransferQueue",
        description="TransferQueue controller and storage units of the selected runs (V1 trainers): live samples "
                    "(the backlog), sample rates, controller requests, storage units.",
        rows=(BACKLOG, SAMPLES, REQUESTS, STORAGE_ROW, CONTROLLER),
        tags=default_tags("transferqueue"),
        variable_metrics=(x.TQ_UPTIME,),
    )
