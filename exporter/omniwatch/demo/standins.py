"""Stand-in ``/metrics`` endpoints for the sources a demo machine cannot run: vLLM-Omni rollout
replicas, reward-model vLLM servers, a TransferQueue controller and its storage units, a dcgm-exporter
and a Ray node agent.

They serve the REAL metric names and label sets (``omniwatch.external``, from the reference), through
prometheus_client on one private registry per endpoint, with values that move over time: a ticker
thread plays a FlowGRPO step cycle (gen -> reward -> update) and feeds gauges, counters and histograms
from it. ``scrape_configs()`` returns the Prometheus jobs that scrape them with the target labels
(project, experiment, role, replica) that join every series to a run, exactly as omniwatch's own
scrape configs and discovery label real targets.

Every endpoint set exists once per run it is attached to (``DemoSources.runs``, default 2): run 0 under
``/rollout/<i>/metrics`` ..., run ``k`` under ``/run/<k>/rollout/<i>/metrics`` ..., each with its own
values, GPU node and TransferQueue controller, so a panel that drops the run labels shows it (two runs'
series pile up). Run 1's rollout replicas speak the older vLLM-Omni metric prefix ``vllm:omni_`` (pipeline
families only), so the panels' and rules' name forms are exercised too.

    server, port = start()             # 127.0.0.1, free port
    cfgs = scrape_configs("127.0.0.1", port, "demo", "flowgrpo", also=[("demo", "v1-run")])
    stop(server)
"""
from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from . import raytasks as demo_raytasks
from ..periodic import Periodic
from .. import external as x

ROLLOUT_MODEL = "stabilityai/stable-diffusion-3.5-medium"
REWARD_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
DIFFUSION_STAGE = "0"
CYCLE_S = 12.0            # one demo "training step": gen 55 %, reward 20 %, update 25 %
TICK_S = 0.25
DENOISE_STEPS = 10
PARTITIONS = ("train", "val")
TASKS = ("update_actor", "compute_old_log_prob")
TQ_STORAGE_UNITS = 2


def phase_at(t: float) -> tuple[str, float]:
    """Phase of the demo step cycle at time ``t`` and the progress (0-1) through it."""
    u = (t % CYCLE_S) / CYCLE_S
    if u < 0.55:
        return "gen", u / 0.55
    if u < 0.75:
        return "reward", (u - 0.55) / 0.20
    return "update", (u - 0.75) / 0.25


class _Endpoint:
    """One /metrics path: its own registry plus a ``tick(t, dt)`` that moves its values."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)

    def tick(self, t: float, dt: float, rng: random.Random) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Null:
    """Stand-in for a metric family the replica's vLLM-Omni version does not expose."""

    def labels(self, *a, **k):
        return self

    def __getattr__(self, name):
        return lambda *a, **k: None


