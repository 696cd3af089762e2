"""Phase attribution: the step-timing layout, pushed spans winning over it, the /api/v1/phases
endpoint (token, bad input) and the trainer client end to end against a real server on loopback."""
import threading
import time
from collections import deque
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi.testclient import TestClient

from omniwatch.core.analytics import analyze_step
from omniwatch.app import create_app
from omniwatch.client import Client
from omniwatch.core.exposition import make_registry
from omniwatch.gpu.attribution import INTER_STAGE, MAX_OPEN_SPANS_PER_RUN, Attributor
from omniwatch.gpu.devices import TraceBackend, TraceDevice
from omniwatch.gpu.sampler import GpuSampler
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep
from omniwatch.settings import Settings
from tests.conftest import free_port, wait_for

S = 1_000_000
TOKEN = "phase-push-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def trace(t0, t1, idle=()):
    """Samples every 0.2 s over [t0, t1]; busy except inside the (a, b) windows of ``idle``."""
    out, t = [], t0
    while t <= t1 + 1e-9:
        busy = not any(a < t <= b + 1e-9 for a, b in idle)
        out.append((int(round(t * S)), 100 if busy else 0))
        t = round(t + 0.2, 6)
    return out


def rig(samples, store=None):
    dev = TraceDevice(0, "GPU-1", "NVIDIA H200", deque([samples]), memory_total=143771 << 20)
    s = GpuSampler(TraceBackend([dev]), store, node="n")
    return s, Attributor(s, store)


RUN = SimpleNamespace(project="p", experiment="e")


def test_timing_layout_puts_untracked_between_reward_and_actor():
    # step 100..120: gen 100-108, reward 108-110, [untracked 110-114 idle], old_log_prob 114-116, update_actor 116-120
    s, a = rig(trace(99.0, 121.0, idle=[(110.0, 114.0)]))
    rec = analyze_step(1, {"timing_s/step": 20.0, "timing_s/gen": 8.0, "timing_s/reward": 2.0,
                           "timing_s/old_log_prob": 2.0, "timing_s/update_actor": 4.0}, 120.0)
    a.on_step(RUN, rec)
    s.poll_once()
    t = a.phase_totals("p", "e")
    assert t[INTER_STAGE][1] == pytest.approx(4.0, abs=0.01)
    assert t["gen"][1] == pytest.approx(0.0, abs=0.01) and t["update_actor"][0] == pytest.approx(4.0, abs=0.01)
    step, ratios = a.ratios[("p", "e")]
    assert step == 1 and ratios[INTER_STAGE] == pytest.approx(1.0) and ratios["gen"] == pytest.approx(0.0)


def test_pushed_spans_win_and_gaps_become_inter_stage():
    # The real idle is 104-106 (between gen and reward); timings alone would charge it elsewhere.
    s, a = rig(trace(99.0, 115.0, idle=[(104.0, 106.0)]))
    a.add_span("p", "e", "gen", 100.0, 104.0)
    a.add_span("p", "e", "reward", 106.0, 108.0)
    a.add_span("p", "e", "update_actor", 108.0, 114.0)
    a.on_step(RUN, analyze_step(1, {"timing_s/step": 14.0, "timing_s/gen": 4.0, "timing_s/reward": 2.0,
                                    "timing_s/update_actor": 6.0}, 114.2))
    s.poll_once()
    t = a.phase_totals("p", "e")
    assert t[INTER_STAGE] == pytest.approx((0.0, 2.0), abs=0.01)
    assert t["gen"][1] == pytest.approx(0.0, abs=0.01) and t["reward"][1] == pytest.approx(0.0, abs=0.01)
    assert set(t) == {"gen", "reward", "update_actor", INTER_STAGE}  # no timing-layout spans were added


def test_catch_up_burst_of_steps_does_not_claim_time_twice():
    s, a = rig(trace(99.0, 121.0))
    for step in (1, 2, 3):  # three steps read at once from a file: same arrival
        a.on_step(RUN, analyze_step(step, {"timing_s/step": 10.0, "timing_s/gen": 10.0}, 120.0))
    s.poll_once()
    busy, idle = a.phase_totals("p", "e")["gen"]
    assert busy + idle == pytest.approx(10.0, abs=0.01)


def test_open_spans_are_bounded():
    s, a = rig(trace(99.0, 100.0))
    for i in range(MAX_OPEN_SPANS_PER_RUN + 10):
        a.add_span("p", "e", "gen", 100.0 + i, 100.5 + i)
    assert len(a.open_spans[("p", "e")]) == MAX_OPEN_SPANS_PER_RUN


