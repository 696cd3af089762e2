"""Metric and label names of the sources omniwatch does not export itself, defined once.

Taken from shared/reference/endpoints.md (vLLM-Omni ``vllm_omni:`` families, upstream vLLM V1 ``vllm:``
families, TransferQueue 0.1.11 controller and storage units, dcgm-exporter default counters, Ray 2.60 node GPU metrics).
The dashboards, the endpoint rules (``alerting/endpoints.py``) and ``demo_endpoints`` import these, so the demo
can only serve what the panels and rules query.

Unit quirks kept here, next to the names: ``DCGM_FI_DEV_FB_*`` and Ray ``ray_node_gram_*`` are MiB,
DCGM ``*_UTIL`` and Ray ``ray_node_gpus_utilization`` are percent (0-100), Ray power is milliwatts.
Several TransferQueue gauges end in ``_total`` (``TQ_GAUGES_NAMED_TOTAL``): never ``rate()`` them.
"""
from __future__ import annotations

MIB = 1024 * 1024

# Target labels omniwatch's scrape configs attach to every external target (joins a series to a run).
L_ROLE = "role"
L_REPLICA = "replica"
ROLE_ROLLOUT = "rollout"
ROLE_REWARD = "reward"
ROLE_TQ = "transferqueue"            # legacy: static configs written before discovery named the two roles
ROLE_TQ_CONTROLLER = "controller"    # TransferQueue controller target (discovery/targets.py)
ROLE_TQ_STORAGE = "storage"          # TransferQueue storage-unit targets, with replica and storage_unit_id
ROLE_DCGM = "dcgm"
ROLE_RAY = "ray"

# --- vLLM-Omni (rollout replicas; prefix "vllm_omni:", labels model_name [, stage]) ----------------
OMNI = "vllm_omni:"
OMNI_RUNNING = OMNI + "num_requests_running"
OMNI_WAITING = OMNI + "num_requests_waiting"
OMNI_E2E = OMNI + "e2e_request_latency_s"                 # histogram (buckets 0.05 .. 300 s)
OMNI_EXEC = OMNI + "diffusion_exec_s"                     # histogram, labels model_name, stage
OMNI_EXEC_PER_STEP = OMNI + "diffusion_exec_per_step_s"   # histogram
OMNI_PREPROCESS = OMNI + "diffusion_preprocess_s"         # histogram
OMNI_POSTPROCESS = OMNI + "diffusion_postprocess_s"       # histogram (VAE decode)
OMNI_FAILED = OMNI + "requests_failed_total"              # counter, labels model_name, reason
OMNI_SUCCESS = OMNI + "requests_success_total"            # counter, labels model_name, finished_reason
OMNI_IMAGES = OMNI + "image_count_total"                  # counter
OMNI_QUEUE_WAIT = OMNI + "request_queue_wait_s"           # histogram (vLLM-Omni PR #6150); named by the runbooks
OMNI_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
# vLLM-Omni before vllm PR #42331 exposed the pipeline families as "vllm:omni_*" (no diffusion families yet);
# alerts/endpoints.rules.yml and the rollout dashboard accept both forms and upstream "vllm:" (AR stages).
OMNI_V0 = "vllm:omni_"
OMNI_V0_RUNNING = OMNI_V0 + "num_requests_running"
OMNI_V0_WAITING = OMNI_V0 + "num_requests_waiting"
OMNI_V0_E2E = OMNI_V0 + "e2e_request_latency_s"
OMNI_V0_SUCCESS = OMNI_V0 + "requests_success_total"
L_MODEL = "model_name"
L_STAGE = "stage"
L_FAIL_REASON = "reason"

# --- upstream vLLM V1 (reward-model servers, AR stages; labels model_name, engine) -----------------
VLLM = "vllm:"
VLLM_RUNNING = VLLM + "num_requests_running"
VLLM_WAITING = VLLM + "num_requests_waiting"
VLLM_E2E = VLLM + "e2e_request_latency_seconds"  # histogram
VLLM_KV_USAGE = VLLM + "kv_cache_usage_perc"      # 0-1
VLLM_SUCCESS = VLLM + "request_success_total"     # counter {finished_reason}
VLLM_QUEUE_TIME = VLLM + "request_queue_time_seconds"   # histogram: waiting for a scheduler slot
VLLM_TTFT = VLLM + "time_to_first_token_seconds"        # histogram: LLM-judge reward models
VLLM_PREEMPTIONS = VLLM + "num_preemptions_total"       # counter: KV cache full, requests recomputed
L_ENGINE = "engine"