class RolloutReplica(_Endpoint):
    def __init__(self, index: int, max_num_seqs: int = 4, prefix: str = x.OMNI):
        super().__init__()
        r, m = self.registry, [x.L_MODEL]
        self.index, self.max_num_seqs = index, max_num_seqs
        p = prefix  # x.OMNI ("vllm_omni:") or x.OMNI_V0 ("vllm:omni_": pipeline families only)
        self.running = Gauge(p + "num_requests_running", "Number of requests in model execution batches.", m,
                             registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "Number of requests waiting to be processed.", m, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_s", "End-to-end request latency in seconds.", m, registry=r,
                             buckets=x.OMNI_E2E_BUCKETS)
        self.success = Counter(p + "requests_success_total", "Successful requests.", [x.L_MODEL, "finished_reason"],
                               registry=r)
        self.success.labels(ROLLOUT_MODEL, "stop")
        self.e2e.labels(ROLLOUT_MODEL)
        self.slow = 1.0 + 0.35 * index  # replica 1 is a straggler: visible in the per-replica panels
        if prefix != x.OMNI:  # the diffusion families came with the vllm_omni: prefix
            self.exec = self.exec_step = self.pre = self.post = self.failed = self.images = _Null()
            return
        dl = [x.L_MODEL, x.L_STAGE]
        self.exec = Histogram(x.OMNI_EXEC, "Diffusion execution time per request.", dl, registry=r,
                              buckets=(0.5, 1, 2, 5, 10, 20, 40, 80))
        self.exec_step = Histogram(x.OMNI_EXEC_PER_STEP, "Diffusion execution time per denoising step.", dl,
                                   registry=r, buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 4))
        self.pre = Histogram(x.OMNI_PREPROCESS, "Diffusion preprocess time.", dl, registry=r,
                             buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1))
        self.post = Histogram(x.OMNI_POSTPROCESS, "Diffusion postprocess (VAE decode) time.", dl, registry=r,
                              buckets=(0.05, 0.1, 0.25, 0.5, 1, 2))
        self.failed = Counter(x.OMNI_FAILED, "Failed requests.", [x.L_MODEL, x.L_FAIL_REASON], registry=r)
        self.images = Counter(x.OMNI_IMAGES, "Images generated.", m, registry=r)
        for reason in ("timeout", "oom"):
            self.failed.labels(ROLLOUT_MODEL, reason)
        for h in (self.exec, self.exec_step, self.pre, self.post):
            h.labels(ROLLOUT_MODEL, DIFFUSION_STAGE)  # series exist before the first request finishes
        self.images.labels(ROLLOUT_MODEL)

    def tick(self, t, dt, rng):
        phase, progress = phase_at(t)
        busy = phase == "gen"
        self.running.labels(ROLLOUT_MODEL).set(self.max_num_seqs if busy else 0)
        # A healthy engine: the batch queues in the first waves and drains within gen (RolloutQueueSaturated
        # measures saturation over generation time: a queue through all of gen is a fault, not the demo's baseline).
        self.waiting.labels(ROLLOUT_MODEL).set(rng.randint(1, 6) if busy and progress < 0.4 else 0)
        if not busy:
            return
        for _ in range(rng.randint(1, 2)):  # requests finishing in this tick
            per_step = self.slow * (0.18 + 0.04 * math.sin(t / 30) + rng.uniform(0, 0.02))
            exec_s = per_step * DENOISE_STEPS
            pre, post = rng.uniform(0.01, 0.03), self.slow * rng.uniform(0.15, 0.3)
            self.exec_step.labels(ROLLOUT_MODEL, DIFFUSION_STAGE).observe(per_step)
            self.exec.labels(ROLLOUT_MODEL, DIFFUSION_STAGE).observe(exec_s)
            self.pre.labels(ROLLOUT_MODEL, DIFFUSION_STAGE).observe(pre)
            self.post.labels(ROLLOUT_MODEL, DIFFUSION_STAGE).observe(post)
            self.e2e.labels(ROLLOUT_MODEL).observe(pre + exec_s + post + rng.uniform(0, 0.5))
            self.success.labels(ROLLOUT_MODEL, "stop").inc()
            self.images.labels(ROLLOUT_MODEL).inc(4)
        if rng.random() < 0.02:
            self.failed.labels(ROLLOUT_MODEL, "timeout").inc()


