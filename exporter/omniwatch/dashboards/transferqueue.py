"""TransferQueue (V1 trainers): controller request rates and latency by op_type, partitions and
production vs consumption progress, storage-unit utilisation and memory. Several TQ gauges end in
``_total`` (external.TQ_GAUGES_NAMED_TOTAL); they are plotted as gauges, never rate()-d."""
from __future__ import annotations

from . import external as x
from .spec import RUN_BY, Dashboard, Panel, Row, Step, Target, default_tags, hist_quantile, rate, sel

OP = x.L_OP
RUN = RUN_BY  # every aggregation keeps the run: project, experiment
TQ_BAND = "TransferQueue's own guidance, not an omniwatch alert threshold"

CONTROLLER = Row("Controller", (
    Panel("Uptime", "Controller exporter uptime. Resetting to 0 mid-run means the controller actor restarted "
          "(its partitions are gone).",
          (Target(f"max by ({RUN}) ({sel(x.TQ_UPTIME)})", "{{experiment}} uptime"),), unit="s", kind="stat", w=5, h=5),
    Panel("Controller RSS", "Controller resident memory. Green < 2 GB, yellow 2-4 GB, red > 4 GB (TQ's own "
          "guidance); steady growth is metadata never cleared.",
          (Target(f"max by ({RUN}) ({sel(x.TQ_RSS)})", "{{experiment}} rss"),), unit="bytes", kind="stat", w=5, h=5,
          thresholds=(Step(None, "green"), Step(2e9, "yellow", note=TQ_BAND), Step(4e9, "red", note=TQ_BAND))),
    Panel("Active partitions", "tq_partitions_total (a gauge despite its name). verl-omni V1 uses 'train' and "
          "'val'; more means partitions are not cleared.",
          (Target(f"max by ({RUN}) ({sel(x.TQ_PARTITIONS)})", "{{experiment}} partitions"),), unit="none", kind="stat", w=4, h=5),
    Panel("Global indexes", "Allocated vs reusable global indexes (gauges). Allocated growing without reusable "
          "growing is a leak of sample slots.",
          (Target(f"max by ({RUN}) ({sel(x.TQ_INDEX_ALLOCATED)})", "{{experiment}} allocated"),
           Target(f"max by ({RUN}) ({sel(x.TQ_INDEX_REUSABLE)})", "{{experiment}} reusable")), unit="none", kind="stat", w=10, h=5),
))

REQUESTS = Row("Requests", (
    Panel("Request rate by op_type", "Controller requests per second. A high KV_LIST rate means the trainer's "
          "replay buffer is polling (every 2 s) while it waits for rollout samples.",
          (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUESTS))})", "{{experiment}} {{op_type}}"),), unit="reqps", min=0, w=8),
    Panel("Request latency P50 / P99", "Controller request latency by op_type from the duration histogram. P99 "
          "above 0.1 s stalls every producer and consumer of the queue.",
          (Target(hist_quantile(0.5, x.TQ_REQUEST_DURATION, f"{RUN}, {OP}"), "{{experiment}} p50 {{op_type}}"),
           Target(hist_quantile(0.99, x.TQ_REQUEST_DURATION, f"{RUN}, {OP}"), "{{experiment}} p99 {{op_type}}", dashed=True)),
          unit="s", min=0, thresholds=(Step(None, "green"), Step(0.1, "red", note=TQ_BAND)), show_thresholds="dashed", w=8),
    Panel("Request errors", "Controller request errors per second by op_type. Any sustained rate breaks data "
          "flow between rollout and training.",
          (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_REQUEST_ERRORS))})", "{{experiment}} {{op_type}}"),), unit="reqps", min=0, w=8),
))

