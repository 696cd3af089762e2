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

from ..analytics import K_STEP, TIMING, analyze_step
from .attribution import INTER_STAGE, Attributor
from .devices import TraceBackend, TraceDevice, chunked
from .sampler import GpuSampler
from ..model import RunStore
from ..parse import ParsedStep

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



def _idle_truth(spans: list[dict]) -> list[tuple[float, float]]:
    """The workload's own GPU-idle intervals (sleeps and spans it marks ``gpu_idle``), merged."""
    out: list[list[float]] = []
    for a, b in sorted((s["start"], s["end"]) for s in spans if s["gpu_idle"]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(ivs: list[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in ivs)


def replay_steps(fx: dict, mode: str = "pushed", threshold: float = 50.0, window: int = 3) -> dict:
    """Replay a trace as a live exporter sees it and follow the GPU inter-stage window step by step.

    Steps go through a real ``RunStore`` (so warm-up and the other flags apply) at their arrival
    time, interleaved with the sampler's drains (a drain is polled once its newest sample is older
    than the arrival), with the workload's spans pushed first (``mode="pushed"``) or not at all
    (``mode="timing"``: the attributor lays the step out from its timings). Returns ``{"rows": [...],
    "attributor", "store"}``; one row per step: ``step``, ``normal``, ``gpu_ratio`` (the GPU
    inter-stage idle ratio the attributor computed, ``StepWindow.inter_stage_ratio``), ``truth_ratio``
    (the same quantity from the workload's own idle intervals instead of the samples), ``gap_ratio``
    (the step's sleeps / step seconds: what the trainer really lost), ``timer_ratio`` (the exporter's
    untracked ratio) and ``window`` (the GPU min/median/max published once the step was attributed,
    or None).
    """
    if mode not in ("pushed", "timing"):
        raise ValueError("mode is pushed or timing")
    data = normalize(fx)
    chunks = _chunks(data["samples"], data["drains"])
    dev = TraceDevice(0, "GPU-replay", fx.get("gpu") or "NVIDIA H200", chunks,
                      memory_total=fx.get("memory_total_bytes") or 0)
    store = RunStore(window=window)
    sampler = GpuSampler(TraceBackend([dev]), store, node="replay", threshold=threshold)
    attr = Attributor(sampler, store)
    store.listeners.append(attr.on_step)
    idle = _idle_truth(data["spans"])
    by_step: dict[int, list] = {}
    for s in data["spans"]:
        by_step.setdefault(s["step"], []).append(s)

    def drain_until(t: float) -> None:
        while dev.chunks and (not dev.chunks[0] or dev.chunks[0][-1][0] <= t * 1e6):
            sampler.poll_once()

    closed: dict[int, dict] = {}
    attr.inter_stage.listeners.append(
        lambda run, step, ratio: closed.__setitem__(step, {"gpu_ratio": ratio, "window": attr.inter_stage.stats(run)}))
    rows = []
    for st in data["steps"]:
        drain_until(st["arrival"])
        if mode == "pushed":
            for s in by_step.get(st["step"], []):
                if not s["phase"].startswith("idle:"):
                    attr.add_span(PROJECT, EXPERIMENT, s["phase"], s["start"], s["end"])
        rec = store.ingest(PROJECT, EXPERIMENT, ParsedStep(st["step"], dict(st["timing"])), "replay",
                           arrival=st["arrival"])
        with attr.lock:
            w = attr.windows[-1] if attr.windows and attr.windows[-1].step == st["step"] else None
            spans = [(s.start, s.end, s.phase) for s in (w.spans if w else [])]
        sleeps = sum(s["end"] - s["start"] for s in by_step.get(st["step"], []) if s["phase"].startswith("idle:"))
        dur = rec.duration or 0.0
        if mode == "pushed":  # the workload's idle inside the inter_stage gaps
            truth = sum(_overlap(idle, a, b) for a, b, ph in spans if ph == INTER_STAGE)
        else:  # the untimed seconds, capped by the workload's idle over the laid-out step
            truth = min(w.untracked or 0.0, sum(_overlap(idle, a, b) for a, b, _ in spans)) if w else 0.0
        rows.append({"step": st["step"], "normal": rec.normal, "timer_ratio": rec.idle_ratio,
                     "gap_ratio": sleeps / dur if dur else None, "truth_ratio": truth / dur if dur else None})
    drain_until(float("inf"))
    sampler.poll_once()
    for row in rows:
        row.update(closed.get(row["step"], {"gpu_ratio": None, "window": None}))
    return {"rows": rows, "attributor": attr, "store": store}