def test_spans_older_than_the_ring_are_skipped_and_counted():
    store = RunStore()
    s, a = rig(trace(500.0, 510.0), store)
    a.add_span("p", "e", "gen", 100.0, 104.0)
    s.poll_once()
    assert store.errors[("gpu_attribution", "span_before_samples")] == 1
    assert not a.pending


# --- the HTTP endpoint --------------------------------------------------------------------------------
def build_app(samples=(), token=TOKEN):
    store = RunStore()
    dev = TraceDevice(0, "GPU-1", "NVIDIA H200", deque([list(samples)]), memory_total=143771 << 20)
    settings = Settings(push_token=token, extra={"gpu": "on", "gpu_backend": TraceBackend([dev]), "gpu_node": "n"})
    app = create_app(store, make_registry(store), settings)
    return app, store


def test_phase_endpoint_accepts_spans_and_attributes_them():
    now = time.time()
    app, store = build_app(trace(round(now) - 10.0, round(now) + 0.0, idle=[(now - 6, now - 4)]))
    c = TestClient(app)  # no lifespan: the test drives the sampler
    r = c.post("/api/v1/phases", headers=AUTH, json={"spans": [
        {"project": "p", "experiment": "e", "phase": "gen", "start": now - 8, "end": now - 6},
        {"project": "p", "experiment": "e", "phase": "reward", "start": now - 6, "end": now - 4}]})
    assert r.status_code == 200 and r.json() == {"accepted": 2, "attributed": True}
    app.state.gpu.sampler.poll_once()
    text = c.get("/metrics").text
    line = [ln for ln in text.splitlines() if ln.startswith("omniwatch_gpu_phase_idle_seconds_total") and 'phase="reward"' in ln]
    assert line and float(line[0].split()[-1]) == pytest.approx(2.0, abs=0.25)
    info = c.get("/api/v1/gpu").json()
    assert info["gpus"][0]["uuid"] == "GPU-1" and info["peak_tflops"] == 989.0
    assert TOKEN not in text and TOKEN not in str(info)


@pytest.mark.parametrize("body,status", [
    ({"project": "p", "experiment": "e", "phase": "gen", "start": 10.0, "end": 5.0}, 400),
    ({"project": "p", "experiment": "e", "phase": "bad phase!", "start": 1.0, "end": 2.0}, 400),
    ({"project": "p", "experiment": "e", "phase": "gen", "start": 1.0, "end": 1e12}, 400),
    ({"project": "p", "experiment": "e", "phase": "gen", "start": "x", "end": 2.0}, 422),
    ({"project": "p", "phase": "gen", "start": 1.0, "end": 2.0}, 422),
    ({"spans": [{"project": "p"}] * 2}, 422),
    ([1, 2, 3], 422),
])
def test_bad_spans_are_clear_4xx(body, status):
    app, store = build_app()
    c = TestClient(app)
    r = c.post("/api/v1/phases", headers=AUTH, json=body)
    assert r.status_code == status, r.text
    assert c.post("/api/v1/phases", headers=AUTH, content=b"{not json").status_code == 400