DATA = Row("Samples and partitions", (
    Panel("Produced vs cleared samples", "Samples per second produced (NOTIFY_DATA_UPDATE) and cleared "
          "(CLEAR_META). Produced consistently above cleared is accumulation: a consumer never clears.",
          (Target(f"sum by ({RUN}) ({rate(sel(x.TQ_REQUEST_SAMPLES, op_type=x.OP_PRODUCE))})", "{{experiment}} produced"),
           Target(f"sum by ({RUN}) ({rate(sel(x.TQ_REQUEST_SAMPLES, op_type=x.OP_CLEAR))})", "{{experiment}} cleared", dashed=True)),
          unit="short", min=0, w=8),
    Panel("Samples per partition", "Active samples per partition (gauge).",
          (Target(f"max by ({RUN}, {x.L_PARTITION}) ({sel(x.TQ_PARTITION_SAMPLES)})", "{{experiment}} {{partition_id}}"),),
          unit="none", min=0, w=8),
    Panel("Production vs consumption progress", "Produced/total and consumed/total per partition and consumer "
          "task. Production at 1 with consumption behind is the trainer waiting on its own consumers; "
          "consumption waiting on production is the trainer waiting for rollout.",
          (Target(f"max by ({RUN}, {x.L_PARTITION}) ({sel(x.TQ_PRODUCTION, task_name='all')})", "{{experiment}} {{partition_id}} produced"),
           Target(f"max by ({RUN}, {x.L_PARTITION}, {x.L_TASK}) ({sel(x.TQ_CONSUMPTION)})",
                  "{{experiment}} {{partition_id}} consumed by {{task_name}}", dashed=True)),
          unit="percentunit", min=0, max=1, w=8),
))

STORAGE = Row("Storage units", (
    Panel("Storage utilisation", "Active keys / capacity per storage unit. Green < 70 %, yellow 70-90 %, red "
          "> 90 %: imminent storage exhaustion blocks producers.",
          (Target(f"max by ({RUN}, {x.L_STORAGE_UNIT}) ({sel(x.TQ_UTILIZATION)})", "{{experiment}} {{storage_unit_id}}"),),
          unit="percentunit", kind="bargauge", min=0, max=1,
          thresholds=(Step(None, "green"), Step(0.7, "yellow", note=TQ_BAND), Step(0.9, "red", note=TQ_BAND)), w=8),
    Panel("Active keys vs capacity", "Active keys per unit against capacity (both gauges ending in _total). "
          "Keys rising monotonically is a leak: keys are never freed.",
          (Target(f"sum by ({RUN}) ({sel(x.TQ_ACTIVE_KEYS)})", "{{experiment}} active keys"),
           Target(f"sum by ({RUN}) ({sel(x.TQ_CAPACITY)})", "{{experiment}} capacity", dashed=True)), unit="none", min=0, w=8),
    Panel("Storage RSS", "Resident memory per storage unit.",
          (Target(f"max by ({RUN}, {x.L_STORAGE_UNIT}) ({sel(x.TQ_STORAGE_RSS)})", "{{experiment}} {{storage_unit_id}}"),),
          unit="bytes", min=0, w=8),
    Panel("Storage request rate", "Completed storage requests per second by op_type (tq_storage_request_ops is "
          "a cumulative count exported as a gauge) against arrivals. Arrivals above completions means "
          "requests arrive and do not finish.",
          (Target(f"sum by ({RUN}, {OP}) ({rate(sel(x.TQ_STORAGE_OPS))})", "{{experiment}} completed {{op_type}}"),
           Target(f"sum by ({RUN}) ({rate(sel(x.TQ_STORAGE_ARRIVED))})", "{{experiment}} arrived", dashed=True)), unit="reqps", min=0, w=12),
    Panel("Storage request latency", "Average and P99 storage request latency by op_type, as computed by the "
          "storage units.",
          (Target(f"max by ({RUN}, {OP}) ({sel(x.TQ_STORAGE_LAT_AVG)})", "{{experiment}} avg {{op_type}}"),
           Target(f"max by ({RUN}, {OP}) ({sel(x.TQ_STORAGE_LAT_P99)})", "{{experiment}} p99 {{op_type}}", dashed=True)),
          unit="s", min=0, w=12),
))

DASHBOARD = Dashboard(
    uid="omniwatch-transferqueue",
    title="omniwatch / TransferQueue",
    description="TransferQueue controller and storage units of the selected runs (V1 trainers).",
    rows=(CONTROLLER, REQUESTS, DATA, STORAGE),
    tags=default_tags("transferqueue"),
    variable_metrics=(x.TQ_UPTIME,),
)