class RewardServer(_Endpoint):
    def __init__(self, index: int):
        super().__init__()
        r, lab = self.registry, [x.L_MODEL, x.L_ENGINE]
        self.index = index
        self.running = Gauge(x.VLLM_RUNNING, "Number of requests in model execution batches.", lab, registry=r)
        self.waiting = Gauge(x.VLLM_WAITING, "Number of requests waiting to be processed.", lab, registry=r)
        self.kv = Gauge(x.VLLM_KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", lab, registry=r)
        self.e2e = Histogram(x.VLLM_E2E, "Histogram of e2e request latency in seconds.", lab, registry=r,
                             buckets=(0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60))
        self.queue = Histogram(x.VLLM_QUEUE_TIME, "Histogram of time spent in WAITING phase for request.", lab,
                               registry=r, buckets=(0.05, 0.1, 0.3, 0.5, 1, 2, 5, 10, 20, 60))
        self.ttft = Histogram(x.VLLM_TTFT, "Histogram of time to first token in seconds.", lab, registry=r,
                              buckets=(0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5))
        self.preempt = Counter(x.VLLM_PREEMPTIONS, "Cumulative number of preemption from the engine.", lab,
                               registry=r)
        self.success = Counter(x.VLLM_SUCCESS, "Count of successfully processed requests.", lab + ["finished_reason"],
                               registry=r)
        for h in (self.e2e, self.queue, self.ttft, self.preempt):
            h.labels(REWARD_MODEL, "0")
        self.success.labels(REWARD_MODEL, "0", "stop")

    def tick(self, t, dt, rng):
        phase, progress = phase_at(t)
        lv = (REWARD_MODEL, "0")
        scoring = phase in ("gen", "reward")  # async scoring starts during gen and drains after it
        # Healthy: a queue builds late in gen and drains early in reward (saturated for a third of the window at most).
        queue = (int(12 * (progress - 0.7) / 0.3) if phase == "gen" and progress > 0.7
                 else int(12 * (1 - progress / 0.3)) if phase == "reward" and progress < 0.3 else 0)
        self.running.labels(*lv).set(8 if scoring else 0)
        self.waiting.labels(*lv).set(queue if scoring else 0)
        self.kv.labels(*lv).set(min(1.0, 0.2 + 0.06 * queue + rng.uniform(0, 0.05)) if scoring else 0.02)
        if scoring:
            for _ in range(rng.randint(1, 3)):
                queued = 0.12 * queue + rng.uniform(0, 0.05)
                self.queue.labels(*lv).observe(queued)
                self.ttft.labels(*lv).observe(0.05 + rng.uniform(0, 0.05) + 0.01 * queue)
                self.e2e.labels(*lv).observe(0.4 + queued + 0.03 * queue + rng.uniform(0, 0.3))
                self.success.labels(*lv, "stop").inc()
            if queue >= 10 and rng.random() < 0.3:  # a full KV cache near the end of gen
                self.preempt.labels(*lv).inc()


class TransferQueueStorageUnit(_Endpoint):
    """A SimpleStorageUnit's own endpoint (TransferQueue 0.1.11 ``TQMetricsExporter(role="storage")``): the
    request histogram, counter, errors and (never incremented) samples counter, labelled ``op_type`` only.
    Scraped with target labels role="storage", replica and storage_unit_id, as discovery sets them."""

    def __init__(self, unit_id: str):
        super().__init__()
        r = self.registry
        self.unit_id = unit_id
        self.dur = Histogram(x.TQ_STORAGE_DURATION, "Storage request processing duration", [x.L_OP], registry=r,
                             buckets=x.TQ_REQUEST_BUCKETS)
        self.req = Counter(x.TQ_STORAGE_REQUESTS, "Total number of requests processed by "
                           "the storage", [x.L_OP], registry=r)
        self.err = Counter(x.TQ_STORAGE_ERRORS, "Total number of request errors in the "
                           "storage", [x.L_OP], registry=r)
        Counter(x.TQ_STORAGE_SAMPLES, "Total number of samples processed per operation "
                "type in the storage", [x.L_OP], registry=r)
        self.arrivals = {op: 0 for op in (*x.STORAGE_OPS, x.OP_METRICS_POLL)}
        for op in x.STORAGE_OPS:
            self.dur.labels(op)
            self.req.labels(op)

    def tick(self, t, dt, rng):
        """Moved by the controller's tick, which routes its requests here."""

    def handle(self, op: str, n: int, rng: random.Random, slow: float = 1.0) -> None:
        """``n`` requests of ``op``: counted on arrival and on entry, timed to completion (TQ's measure())."""
        self.arrivals[op] += n
        for _ in range(n):
            self.req.labels(op).inc()
            base = {"PUT_DATA": 0.0009, "GET_DATA": 0.0007, "CLEAR_DATA": 0.0006}[op]
            self.dur.labels(op).observe(slow * base * rng.uniform(0.6, 1.6) + (0.004 if rng.random() < 0.02 else 0))

    def poll(self) -> None:
        """The controller's GET_METRICS: an arrival, not measured (simple_storage._process_one_worker_request)."""
        self.arrivals[x.OP_METRICS_POLL] += 1

    def lifetime(self, op: str) -> tuple[float, float, float]:
        """(count on entry, lifetime mean, lifetime p99) as _handle_get_metrics computes them."""
        count = self.req.labels(op)._value.get()
        h = self.dur.labels(op)
        cum, total, out = 0.0, [], 0.0
        for b in h._buckets:
            cum += b.get()
            total.append(cum)
        n = total[-1] if total else 0
        if n:
            target, prev_b, prev_c = 0.99 * n, 0.0, 0.0
            for bound, c in zip(h._upper_bounds, total):
                if c >= target:
                    out = prev_b + (bound - prev_b) * ((target - prev_c) / (c - prev_c) if c > prev_c else 0)
                    break
                prev_b, prev_c = bound, c
        return count, (h._sum.get() / n if n else 0.0), out


class TransferQueueController(_Endpoint):
    """TransferQueue 0.1.11 controller endpoint (shape of tests/fixtures/endpoints), fed by a V1-shaped
    step: rollout puts the step's samples during gen (tags put, then fields put) and writes a computed
    reward field back to the same keys during reward (NOTIFY_DATA_UPDATE counts them again), the update
    consumes them through a streaming consumer task and clears them (MARK_CLEARING, CLEAR_DATA,
    CLEAR_META). Live samples drain to 0 every step; the index pool recycles. The controller's copies of
    the storage units' stats are refreshed every ``COLLECT_S`` (TQ_METRICS_COLLECT_INTERVAL)."""

    COLLECT_S = 2.0

    def __init__(self, units: list[TransferQueueStorageUnit]):
        super().__init__()
        r = self.registry
        self.t0 = time.time()
        self.units = units
        self.capacity = 100000 // max(1, len(units))
        self.req_dur = Histogram(x.TQ_REQUEST_DURATION, "Controller request processing duration", [x.L_OP],
                                 registry=r, buckets=x.TQ_REQUEST_BUCKETS)
        self.req = Counter(x.TQ_REQUESTS, "Total number of requests processed by the controller", [x.L_OP], registry=r)
        self.req_err = Counter(x.TQ_REQUEST_ERRORS, "Total number of request errors in the controller", [x.L_OP],
                               registry=r)
        self.req_samples = Counter(x.TQ_REQUEST_SAMPLES, "Total number of samples processed per operation type "
                                   "in the controller", [x.L_OP], registry=r)
        self.uptime = Gauge(x.TQ_UPTIME, "Controller uptime in seconds", registry=r)
        self.rss = Gauge(x.TQ_RSS, "Controller process RSS memory in bytes", registry=r)
        self.partitions = Gauge(x.TQ_PARTITIONS, "Total number of active partitions", registry=r)
        self.samples = Gauge(x.TQ_PARTITION_SAMPLES, "Number of active samples in a partition", [x.L_PARTITION],
                             registry=r)
        self.production = Gauge(x.TQ_PRODUCTION, "Production progress ratio (0.0-1.0)", [x.L_PARTITION, x.L_TASK],
                                registry=r)
        self.consumption = Gauge(x.TQ_CONSUMPTION, "Consumption progress ratio (0.0-1.0)",
                                 [x.L_PARTITION, x.L_TASK], registry=r)
        self.allocated = Gauge(x.TQ_INDEX_ALLOCATED, "Total allocated global indexes", registry=r)
        self.reusable = Gauge(x.TQ_INDEX_REUSABLE, "Number of reusable global indexes", registry=r)
        su = [x.L_STORAGE_UNIT]
        self.cap = Gauge(x.TQ_CAPACITY, "Storage unit capacity (max keys)", su, registry=r)
        self.keys = Gauge(x.TQ_ACTIVE_KEYS, "Active keys in storage unit", su, registry=r)
        self.util = Gauge(x.TQ_UTILIZATION, "Storage utilization ratio (active/capacity)", su, registry=r)
        self.srss = Gauge(x.TQ_STORAGE_RSS, "Storage unit process RSS memory", su, registry=r)
        self.arrived = Gauge(x.TQ_STORAGE_ARRIVED, "Requests decoded by the storage unit worker, whether or not "
                             "they completed", su, registry=r)
        so = [x.L_STORAGE_UNIT, x.L_OP]
        self.arrived_op = Gauge(x.TQ_STORAGE_ARRIVALS_BY_OP, "Requests decoded by the storage unit worker, by "
                                "operation", so, registry=r)
        self.ops = Gauge(x.TQ_STORAGE_OPS, "Total requests processed by storage unit", so, registry=r)
        self.lat_avg = Gauge(x.TQ_STORAGE_LAT_AVG, "Average request latency in storage unit (seconds)", so, registry=r)
        self.lat_p99 = Gauge(x.TQ_STORAGE_LAT_P99, "P99 request latency in storage unit (seconds)", so, registry=r)
        self.live = {p: 0 for p in PARTITIONS}  # keys registered per partition
        self.stored = {p: 0 for p in PARTITIONS}  # keys whose fields are in storage
        self.pool = self.fresh = 0  # index pool: reusable, and fresh indexes not released yet
        self._step = -1
        self._collected = -1e9

    def _request(self, op: str, n: int, rng: random.Random) -> None:
        self.req.labels(op).inc(n)
        for _ in range(n):
            self.req_dur.labels(op).observe(rng.uniform(0.0002, 0.004 if op != "KV_LIST" else 0.02))

    def _allocate(self, n: int) -> None:
        reuse = min(n, self.pool)
        self.pool -= reuse
        self.fresh += n - reuse  # PartitionIndexManager.allocate_indexes: only new indexes enter "allocated"

    def _release(self, n: int) -> None:
        self.fresh -= min(n, self.fresh)  # release_indexes: back to the pool, out of "allocated"
        self.pool += n

    def _storage(self, op: str, keys: int, rng: random.Random) -> None:
        if keys:
            for u in self.units:  # one request per unit holding some of the keys (global_index % units)
                u.handle(op, 1, rng, slow=1.0 + 0.3 * self.units.index(u))

    def _clear(self, p: str, n: int, rng: random.Random) -> None:
        """kv_clear: KV_RETRIEVE_META, MARK_CLEARING, CLEAR_DATA on the units, CLEAR_META (samples counted)."""
        if n <= 0:
            return
        for op in ("KV_RETRIEVE_META", "MARK_CLEARING", x.OP_CLEAR):
            self._request(op, 1, rng)
        self.req_samples.labels(x.OP_CLEAR).inc(n)
        self._storage("CLEAR_DATA", n, rng)
        self._release(n)
        self.live[p] -= n
        self.stored[p] = self.live[p]

    def tick(self, t, dt, rng):
        phase, progress = phase_at(t)
        step = int(t // CYCLE_S)
        if step != self._step:  # a new step: what the last update left is cleared with it (kv_clear per step)
            self._step = step
            self._written_back = {p: 0 for p in PARTITIONS}
            for p in PARTITIONS:
                self._clear(p, self.live[p], rng)
        self.uptime.set(time.time() - self.t0)
        self.rss.set(7.7e8 + 2e4 * (time.time() - self.t0))
        self.partitions.set(len(PARTITIONS))
        for p in PARTITIONS:
            batch = 256 if p == "train" else 64
            if phase == "gen":
                want = int(batch * progress)
            elif phase == "reward":
                want = batch
            else:
                want = int(batch * (1 - progress))
            if want > self.live[p] and phase == "gen":  # tags put, then fields put
                n = want - self.live[p]
                self._allocate(n)
                self.live[p] = self.stored[p] = want
                self._request("KV_RETRIEVE_META", 2, rng)
                self._request("SET_CUSTOM_META", 2, rng)
                self._request(x.OP_PRODUCE, 1, rng)
                self.req_samples.labels(x.OP_PRODUCE).inc(n)
                self._storage("PUT_DATA", n, rng)
            if phase == "reward":  # write-back of the computed reward to the same keys
                done = int(batch * progress) - self._written_back[p]
                if done > 0:
                    self._written_back[p] += done
                    self._request("KV_RETRIEVE_META", 1, rng)
                    self._request(x.OP_PRODUCE, 1, rng)
                    self._request("SET_CUSTOM_META", 1, rng)
                    self.req_samples.labels(x.OP_PRODUCE).inc(done)
                    self._storage("PUT_DATA", done, rng)
            if phase == "update":
                self._request("GET_META", 1, rng)
                self._storage("GET_DATA", 1, rng)
                if want < self.live[p]:  # consumed micro-batches are cleared
                    self._clear(p, self.live[p] - want, rng)
            consumed = progress if phase == "update" else 0.0
            produced = 1.0 if self.live[p] else 0.0
            self.samples.labels(p).set(self.live[p])
            self.production.labels(p, x.TASK_ALL).set(produced)
            for task in TASKS:  # a streaming consumer registered these tasks (get_meta with task_name)
                self.production.labels(p, task).set(produced)
                self.consumption.labels(p, task).set(consumed)
        self._request("KV_LIST", rng.randint(1, 3) if phase == "gen" else 0, rng)
        self.allocated.set(self.fresh)
        self.reusable.set(self.pool)
        if t - self._collected >= self.COLLECT_S:  # the controller's collection loop polls every unit
            self._collected = t
            live = sum(self.stored.values())
            for i, u in enumerate(self.units):
                u.poll()
                keys = live // len(self.units) + (1 if i < live % len(self.units) else 0)
                self.cap.labels(u.unit_id).set(self.capacity)
                self.keys.labels(u.unit_id).set(keys)
                self.util.labels(u.unit_id).set(keys / self.capacity)
                self.srss.labels(u.unit_id).set(7.7e8 + 1e5 * keys)
                self.arrived.labels(u.unit_id).set(sum(u.arrivals.values()))
                for op, n in u.arrivals.items():
                    self.arrived_op.labels(u.unit_id, op).set(n)
                for op in x.STORAGE_OPS:
                    count, avg, p99 = u.lifetime(op)
                    self.ops.labels(u.unit_id, op).set(count)
                    self.lat_avg.labels(u.unit_id, op).set(avg)
                    self.lat_p99.labels(u.unit_id, op).set(p99)


def _gpu_busy(phase: str, gpu: int, gpus: int) -> float:
    """Utilisation of one GPU in a phase: rollout GPUs (first half) busy in gen, all busy in update."""
    rollout_gpu = gpu < gpus // 2 or gpus == 1
    if phase == "gen":
        return 0.97 if rollout_gpu else 0.05
    if phase == "reward":
        return 0.04 if rollout_gpu else 0.6
    return 0.93


H200_MIB = 143771  # the demo GPUs' framebuffer


def _gpu_load(t: float, labels: list[tuple], gpus: int):
    """Each demo GPU of a node at time ``t`` (what DCGM and Ray's node agent both report, in their own units):
    its label values, busy share and framebuffer MiB used and free."""
    phase, _ = phase_at(t)
    for g, lv in enumerate(labels):
        busy = _gpu_busy(phase, g, gpus)
        used = int(H200_MIB * (0.55 + 0.3 * busy))
        yield lv, busy, used, H200_MIB - used


class DcgmExporter(_Endpoint):
    def __init__(self, node: str, gpus: int):
        super().__init__()
        r = self.registry
        self.node, self.gpus = node, gpus
        lab = [x.DCGM_GPU, "UUID", "pci_bus_id", "device", "modelName", x.DCGM_HOSTNAME]
        self.util = Gauge(x.DCGM_UTIL, "GPU utilization (in %).", lab, registry=r)
        self.fb_used = Gauge(x.DCGM_FB_USED, "Framebuffer memory used (in MiB).", lab, registry=r)
        self.fb_free = Gauge(x.DCGM_FB_FREE, "Framebuffer memory free (in MiB).", lab, registry=r)
        self.power = Gauge(x.DCGM_POWER, "Power draw (in W).", lab, registry=r)
        self.tensor = Gauge(x.DCGM_TENSOR_ACTIVE, "Ratio of cycles the tensor (HMMA) pipe is active.", lab, registry=r)
        self.labels = [(str(g), f"GPU-{g:08x}-demo-{node}", f"00000000:{0x18 + g:02X}:00.0", f"nvidia{g}",
                        "NVIDIA H200", node) for g in range(gpus)]

    def tick(self, t, dt, rng):
        for lv, busy, used, free in _gpu_load(t, self.labels, self.gpus):
            self.util.labels(*lv).set(round(100 * min(1.0, busy + rng.uniform(-0.03, 0.03)), 0))
            self.fb_used.labels(*lv).set(used)
            self.fb_free.labels(*lv).set(free)
            self.power.labels(*lv).set(90 + 560 * busy + rng.uniform(-10, 10))
            self.tensor.labels(*lv).set(max(0.0, 0.32 * busy + rng.uniform(-0.02, 0.02)))


class RayNodeAgent(_Endpoint):
    def __init__(self, ip: str, gpus: int, session: str = "session_demo_omniwatch"):
        super().__init__()
        r = self.registry
        self.gpus = gpus
        lab = [x.RAY_IP, x.RAY_GPU_INDEX, "GpuDeviceName", "GpuUuid", "SessionName", "IsHeadNode", "RayNodeType",
               "Version"]
        self.util = Gauge(x.RAY_GPU_UTIL, "Total GPUs usage on a ray node", lab, registry=r)
        self.gram_used = Gauge(x.RAY_GRAM_USED, "Total GPU RAM usage on a ray node", lab, registry=r)
        self.gram_avail = Gauge(x.RAY_GRAM_AVAILABLE, "Total GPU RAM available on a ray node", lab, registry=r)
        self.power = Gauge(x.RAY_GPU_POWER, "GPU power usage in milliwatts", lab, registry=r)
        self.labels = [(ip, str(g), "NVIDIA H200", f"GPU-{g:08x}-demo-ray", session, "true", "head", "2.60.0")
                       for g in range(gpus)]

    def tick(self, t, dt, rng):
        for lv, busy, used, free in _gpu_load(t, self.labels, self.gpus):
            self.util.labels(*lv).set(round(100 * busy, 0))
            self.gram_used.labels(*lv).set(used)          # MiB, as Ray really reports it
            self.gram_avail.labels(*lv).set(free)
            self.power.labels(*lv).set(1000 * (90 + 560 * busy))


@dataclass
class DemoSources:
    rollout_replicas: int = 2
    reward_replicas: int = 1
    node: str = "demo-node-0"
    node_ip: str = "10.0.0.10"
    gpus: int = 4
    seed: int = 7
    runs: int = 2  # endpoint sets, one per run they are attached to (scrape_configs(..., also=...))
    v0_prefix_runs: tuple[int, ...] = (1,)  # runs whose rollout replicas speak "vllm:omni_"


def run_path(run: int, path: str) -> str:
    """Path of an endpoint of run ``run``'s set: run 0 keeps the historical paths."""
    return path if run == 0 else f"/run/{run}{path}"


def run_node(cfg: DemoSources, run: int) -> tuple[str, str]:
    """(node name, node IP) of run ``run``'s GPU node: each run has its own node."""
    if run == 0:
        return cfg.node, cfg.node_ip
    base, _, last = cfg.node_ip.rpartition(".")
    return f"{cfg.node.rsplit('-', 1)[0]}-{run}", f"{base}.{int(last) + run}"


def tq_storage_unit_id(i: int, run: int = 0) -> str:
    """The id a SimpleStorageUnit gives itself (``TQ_STORAGE_UNIT_<8 hex>``), fixed per demo unit and run."""
    return f"TQ_STORAGE_UNIT_{0x1729eee7 + 0x1111 * i + 0x10000 * run:08x}"


def build_endpoints(cfg: DemoSources) -> dict[str, _Endpoint]:
    eps: dict[str, _Endpoint] = {}
    for k in range(max(1, cfg.runs)):
        prefix = x.OMNI_V0 if k in cfg.v0_prefix_runs else x.OMNI
        for i in range(cfg.rollout_replicas):
            eps[run_path(k, f"/rollout/{i}/metrics")] = RolloutReplica(i, prefix=prefix)
        for i in range(cfg.reward_replicas):
            eps[run_path(k, f"/reward/{i}/metrics")] = RewardServer(i)
        units = [TransferQueueStorageUnit(tq_storage_unit_id(i, k)) for i in range(TQ_STORAGE_UNITS)]
        for i, u in enumerate(units):
            eps[run_path(k, f"/tq/storage/{i}/metrics")] = u
        eps[run_path(k, "/tq/metrics")] = TransferQueueController(units)
        node, ip = run_node(cfg, k)
        eps[run_path(k, "/dcgm/metrics")] = DcgmExporter(node, cfg.gpus)
        eps[run_path(k, "/ray/metrics")] = RayNodeAgent(ip, cfg.gpus)
    return eps


class _Handler(BaseHTTPRequestHandler):
    endpoints: dict[str, _Endpoint] = {}

    def do_GET(self):  # noqa: N802 (http.server API)
        path = self.path.split("?", 1)[0]
        ep = self.endpoints.get(path)
        if path.startswith("/api/v0/") or path == "/api/version":  # Ray's state API (demo_raytasks)
            status, body = self.ray_state.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
        elif ep is None:
            body = ("unknown path; serving: " + " ".join(sorted(self.endpoints)) + "\n").encode()
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        else:
            body = ep.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the scraper gave up (timeout, shutdown)
            pass

    def log_message(self, fmt, *args):  # keep scrapes out of the demo's console
        pass


class DemoServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, cfg: DemoSources):
        self.cfg = cfg
        self.endpoints = build_endpoints(cfg)
        handler = type("DemoHandler", (_Handler,), {"endpoints": self.endpoints,
                                                    "ray_state": demo_raytasks.StateStandIn()})
        super().__init__(addr, handler)
        self._rng = random.Random(cfg.seed)
        self.tick(time.time(), TICK_S)  # every series exists before the first scrape
        self._ticker = Periodic(TICK_S, lambda: self.tick(time.time(), TICK_S), name="demo-endpoints-ticker",
                                what="demo endpoints tick", wait_first=True, join_timeout=2.0)
        self._serve = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="demo-endpoints-http", daemon=True)

    def tick(self, t: float, dt: float) -> None:
        for ep in self.endpoints.values():
            ep.tick(t, dt, self._rng)

    def start_threads(self):
        self._ticker.start()
        self._serve.start()

    def stop(self):
        self._ticker.stop()
        self.shutdown()
        self.server_close()
        self._serve.join(timeout=2)


