#!/usr/bin/env python3
"""Validate omniwatch's GPU busy/idle accounting against a workload that knows its own idle time.

A small PyTorch program shaped like a FlowGRPO step runs on one GPU:

  gen           denoising loop of bf16 8192x8192 matmuls (rollout)
  reward        a bf16 scoring pass on the GPU in even steps; on the CPU in odd steps (GPU idle)
  old_log_prob  forward-only pass of the actor MLP
  update_actor  forward + backward + AdamW on a bf16 MLP
  update_weights  a small device copy

with deliberate sleeps of known length between gen->reward, reward->actor and at the step end. The
omniwatch sampler runs beside it in a thread through the real NVML device code, and three attributors
read its intervals:

  pushed  the program's work phases pushed as exact spans (what ``omniwatch.client.phase`` sends);
          the sleeps become ``inter_stage`` when each step closes   <- the production path
  truth   every span including the sleeps, each gap kind as its own phase (per-gap detection)
  timing  only the step's timing_s/* values and its end time (the layout used without pushed spans)

Truth: work phases keep the GPU saturated (idle 0) except the CPU reward steps (idle = their length);
the sleeps are idle. Target: per-phase idle within 5 % (or 0.3 s) of truth, gaps >= 0.5 s detected.
Writes ``<out>/gpu_idle_validation.json`` (results) and ``<out>/h200_idle_validation.nvml.json``
(raw NVML samples + spans, the CI fixture). ``--dry-run`` runs without torch or a GPU (synthetic
device) to check the plumbing. ``--results FILE`` also records the run (not a dry run) under ``gpu_idle``
in a results.json: ``benchmarks/results.json`` is what docs/benchmarks.md quotes (``benchmarks/docs.py``).
A run made on another machine is recorded afterwards from its ``gpu_idle_validation.json``:

    PYTHONPATH=exporter python benchmarks/gpu_idle_validation.py --out "$OUT"                  # on the GPU
    PYTHONPATH=exporter python benchmarks/gpu_idle_validation.py --record "$OUT"/gpu_idle_validation.json \
        --results benchmarks/results.json                                                     # here
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporter"))

from omniwatch.core.analytics import analyze_step  # noqa: E402
from omniwatch.gpu.attribution import Attributor  # noqa: E402
from omniwatch.gpu.devices import NvmlBackend, TraceBackend  # noqa: E402
from omniwatch.gpu.peaks import H200_PEAK, identify  # noqa: E402
from omniwatch.gpu.trace import EXPERIMENT, PROJECT, score  # noqa: E402
from omniwatch.gpu.sampler import GpuSampler  # noqa: E402

GEN_REWARD_GAPS = [0.2, 0.5, 0.75, 1.0, 2.0, 3.0, 0.3, 1.5]
REWARD_ACTOR_GAPS = [0.5, 1.5, 0.3, 0.8, 2.5, 1.0, 0.4, 0.25]
STEP_END_GAP = 0.4
TARGET = dict(gen=2.5, reward=1.2, cpu_reward=1.0, old_log_prob=1.0, update_actor=2.5)
WORK_PHASES = ("gen", "reward", "old_log_prob", "update_actor", "update_weights")


class Workload:
    """The torch side: calibrated so each phase lasts about its TARGET seconds; counts FLOPs."""

    def __init__(self, n: int = 8192, layers: int = 4, tokens: int = 8192):
        import torch
        self.torch = torch
        self.dev = torch.device("cuda")
        bf = torch.bfloat16
        self.n = n
        self.x = torch.randn(n, n, device=self.dev, dtype=bf)
        self.w = torch.randn(n, n, device=self.dev, dtype=bf) / n ** 0.5
        self.model = torch.nn.Sequential(*[m for _ in range(layers) for m in
                                           (torch.nn.Linear(n, n, bias=False), torch.nn.GELU())]).to(self.dev, bf)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.tokens = torch.randn(tokens, n, device=self.dev, dtype=bf)
        self.layers, self.ntok = layers, tokens
        self.cpu_a = torch.randn(512, 512)
        self.mm_flops = 2.0 * n ** 3
        self.fwd_flops = 2.0 * tokens * n * n * layers
        self.flops = {}
        self.iters = {}
        self.calibrate()

    def sync(self):
        self.torch.cuda.synchronize()

    def _denoise(self, k):
        x = self.x
        for _ in range(k):
            x = self.torch.tanh(x @ self.w)
        return x

    def _forward(self, k):
        with self.torch.no_grad():
            for _ in range(k):
                self.model(self.tokens)

    def _train(self, k):
        for _ in range(k):
            loss = self.model(self.tokens).float().pow(2).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def _time(self, fn, k):
        self.sync()
        t = time.perf_counter()
        fn(k)
        self.sync()
        return time.perf_counter() - t

    def calibrate(self):
        for fn in (self._denoise, self._forward, self._train):
            fn(3)  # warm-up (kernel selection, optimizer state)
        per_mm = self._time(self._denoise, 200) / 200
        per_fwd = self._time(self._forward, 10) / 10
        per_train = self._time(self._train, 5) / 5
        self.iters = dict(gen=max(1, int(TARGET["gen"] / per_mm)), reward=max(1, int(TARGET["reward"] / per_mm)),
                          old_log_prob=max(1, int(TARGET["old_log_prob"] / per_fwd)),
                          update_actor=max(1, int(TARGET["update_actor"] / per_train)))

    def run(self, phase: str, step: int) -> float:
        """Run one phase, return the FLOPs it did on the GPU."""
        it = self.iters
        if phase == "gen":
            self._denoise(it["gen"])
            return it["gen"] * self.mm_flops
        if phase == "reward":
            if step % 2 == 0:
                self._denoise(it["reward"])
                return it["reward"] * self.mm_flops
            end = time.perf_counter() + TARGET["cpu_reward"]
            while time.perf_counter() < end:  # scoring on the CPU: the GPU idles
                self.cpu_a @ self.cpu_a
            return 0.0
        if phase == "old_log_prob":
            self._forward(it["old_log_prob"])
            return it["old_log_prob"] * self.fwd_flops
        if phase == "update_actor":
            self._train(it["update_actor"])
            return it["update_actor"] * 3 * self.fwd_flops
        if phase == "update_weights":
            with self.torch.no_grad():
                self.w.copy_(self.w * 1.0)
            return 0.0
        raise ValueError(phase)

    def info(self) -> dict:
        return {"torch": self.torch.__version__, "device": self.torch.cuda.get_device_name(0), "iters": self.iters}


class DryWorkload:
    """No torch, no GPU: phases sleep and a synthetic device reports them busy."""

    def __init__(self):
        self.busy: list[tuple[float, float]] = []

    def sync(self):
        pass

    def run(self, phase, step):
        dur = {"gen": 0.5, "reward": 0.3, "old_log_prob": 0.2, "update_actor": 0.5, "update_weights": 0.01}[phase]
        gpu = not (phase == "reward" and step % 2)
        if gpu:
            self.busy.append((time.time(), float("inf")))  # busy from now on, for the device thread
        time.sleep(dur)
        if gpu:
            self.busy[-1] = (self.busy[-1][0], time.time())
        return 0.0

    def info(self):
        return {"dry_run": True}


class SyntheticDevice:
    """A fake NVML device for --dry-run: one sample per 0.2 s, utilization = busy share of the period."""

    index, uuid, name = 0, "GPU-dry-run", "Dry Run GPU"

    def __init__(self, wl: DryWorkload):
        self.wl, self.t0 = wl, time.time()

    def samples(self, last_us):
        out = []
        t = max(self.t0, last_us / 1e6)
        now = time.time()
        t = (int(t / 0.2) + 1) * 0.2
        while t <= now:
            busy = sum(max(0.0, min(b, t) - max(a, t - 0.2)) for a, b in self.wl.busy)
            out.append((int(t * 1e6), int(round(100 * busy / 0.2))))
            t += 0.2
        return out

    def memory(self):
        return 1 << 30, 141 << 30

    def power_watts(self):
        return 100.0

    def sm_clock_hz(self):
        return 1.98e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--steps", type=int, default=len(GEN_REWARD_GAPS))
    ap.add_argument("--threshold", type=float, default=50.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--results", help="record this run under 'gpu_idle' in this results.json (not with --dry-run)")
    ap.add_argument("--record", metavar="RESULT_JSON", help="run nothing: record the gpu_idle_validation.json of a "
                    "finished GPU run into --results")
    args = ap.parse_args()
    if args.results and args.dry_run:
        ap.error("--results records a real GPU run; a --dry-run's figures are synthetic")
    if args.record:
        if not args.results:
            ap.error("--record needs --results")
        res = json.loads(Path(args.record).read_text())
        if not res.get("sampler") or (res.get("device") or {}).get("dry_run"):
            ap.error(f"{args.record} is not the result of a GPU run")
        record_result(Path(args.results), res, res.get("meta") or {})
        return 0
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    raw: list[list[int]] = []
    drains: list[int] = []

    def record(_st, samples):
        raw.extend([ts, u] for ts, u in samples)
        drains.append(len(samples))

    if args.dry_run:
        wl = DryWorkload()
        backend = TraceBackend([])
        backend.open = lambda: [SyntheticDevice(wl)]  # type: ignore[method-assign]
    else:
        backend = NvmlBackend()
    sampler = GpuSampler(backend, None, node="bench", threshold=args.threshold, interval_s=1.0, raw_hook=record)
    a_pushed, a_truth, a_timing = (Attributor(sampler) for _ in range(3))
    sampler.start()
    if not args.dry_run:
        wl = Workload()
    run = SimpleNamespace(project=PROJECT, experiment=EXPERIMENT)
    spans: list[dict] = []
    steps: list[dict] = []
    gaps: list[tuple] = []  # (Span in a_truth, kind, step, seconds)
    flops: dict[str, float] = {}
    gpu_time: dict[str, float] = {}

    def span(phase, a, b, step, gpu_idle=False):
        spans.append({"phase": phase, "start": a, "end": b, "step": step, "gpu_idle": gpu_idle})
        return a_truth.add_span(PROJECT, EXPERIMENT, phase, a, b)

    def gap(kind, sec, step):
        wl.sync()
        a = time.time()
        time.sleep(sec)
        b = time.time()
        gaps.append((span(f"idle:{kind}", a, b, step, True), kind, step, b - a))

    meta = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "argv": sys.argv[1:]}
    wall0, cpu0 = time.time(), sampler.cpu_s
    time.sleep(2.0)  # a quiet lead-in
    for step in range(1, args.steps + 1):
        timers: dict[str, float] = {}
        t_step = time.time()
        i = step - 1
        for phase in WORK_PHASES:
            if phase == "reward":
                gap("gen->reward", GEN_REWARD_GAPS[i % len(GEN_REWARD_GAPS)], step)
            if phase == "update_actor":
                gap("reward->actor", REWARD_ACTOR_GAPS[i % len(REWARD_ACTOR_GAPS)], step)
            wl.sync()
            a = time.time()
            f = wl.run(phase, step)
            wl.sync()
            b = time.time()
            span(phase, a, b, step, gpu_idle=phase == "reward" and step % 2 == 1)
            a_pushed.add_span(PROJECT, EXPERIMENT, phase, a, b)
            timers[f"timing_s/{phase}"] = b - a
            if f:
                flops[phase] = flops.get(phase, 0.0) + f
                gpu_time[phase] = gpu_time.get(phase, 0.0) + (b - a)
        gap("step_end", STEP_END_GAP, step)
        end = time.time()
        timers["timing_s/step"] = end - t_step
        steps.append({"step": step, "arrival": end, "timing": timers})
        rec = analyze_step(step, timers, end)
        a_pushed.on_step(run, rec)
        a_timing.on_step(run, rec)
    last_end = time.time()
    # Let the sampler drain past the last span, then stop it.
    deadline = time.time() + 15
    while time.time() < deadline:
        wm = [g.watermark for g in sampler.snapshot()]
        if wm and all(w is not None and w >= last_end for w in wm):
            break
        time.sleep(0.25)
    wall = time.time() - wall0
    cpu = sampler.cpu_s - cpu0
    sampler.stop()
    for a in (a_pushed, a_truth, a_timing):
        a.process()

    res = score(spans, gaps, a_pushed, a_timing)
    st = sampler.snapshot()
    dev = st[0] if st else None
    sil = identify(dev.name, dev.memory_total) if dev else None
    mfu = {ph: {"tflops_counted": flops[ph] / 1e12, "seconds": gpu_time[ph],
                "achieved_tflops": flops[ph] / gpu_time[ph] / 1e12,
                "mfu_vs_989": flops[ph] / gpu_time[ph] / 1e12 / H200_PEAK} for ph in flops}
    res.update({
        "device": wl.info(), "nvml_name": dev.name if dev else None,
        "nvml_memory_total_bytes": dev.memory_total if dev else None,
        "silicon": sil.silicon if sil else None, "silicon_peak_tflops": sil.peak if sil else None,
        "driver": getattr(backend, "driver", None), "threshold": args.threshold,
        "sampler": {"wall_s": wall, "thread_cpu_s": cpu, "cpu_share": cpu / wall if wall else None,
                    "polls": sampler.polls, "samples": len(raw),
                    "median_sample_spacing_s": _median_spacing(raw)},
        "mfu": mfu, "python": platform.python_version(), "steps": args.steps, "meta": meta,
    })
    (out / "gpu_idle_validation.json").write_text(json.dumps(res, indent=2))
    if args.results:
        record_result(Path(args.results), res, meta)
    fixture = {
        "source": "benchmarks/gpu_idle_validation.py", "gpu": res["nvml_name"], "driver": res["driver"],
        "torch": res["device"].get("torch"), "nvml_sample_type": "NVML_GPU_UTILIZATION_SAMPLES",
        "memory_total_bytes": res["nvml_memory_total_bytes"], "threshold": args.threshold,
        "samples_us": raw, "drain_sizes": drains, "spans": spans, "steps": steps,
        "note": "reward runs on the GPU in even steps and on the CPU (GPU idle) in odd steps; idle:* spans are sleeps",
        "results": {k: res[k] for k in ("per_phase", "per_gap_kind", "gaps")},
    }
    (out / "h200_idle_validation.nvml.json").write_text(json.dumps(fixture))
    print(json.dumps({k: res[k] for k in ("per_phase", "per_gap_kind", "shortest_gap_detected_s",
                                          "all_gaps_ge_0.5_detected", "pass", "sampler", "mfu")}, indent=1))
    return 0


RECORDED = ("per_phase", "per_gap_kind", "gaps", "shortest_gap_detected_s", "all_gaps_ge_0.5_detected", "pass",
            "sampler", "mfu", "device", "nvml_name", "nvml_memory_total_bytes", "silicon", "silicon_peak_tflops",
            "driver", "threshold")


def record_result(path: Path, res: dict, meta: dict) -> None:
    """Put this run under ``gpu_idle`` in a results.json, the other sections kept as they are."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        results = {}
    steps = res.get("steps") or max((g["step"] for g in res.get("gaps", [])), default=None)
    results["gpu_idle"] = {"steps": steps, **{k: res.get(k) for k in RECORDED},
                           "meta": {**meta, "section_wall_s": round(res["sampler"]["wall_s"], 1)}}
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def _median_spacing(raw):
    import statistics
    d = [(b[0] - a[0]) / 1e6 for a, b in zip(raw, raw[1:]) if b[0] > a[0]]
    return statistics.median(d) if d else None


if __name__ == "__main__":
    sys.exit(main())
