"""Metric families that other programs export and ``alerts/endpoints.rules.yml`` reads (names as in
shared/reference/endpoints.md). They are not omniwatch's, so they are not in ``names.CATALOGUE``;
the catalogue check accepts a name used in alerts/ when it is listed here."""
from __future__ import annotations

# vLLM-Omni pipeline families under each prefix it has used, and upstream vLLM V1 (endpoints.md §2.4-2.5).
VLLM_OMNI_PREFIXES = ("vllm_omni:", "vllm:omni_")
VLLM = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
)
VLLM_OMNI = tuple(p + s for p in VLLM_OMNI_PREFIXES for s in ("num_requests_running", "num_requests_waiting",
                                                               "e2e_request_latency_s", "requests_success_total"))
# TransferQueue 0.1.11 controller (endpoints.md §1.3; meanings in docs/sources.md §2).
TQ = (
    "tq_controller_uptime_seconds", "tq_controller_request_samples_total", "tq_partition_samples_total",
    "tq_storage_active_keys_total", "tq_storage_utilization_ratio", "tq_storage_capacity_total",
)
# Ray node agent (endpoints.md §3.2).
RAY = ("ray_node_cpu_count",)

EXTERNAL_METRICS = frozenset(VLLM + VLLM_OMNI + TQ + RAY)