def start(host: str = "127.0.0.1", port: int = 0, cfg: DemoSources | None = None) -> tuple[DemoServer, int]:
    """Serve the demo endpoints in background threads; returns (server, bound port)."""
    server = DemoServer((host, port), cfg or DemoSources())
    server.start_threads()
    return server, server.server_address[1]


def stop(server: DemoServer) -> None:
    server.stop()


def scrape_configs(host: str, port: int, project: str, experiment: str, cfg: DemoSources | None = None,
                   job_prefix: str = "omniwatch-demo", scrape_interval: str | None = None,
                   also: list[tuple[str, str]] | tuple = ()) -> list[dict]:
    """Prometheus ``scrape_configs`` entries for the demo endpoints, one job per source kind. Each
    target carries project/experiment/role(/replica) target labels and its own ``__metrics_path__``;
    DCGM and Ray series are relabelled to omniwatch's ``node``/``gpu`` labels. ``(project, experiment)``
    joins endpoint set 0; each run of ``also`` joins the next set (at most ``cfg.runs - 1`` of them)."""
    cfg = cfg or DemoSources()
    addr = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    runs = [(project, experiment), *also]
    if len(runs) > max(1, cfg.runs):
        raise ValueError(f"{len(runs)} runs, but the demo serves {cfg.runs} endpoint sets (DemoSources.runs)")

    def targets(path: str, role: str, replica: int | None = None, unit: int | None = None) -> list[dict]:
        out = []
        for k, (proj, exp) in enumerate(runs):
            labels = {"__metrics_path__": run_path(k, path), "project": proj, "experiment": exp, x.L_ROLE: role}
            if replica is not None:
                labels[x.L_REPLICA] = str(replica)
            if unit is not None:  # the storage_unit_id the controller's per-unit series carry
                labels[x.L_STORAGE_UNIT] = tq_storage_unit_id(unit, k)
            out.append({"targets": [addr], "labels": labels})
        return out

    def job(kind: str, targets: list[dict], relabel=None) -> dict:
        j = {"job_name": f"{job_prefix}-{kind}", "static_configs": targets}
        if scrape_interval:
            j["scrape_interval"] = scrape_interval
        if relabel:
            j["metric_relabel_configs"] = [dict(r) for r in relabel]
        return j

    return [
        job("rollout", [t for i in range(cfg.rollout_replicas) for t in targets(f"/rollout/{i}/metrics",
                                                                                x.ROLE_ROLLOUT, i)]),
        job("reward", [t for i in range(cfg.reward_replicas) for t in targets(f"/reward/{i}/metrics",
                                                                              x.ROLE_REWARD, i)]),
        # TransferQueue as discovery labels it: the controller, and each storage unit with replica and the
        # storage_unit_id the controller's per-unit series carry
        job("transferqueue", targets("/tq/metrics", x.ROLE_TQ_CONTROLLER)
            + [t for i in range(TQ_STORAGE_UNITS) for t in targets(f"/tq/storage/{i}/metrics", x.ROLE_TQ_STORAGE, i, i)]),
        job("dcgm", targets("/dcgm/metrics", x.ROLE_DCGM), x.DCGM_RELABEL),
        job("ray", targets("/ray/metrics", x.ROLE_RAY), x.RAY_RELABEL),
    ]


