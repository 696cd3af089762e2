"""Replay a recorded NVML trace (samples + the workload's own spans) through the real sampler and
attribution code, and score the result against the spans' ground truth.

Used by the CI tests (no GPU there) and by ``benchmarks/gpu_idle_validation.py`` (which scores its
live run with the same :func:`score`). Two fixture layouts are read:
``tests/fixtures/gpu/*.nvml.json`` (``samples_us`` integer microseconds, spans with ``step`` and
``gpu_idle``) and the shared ``h200_flowgrpo_shaped.nvml.json`` (``samples`` in float seconds; steps
start at each ``gen``; reward runs on the CPU in odd 0-based steps).
"""
from __future__ import annotations

from types import SimpleNamespace

from ..core.analytics import K_STEP, TIMING, analyze_step
from .attribution import INTER_STAGE, Attributor
from .devices import TraceBackend, TraceDevice, chunked
from .sampler import GpuSampler

PROJECT, EXPERIMENT = "replay", "trace"


def normalize(fx: dict) -> dict:
    """-> {"samples": [(us, util)], "spans": [{phase, start, end, step, gpu_idle}], "steps": [...]}."""
    if "samples_us" in fx:
        samples = [(int(t), int(u)) for t, u in fx["samples_us"]]
        spans = [dict(s) for s in fx["spans"]]
    else:
        samples = [(int(round(t * 1e6)), int(u)) for t, u in fx["samples"]]
        spans, step = [], -1
        for s in fx["spans"]:
            if s["phase"] == "gen":
                step += 1
            spans.append(dict(s, step=step))
    for s in spans:
        if "gpu_idle" not in s:
            s["gpu_idle"] = s["phase"].startswith("idle:") or (s["phase"] == "reward" and s["step"] % 2 == 1
                                                               and "samples_us" not in fx)
    steps = fx.get("steps") or _steps_from_spans(spans)
    return {"samples": samples, "spans": spans, "steps": steps, "drains": fx.get("drain_sizes")}


def _steps_from_spans(spans):
    out: dict[int, dict] = {}
    for s in spans:
        st = out.setdefault(s["step"], {"step": s["step"], "start": s["start"], "arrival": s["end"], "timing": {}})
        st["arrival"] = max(st["arrival"], s["end"])
        if not s["phase"].startswith("idle:"):
            k = TIMING + s["phase"]
            st["timing"][k] = st["timing"].get(k, 0.0) + s["end"] - s["start"]
    for st in out.values():
        st["timing"][K_STEP] = st["arrival"] - st.pop("start")
    return [out[k] for k in sorted(out)]


def _chunks(samples, drains):
    if drains and sum(drains) == len(samples):
        from collections import deque
        out, i = deque(), 0
        for n in drains:
            out.append(samples[i:i + n])
            i += n
        return out
    return chunked(samples, 1_000_000)


def replay(fx: dict, threshold: float = 50.0, store=None) -> dict:
    """Run the fixture through sampler + three attributors; return :func:`score`'s dict."""
    data = normalize(fx)
    dev = TraceDevice(0, "GPU-replay", fx.get("gpu") or "NVIDIA H200", _chunks(data["samples"], data["drains"]),
                      memory_total=fx.get("memory_total_bytes") or 0)
    sampler = GpuSampler(TraceBackend([dev]), store, node="replay", threshold=threshold)
    pushed, truth, timing = Attributor(sampler, store), Attributor(sampler, store), Attributor(sampler, store)
    run = SimpleNamespace(project=PROJECT, experiment=EXPERIMENT)
    gaps = []
    by_step: dict[int, list] = {}
    for s in data["spans"]:
        by_step.setdefault(s["step"], []).append(s)
    for st in data["steps"]:
        for s in by_step.get(st["step"], []):
            sp = truth.add_span(PROJECT, EXPERIMENT, s["phase"], s["start"], s["end"])
            if s["phase"].startswith("idle:"):
                gaps.append((sp, s["phase"][5:], s["step"], s["end"] - s["start"]))
            else:
                pushed.add_span(PROJECT, EXPERIMENT, s["phase"], s["start"], s["end"])
        rec = analyze_step(st["step"], st["timing"], st["arrival"])
        pushed.on_step(run, rec)
        timing.on_step(run, rec)
    while dev.chunks:
        sampler.poll_once()
    sampler.poll_once()
    out = score(data["spans"], gaps, pushed, timing)
    out["sampler"] = sampler
    return out


def truth_idle(spans: list[dict]) -> dict[str, float]:
    """Ground-truth idle seconds per phase of the pushed path: sleeps are ``inter_stage`` (except the
    last step's tail, which no later span closes); spans marked ``gpu_idle`` idle the GPU; all other
    work keeps it busy."""
    out: dict[str, float] = {s["phase"]: 0.0 for s in spans if not s["phase"].startswith("idle:")}
    out[INTER_STAGE] = 0.0
    last = max(s["step"] for s in spans)
    for s in spans:
        d = s["end"] - s["start"]
        if s["phase"].startswith("idle:"):
            if not (s["phase"] == "idle:step_end" and s["step"] == last):
                out[INTER_STAGE] += d
        elif s["gpu_idle"]:
            out[s["phase"]] += d
    return out


def within(measured: float, truth: float) -> bool:
    """The validation target: within 5 % or 0.3 s of the truth."""
    return abs(measured - truth) <= max(0.05 * truth, 0.3)


def score(spans, gaps, pushed: Attributor, timing: Attributor | None = None,
          project: str = PROJECT, experiment: str = EXPERIMENT) -> dict:
    """Measured vs true idle per phase (pushed path; timing layout alongside) and per gap kind."""
    truth = truth_idle(spans)
    got = pushed.phase_totals(project, experiment)
    tim = timing.phase_totals(project, experiment) if timing else {}
    per_phase = {}
    for ph, t in truth.items():
        m = got.get(ph, (0.0, 0.0))[1]
        per_phase[ph] = {"truth_idle_s": round(t, 3), "measured_idle_s": round(m, 3), "error_s": round(m - t, 3),
                         "error_pct": round(100 * (m - t) / t, 2) if t else None, "within_target": within(m, t),
                         "timing_layout_idle_s": round(tim.get(ph, (0.0, 0.0))[1], 3)}
    kinds: dict[str, list[float]] = {}
    rows = []
    for sp, kind, step, sec in gaps:
        k = kinds.setdefault(kind, [0.0, 0.0])
        k[0] += sec
        k[1] += sp.idle
        rows.append({"kind": kind, "step": step, "seconds": round(sec, 3), "measured_idle_s": round(sp.idle, 3),
                     "detected": sp.idle >= 0.5 * sec})
    per_kind = {k: {"truth_idle_s": round(t, 3), "measured_idle_s": round(m, 3), "error_s": round(m - t, 3),
                    "error_pct": round(100 * (m - t) / t, 2) if t else None, "within_target": within(m, t)}
                for k, (t, m) in kinds.items()}
    detected = [r["seconds"] for r in rows if r["detected"]]
    big_ok = all(r["detected"] for r in rows if r["seconds"] >= 0.5)
    return {"per_phase": per_phase, "per_gap_kind": per_kind, "gaps": rows,
            "shortest_gap_detected_s": min(detected) if detected else None,
            "all_gaps_ge_0.5_detected": big_ok,
            "pass": big_ok and all(v["within_target"] for v in per_phase.values())
            and all(v["within_target"] for v in per_kind.values())}