# --- TransferQueue 0.1.11 ---------------------------------------------------------------------------
# Meanings from the installed source (docs/sources.md §2 cites the functions). Controller endpoint:
TQ_UPTIME = "tq_controller_uptime_seconds"
TQ_RSS = "tq_controller_memory_rss_bytes"
TQ_PARTITIONS = "tq_partitions_total"                      # gauge
TQ_PARTITION_SAMPLES = "tq_partition_samples_total"        # gauge {partition_id}: keys registered (live)
TQ_PRODUCTION = "tq_partition_production_progress"         # 0-1 {partition_id, task_name}; "all" + registered tasks
TQ_CONSUMPTION = "tq_partition_consumption_progress"       # 0-1 {partition_id, task_name}; streaming API only
TQ_INDEX_ALLOCATED = "tq_global_index_allocated_total"     # gauge: fresh indexes not yet released (not live!)
TQ_INDEX_REUSABLE = "tq_global_index_reusable_total"       # gauge: released indexes waiting for reuse
TQ_REQUESTS = "tq_controller_request_total"                # counter {op_type}: requests = batches
TQ_REQUEST_ERRORS = "tq_controller_request_errors_total"   # counter {op_type}
TQ_REQUEST_SAMPLES = "tq_controller_request_samples_total"  # counter {op_type}: NOTIFY_DATA_UPDATE (each put), CLEAR_META
TQ_REQUEST_DURATION = "tq_controller_request_duration_seconds"  # histogram {op_type}
TQ_CAPACITY = "tq_storage_capacity_total"                  # gauge {storage_unit_id}
TQ_ACTIVE_KEYS = "tq_storage_active_keys_total"            # gauge {storage_unit_id}: keys holding data (live)
TQ_UTILIZATION = "tq_storage_utilization_ratio"            # gauge {storage_unit_id}
TQ_STORAGE_RSS = "tq_storage_memory_rss_bytes"             # gauge {storage_unit_id}
TQ_STORAGE_OPS = "tq_storage_request_ops"                  # gauge: the unit's request counter (counted on entry)
TQ_STORAGE_LAT_AVG = "tq_storage_request_latency_avg"      # gauge, seconds, over the unit's whole life
TQ_STORAGE_LAT_P99 = "tq_storage_request_latency_p99"      # gauge, seconds, over the unit's whole life
TQ_STORAGE_ARRIVED = "tq_storage_requests_arrived"         # gauge holding a cumulative count {storage_unit_id}
TQ_STORAGE_ARRIVALS_BY_OP = "tq_storage_arrivals_by_op"    # gauge, cumulative {storage_unit_id, op_type}, GET_METRICS too
# Storage-unit endpoints (role "storage"; no storage_unit_id label of their own: discovery adds it as a target label):
TQ_STORAGE_DURATION = "tq_storage_request_duration_seconds"  # histogram {op_type}: PUT_DATA, GET_DATA, CLEAR_DATA
TQ_STORAGE_REQUESTS = "tq_storage_request_total"             # counter {op_type}, same ops, counted on entry
TQ_STORAGE_ERRORS = "tq_storage_request_errors_total"        # counter {op_type}
TQ_STORAGE_SAMPLES = "tq_storage_request_samples_total"      # counter, declared and never incremented by a unit
TQ_REQUEST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
TQ_GAUGES_NAMED_TOTAL = (TQ_PARTITIONS, TQ_PARTITION_SAMPLES, TQ_INDEX_ALLOCATED, TQ_INDEX_REUSABLE,
                         TQ_CAPACITY, TQ_ACTIVE_KEYS, "tq_storage_ssd_fallback_values_total")
L_OP = "op_type"
L_PARTITION = "partition_id"
L_TASK = "task_name"
L_STORAGE_UNIT = "storage_unit_id"
TASK_ALL = "all"                # the production-progress series the controller always emits
OP_PRODUCE = "NOTIFY_DATA_UPDATE"   # samples of every put of fields (a write-back counts again)
OP_CLEAR = "CLEAR_META"
OP_METRICS_POLL = "GET_METRICS"     # the controller's own collection of storage stats (arrivals only)
STORAGE_OPS = ("PUT_DATA", "GET_DATA", "CLEAR_DATA")  # the ops a storage unit measures
# Recording rules of alerts/endpoints.rules.yml the TransferQueue dashboard plots (the alert's own numbers).

# --- dcgm-exporter (default counters; labels gpu, UUID, pci_bus_id, device, modelName, Hostname) ---
DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"            # percent
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"          # MiB
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"          # MiB
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"        # W
DCGM_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"  # ratio 0-1 (DCP)
DCGM_HOSTNAME = "Hostname"
DCGM_GPU = "gpu"

# --- Ray node agent (labels ip, GpuIndex, GpuDeviceName, GpuUuid, SessionName, ...) -----------------
RAY_GPU_UTIL = "ray_node_gpus_utilization"   # percent
RAY_GRAM_USED = "ray_node_gram_used"         # MiB although the metadata says bytes
RAY_GRAM_AVAILABLE = "ray_node_gram_available"  # MiB
RAY_GPU_POWER = "ray_node_gpu_power_milliwatts"
RAY_WORKER_EVICTIONS = "ray_memory_manager_worker_eviction_total"  # counter {Type, Name}: OOM kills; named by the runbooks
RAY_IP = "ip"
RAY_GPU_INDEX = "GpuIndex"

# Scrape-time relabelling that gives DCGM and Ray GPU series omniwatch's ``node``/``gpu`` labels,
# so one ``$node``/``$gpu`` variable filters every GPU source (used by demo_endpoints.scrape_configs;
# docs/dashboards.md shows them in a dcgm-exporter job).
DCGM_RELABEL = [{"source_labels": [DCGM_HOSTNAME], "target_label": "node"}]
RAY_RELABEL = [{"source_labels": [RAY_IP], "target_label": "node"},
               {"source_labels": [RAY_GPU_INDEX], "target_label": "gpu"}]