def ray_tasks_args(host: str, port: int, project: str, experiment: str) -> list[str]:
    """``omniwatch serve`` flags that attach the exporter's Ray task-event source to the stand-in state API
    (``/api/v0/...`` of the demo endpoints' server), its job joined to the run ``(project, experiment)``."""
    addr = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    return ["--ray-tasks", f"http://{addr}", "--ray-tasks-interval", "0.5", "--ray-job", demo_raytasks.JOB_ID,
            "--discovery-project", project, "--discovery-experiment", experiment]


def main(argv: list[str] | None = None) -> int:
    """``python -m omniwatch.demo.standins --port N``: serve until SIGINT/SIGTERM."""
    import argparse
    import json
    import signal

    p = argparse.ArgumentParser(prog="omniwatch.demo.standins", description=main.__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--project", default="demo", help="only for --print-scrape-configs")
    p.add_argument("--experiment", default="demo", help="only for --print-scrape-configs")
    p.add_argument("--also", action="append", default=[], metavar="PROJECT/EXPERIMENT",
                   help="only for --print-scrape-configs: a further run joined to the next endpoint set")
    p.add_argument("--print-scrape-configs", action="store_true", help="print the scrape_configs JSON and keep serving")
    args = p.parse_args(argv)
    server, port = start(args.host, args.port)
    print(f"demo endpoints on http://{args.host}:{port}: {' '.join(sorted(server.endpoints))}", flush=True)
    if args.print_scrape_configs:
        also = [tuple(a.split("/", 1)) for a in args.also]
        print(json.dumps(scrape_configs(args.host, port, args.project, args.experiment, also=also), indent=2),
              flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stop(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