def test_phase_endpoint_needs_the_push_token():
    app, _ = build_app()
    c = TestClient(app)
    body = {"project": "p", "experiment": "e", "phase": "gen", "start": 1.0, "end": 2.0}
    assert c.post("/api/v1/phases", json=body).status_code == 401
    assert c.post("/api/v1/phases", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    app2, _ = build_app(token=None)
    assert TestClient(app2).post("/api/v1/phases", json=body, headers=AUTH).status_code == 403


def test_client_pushes_spans_to_a_real_server_and_survives_a_dead_one():
    now = time.time()
    app, store = build_app(trace(round(now) - 5.0, round(now) + 30.0))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        wait_for(lambda: server.started, 20, what="uvicorn")
        cl = Client(url=f"http://127.0.0.1:{port}", token=TOKEN)
        with cl.phase("gen", project="p", experiment="e"):
            time.sleep(0.05)
        assert cl.flush(10) and cl.sent == 1
        att = app.state.gpu.attributor
        assert [sp.phase for sp in att.open_spans[("p", "e")]] == ["gen"]
    finally:
        server.should_exit = True
        th.join(10)
    # never blocks the trainer: the phase ends while its delivery is still held (the sender's POST waits on a gate
    # the test opens only afterwards), then the POST to a dead exporter fails and the span is dropped, counted
    dead = Client(url=f"http://127.0.0.1:{free_port()}", token=TOKEN, timeout=0.5)
    gate, posting, post = threading.Event(), threading.Event(), dead._post
    dead._post = lambda spans: (posting.set(), gate.wait(30), post(spans))[-1]
    with dead.phase("gen", project="p", experiment="e"):
        pass
    assert posting.wait(10) and dead.q.unfinished_tasks == 1 and dead.sent == dead.dropped == 0
    gate.set()
    assert dead.flush(10) and dead.dropped == 1


# --- the GPU inter-stage idle window --------------------------------------------------------------------
STEP_S = 20.0
TIMINGS = {"timing_s/step": STEP_S, "timing_s/gen": 8.0, "timing_s/reward": 2.0,
           "timing_s/old_log_prob": 2.0, "timing_s/update_actor": 4.0}  # 4 s untimed


def step_start(i):
    return 100.0 + STEP_S * (i - 1)


def gap(i):
    """Where the timing layout puts step i's 4 untimed seconds: after gen + reward."""
    return (step_start(i) + 10.0, step_start(i) + 14.0)


def window_rig(chunks_per_gpu, k=1, warmup=0, clock=None):
    """Sampler over one scripted device per GPU, a RunStore with window k feeding the attributor."""
    store = RunStore(window=k, warmup=warmup, **({"clock": clock} if clock else {}))
    devs = [TraceDevice(i, f"GPU-{i}", "NVIDIA H200", deque(ch), memory_total=143771 << 20)
            for i, ch in enumerate(chunks_per_gpu)]
    s = GpuSampler(TraceBackend(devs), store, node="n")
    a = Attributor(s, store)
    store.listeners.append(a.on_step)
    return store, s, a


def ingest(store, i, values=TIMINGS):
    return store.ingest("p", "e", ParsedStep(i, dict(values)), "test", arrival=step_start(i) + STEP_S)


def test_window_averages_over_the_run_gpus():
    # GPU 0 idles through the untimed 4 s, GPU 1 keeps working: 2 s of 20 on average.
    store, s, a = window_rig([[trace(99.0, 121.0, idle=[gap(1)])], [trace(99.0, 121.0)]])
    ingest(store, 1)
    s.poll_once()
    assert a.inter_stage_windows()[("p", "e")] == pytest.approx({"min": 0.1, "median": 0.1, "max": 0.1}, abs=0.01)


def test_pushed_spans_measure_the_gaps_exactly():
    store, s, a = window_rig([[trace(99.0, 121.0, idle=[(104.0, 106.0)])]])
    for ph, t0, t1 in (("gen", 100.0, 104.0), ("reward", 106.0, 108.0), ("update_actor", 108.0, 120.0)):
        a.add_span("p", "e", ph, t0, t1)
    ingest(store, 1, {"timing_s/step": 20.0, "timing_s/gen": 4.0, "timing_s/reward": 2.0, "timing_s/update_actor": 12.0})
    s.poll_once()
    assert a.inter_stage_windows()[("p", "e")]["min"] == pytest.approx(2.0 / 20.0, abs=0.01)


def test_window_waits_for_k_normal_steps_and_skips_flagged_ones():
    end = step_start(5) + STEP_S + 1
    store, s, a = window_rig([[trace(99.0, end, idle=[gap(i) for i in range(1, 6)])]], k=2, warmup=1)
    ingest(store, 1)                                             # warm-up
    ingest(store, 2)
    ingest(store, 3, dict(TIMINGS, **{"val-core/acc": 0.5}))     # validation step: left out, no hole
    s.poll_once()
    assert a.inter_stage_windows() == {}                         # one normal step so far
    ingest(store, 4)
    s.poll_once()
    assert a.inter_stage_windows()[("p", "e")]["min"] == pytest.approx(0.2, abs=0.01)
    assert [st for st, _ in a.inter_stage.runs[("p", "e")].steps] == [2, 4]


def test_withheld_while_steps_await_samples_then_caught_up():
    store, s, a = window_rig([[trace(99.0, 121.0, idle=[gap(1)])]], k=1)
    ingest(store, 1)
    s.poll_once()
    assert a.inter_stage_windows()[("p", "e")]["min"] == pytest.approx(0.2, abs=0.01)
    ingest(store, 2)                                             # no sample covers step 2 yet
    s.poll_once()
    assert a.inter_stage_windows() == {}                         # k steps waiting: not the latest steps
    s.devices[0][0].chunks.append(trace(121.2, 141.0))           # step 2 arrives, GPUs busy throughout
    s.poll_once()
    assert a.inter_stage_windows()[("p", "e")]["max"] == pytest.approx(0.0, abs=0.01)


def test_unmeasurable_normal_step_empties_the_window():
    end = step_start(4) + STEP_S + 1
    store, s, a = window_rig([[trace(99.0, end, idle=[gap(i) for i in range(1, 5)])]], k=2)
    ingest(store, 1)
    ingest(store, 2)
    s.poll_once()
    assert ("p", "e") in a.inter_stage_windows()
    ingest(store, 3, {k: v for k, v in TIMINGS.items() if k != "timing_s/step"})  # step seconds unknown
    s.poll_once()
    assert a.inter_stage_windows() == {}
    ingest(store, 4)
    s.poll_once()
    assert a.inter_stage_windows() == {}                         # one measured step since the hole
    assert [st for st, _ in a.inter_stage.runs[("p", "e")].steps] == [4]


def test_spans_no_local_gpu_measured_are_counted_not_evidence():
    store, s, a = window_rig([[trace(99.0, 121.0)]], k=1)
    a.add_span("p", "e", "gen", 100.0, 110.0, gpus=frozenset({"7"}))  # a GPU on another node
    a.add_span("p", "e", "update_actor", 112.0, 120.0, gpus=frozenset({"7"}))
    ingest(store, 1)
    s.poll_once()
    assert a.inter_stage_windows() == {}
    assert store.errors[("gpu_attribution", "step_unmeasured")] == 1


def test_catch_up_burst_is_not_gpu_evidence():
    store, s, a = window_rig([[trace(99.0, 161.0)]], k=1)
    ingest(store, 1)
    for i in (2, 3):  # read late in one burst: both stamped with step 3's arrival
        store.ingest("p", "e", ParsedStep(i, dict(TIMINGS)), "test", arrival=step_start(3) + STEP_S)
    s.poll_once()
    assert a.inter_stage_windows() == {}


def test_trainer_restart_forgets_the_abandoned_steps():
    from omniwatch.gpu.window import InterStageWindows
    w = InterStageWindows(k=3)
    run = ("p", "e")
    for step, r in ((10, 0.2), (11, 0.3), (12, 0.4)):
        w.opened(run)
        w.closed(run, step, True, r)
    assert w.stats(run) == {"min": 0.2, "median": 0.3, "max": 0.4}
    w.opened(run)
    w.closed(run, 11, True, 0.5)                                 # resumed from step 11
    assert [s for s, _ in w.runs[run].steps] == [10, 11] and w.stats(run) is None


def test_runs_are_bounded():
    from omniwatch.gpu.window import InterStageWindows
    w = InterStageWindows(k=1, max_runs=2)
    for i in range(3):
        w.opened(("p", str(i)))
        w.closed(("p", str(i)), 1, True, 0.5)
    assert set(w.all_stats()) == {("p", "1"), ("p", "2")}
    with pytest.raises(ValueError):
        InterStageWindows(k=0)


def test_window_is_exposed_for_live_runs_only_and_passes_promtool():
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from omniwatch import names
    from omniwatch.gpu.collector import GpuCollector
    now = [step_start(2) + STEP_S]
    store, s, a = window_rig([[trace(99.0, 141.0, idle=[gap(1), gap(2)])]], k=1, clock=lambda: now[0])
    ingest(store, 1)
    ingest(store, 2)
    s.poll_once()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(s, a, store))
    text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(names.GPU_INTER_STAGE_IDLE_WINDOW + "{")]
    assert sorted(ln.split('stat="')[1].split('"')[0] for ln in lines) == ["max", "median", "min"]
    assert all(float(ln.split()[-1]) == pytest.approx(0.2, abs=0.01) for ln in lines)
    promtool = shutil.which("promtool")
    if promtool is not None:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    now[0] += max(store.run_expiry, store.stalled_expiry) + 1    # the run ended long ago (any expiry)
    assert names.GPU_INTER_STAGE_IDLE_WINDOW + "{" not in generate_latest(reg).decode()


@pytest.mark.parametrize("backend,extra,published", [
    ("trace", {}, True),
    ("replay", {}, False),                                   # replayed GPUs run none of the watched runs
    ("replay", {"gpu_inter_stage_evidence": "on"}, True),
    ("trace", {"gpu_inter_stage_evidence": "off"}, False),
])
def test_inter_stage_evidence_option(backend, extra, published):
    from omniwatch.gpu import loop
    be = loop.replay_backend(loop.DEFAULT_TRACE) if backend == "replay" else \
        TraceBackend([TraceDevice(0, "GPU-1", "NVIDIA H200", deque(), memory_total=1)])
    store = RunStore(window=1)
    settings = Settings(push_token=TOKEN, extra={"gpu": "on", "gpu_backend": be, "gpu_node": "n", **extra})
    app = create_app(store, make_registry(store), settings)
    a = app.state.gpu.attributor
    a.inter_stage.opened(("p", "e"))
    a.inter_stage.closed(("p", "e"), 1, True, 0.4)
    assert (a.inter_stage_windows() != {}) is published
