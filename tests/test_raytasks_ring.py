"""The Ray task-event ring persisted in --state-dir (discovery/taskring.py; issue 24 item 5): an exporter restart
continues the lanes, the holder and the straggler streaks; a corrupt, oversize or foreign ring is a counted skip
and the ledger starts empty. Ray's side: the state-API stand-in (rows shaped as recorded from Ray 2.60); the
end-to-end test runs the real ``omniwatch serve`` twice on one state dir, with the GPU replay on, and also reads
the per-fleet GPU time (gpu/fleet.py) from its /metrics."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from omniwatch.demo import standins as demo_endpoints
from omniwatch.demo import raytasks as dr
from omniwatch import names as n
from omniwatch.discovery import taskevents as te
from omniwatch.discovery import taskring as tr
from omniwatch.discovery.taskmetrics import lanes, straggler_streaks
from omniwatch.core.model import RunStore
from omniwatch.proc import free_port

RUN = ("demo", "ring")
BASE = 1_800_000_000.0 - 1_800_000_000.0 % (dr.CYCLE_S * dr.HANG_EVERY) + dr.CYCLE_S  # a normal step


def drive(led: te.TaskLedger, stand: dr.StateStandIn, t0: float, t1: float) -> float:
    now = t0
    while now < t1:
        led.apply(stand.running(now), [], now)
        now = round(now + 0.5, 6)
    return now


def fresh(stand) -> te.TaskLedger:
    led = te.TaskLedger(dispatch_gap_s=2.0)
    led.apply_actors(stand.actors)
    led.apply_nodes(stand.nodes)
    return led


def streak(led) -> dict:
    return {(s["role"], s["phase"]): s for s in straggler_streaks(led)}[("actor_rollout", "update_actor")]


def test_a_restored_ledger_continues_lanes_holder_and_streaks(tmp_path):
    stand = dr.StateStandIn()
    led = fresh(stand)
    # two normal steps, then into the held step (HANG_EVERY): rank 3's update_actor runs on after the others
    stop = BASE + 2 * dr.CYCLE_S + 8.0
    now = drive(led, stand, BASE, stop)
    before = {"holder": te.holder(led, now), "lanes": lanes(led, 64), "streak": streak(led),
              "running": set(led.running)}
    assert "3/4 ranks done" in before["holder"]["text"] and before["streak"]["streak"] >= 2
    ring = tr.TaskRing(tmp_path, RunStore(), lambda: RUN)
    assert ring.save(ring.snapshot(led, dr.JOB_ID))
    # the restart: a new ledger, restored from the file
    led2 = te.TaskLedger(dispatch_gap_s=2.0)
    assert tr.TaskRing(tmp_path, RunStore(), lambda: RUN).load(led2, dr.JOB_ID) > 0
    assert set(led2.running) == before["running"]
    assert te.holder(led2, now) == before["holder"]       # the same one-line answer, the same age
    assert lanes(led2, 64) == before["lanes"]
    assert streak(led2) == before["streak"]
    # polling on: the held rank is still one call of the same dispatch (3/4 done survives), the streak goes on
    led2.apply(stand.running(now), [], now)
    assert "3/4 ranks done" in te.holder(led2, now)["text"]
    end = drive(led2, stand, now, BASE + 5 * dr.CYCLE_S)
    led3 = fresh(stand)   # what an exporter without the ring would know by then
    drive(led3, stand, now, end)
    assert streak(led2)["streak"] > streak(led3)["streak"]
    assert len(led2.done) > len(led3.done)


def test_the_ring_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "MAX_TASKS", 40)
    stand = dr.StateStandIn()
    led = fresh(stand)
    drive(led, stand, BASE, BASE + 6 * dr.CYCLE_S)
    doc = tr.to_json(led, dr.JOB_ID, RUN)
    assert len(led.done) > 40 and len(doc["tasks"]) <= 40
    led2 = te.TaskLedger()
    assert tr.restore(led2, json.loads(orjson.dumps(doc))) == len(doc["tasks"])


@pytest.mark.parametrize("content, reason", [
    (b"{not json", "corrupt_ring"),
    (orjson.dumps({"version": tr.VERSION, "tasks": [[1, 2, 3]], "dispatches": [], "running": [], "actors": [],
                   "nodes": {}}), "corrupt_ring"),
    (orjson.dumps({"version": tr.VERSION, "job_id": dr.JOB_ID, "run": list(RUN), "tasks": [],
                   "dispatches": [["g", "actor", "update_actor", "update_actor", 1.0, [7]]], "running": [],
                   "actors": [], "nodes": {}}), "corrupt_ring"),   # a reference to a call that is not there
    (orjson.dumps({"version": 99}), "corrupt_ring"),
    (orjson.dumps([1, 2]), "corrupt_ring"),
])
def test_a_bad_ring_is_set_aside_counted_and_nothing_is_restored(tmp_path, content, reason):
    (tmp_path / tr.FILENAME).write_bytes(content)
    store = RunStore()
    led = te.TaskLedger()
    assert tr.TaskRing(tmp_path, store, lambda: RUN).load(led, dr.JOB_ID) == 0
    assert store.errors[(tr.SOURCE, reason)] == 1
    assert not led.running and not led.done and not led.dispatches and not led.actors
    assert not (tmp_path / tr.FILENAME).exists() and (tmp_path / (tr.FILENAME + ".corrupt")).read_bytes() == content


def test_an_oversize_or_foreign_ring_is_a_counted_skip(tmp_path, monkeypatch):
    stand = dr.StateStandIn()
    led = fresh(stand)
    drive(led, stand, BASE, BASE + 8.0)
    ring = tr.TaskRing(tmp_path, RunStore(), lambda: RUN)
    ring.save(ring.snapshot(led, dr.JOB_ID))
    store = RunStore()
    other = tr.TaskRing(tmp_path, store, lambda: ("demo", "another-run"))
    assert other.load(te.TaskLedger(), dr.JOB_ID) == 0 and store.errors[(tr.SOURCE, "ring_other_run")] == 1
    assert tr.TaskRing(tmp_path, store, lambda: RUN).load(te.TaskLedger(), "02000000") == 0
    assert store.errors[(tr.SOURCE, "ring_other_run")] == 2 and (tmp_path / tr.FILENAME).exists()
    monkeypatch.setattr(tr, "MAX_BYTES", 100)
    assert tr.TaskRing(tmp_path, store, lambda: RUN).load(te.TaskLedger(), dr.JOB_ID) == 0
    assert store.errors[(tr.SOURCE, "oversize_ring")] == 1 and (tmp_path / (tr.FILENAME + ".corrupt")).exists()


def test_a_failed_ring_write_is_counted_and_serving_goes_on(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / tr.FILENAME).mkdir()   # the target is a directory: the rename fails
    store = RunStore()
    ring = tr.TaskRing(ro, store, lambda: RUN)
    assert ring.save(ring.snapshot(te.TaskLedger(), dr.JOB_ID)) is False
    assert store.errors[(tr.SOURCE, "ring_write_failed")] == 1


# --- end to end: the real exporter, restarted ----------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


def scrape(url: str) -> list[tuple[str, dict, float]]:
    out = []
    for ln in httpx.get(url + "/metrics", timeout=10, trust_env=False).text.splitlines():
        m = _SAMPLE.match(ln)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")), float(m.group(3))))
    return out


def value(samples, name, **want) -> float | None:
    vs = [v for nm, lv, v in samples if nm == name and all(lv.get(k) == x for k, x in want.items())]
    return max(vs) if vs else None


def wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
        except httpx.HTTPError:
            v = None
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"timed out: {what}")


def serve(tmp_path: Path, state: Path, ray_port: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(tmp_path / f"serve-{port}.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{port}",
                          "--state-dir", str(state), "--gpu", "replay:", "--gpu-node", "127.0.0.1",
                          *demo_endpoints.ray_tasks_args("127.0.0.1", ray_port, *RUN)],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env={**os.environ, "RAY_ADDRESS": ""})
    url = f"http://127.0.0.1:{port}"
    wait(lambda: p.poll() is None and httpx.get(url + "/healthz", timeout=1, trust_env=False).status_code == 200,
         60, "omniwatch serve up")
    return p, url


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_restarted_exporter_continues_the_streak_and_fleet_time_is_in_metrics(tmp_path):
    server, ray_port = demo_endpoints.start()
    state = tmp_path / "state"
    procs = []
    try:
        p, url = serve(tmp_path, state, ray_port)
        procs.append(p)
        STREAK = n.RAY_STRAGGLER_STREAK
        before = wait(lambda: (lambda v: v if v and v >= 2 else None)(
            value(scrape(url), STREAK, phase="update_actor", rank=str(dr.SLOW_RANK))), 120, "a straggler streak of 2")
        # per-fleet GPU time from the same exporter: the replayed GPU 0 is rank 0's by placement, the replica's
        # generate calls charge it by node
        fleet = n.GPU_FLEET_SECONDS_TOTAL
        s = wait(lambda: (lambda sm: sm if value(sm, fleet, fleet="actor", mapping="placement")
                          and value(sm, fleet, fleet="rollout", phase="generate", mapping="node") else None)(scrape(url)),
                 60, "fleet seconds for actor (placement) and rollout (node)")
        assert value(s, n.GPU_FLEET_GPUS, fleet="actor", mapping="placement") == 1
        assert all(lv["bucket"] in ("productive", "overhead", "idle") for nm, lv, _ in s if nm == fleet)
        stop(p)
        assert (state / tr.FILENAME).exists()
        p2, url2 = serve(tmp_path, state, ray_port)
        procs.append(p2)
        # the first scrape after the first poll already has the streak (a fresh ledger has none until a dispatch
        # finishes: update_actor ends > 5.6 s into a 10 s step)
        first = wait(lambda: (lambda sm: sm if (value(sm, n.RAY_TASK_POLLS_TOTAL) or 0) >= 1 else None)(scrape(url2)),
                     30, "a first poll")
        assert (value(first, STREAK, phase="update_actor", rank=str(dr.SLOW_RANK)) or 0) >= before
        logs = "".join(f.read_text(errors="replace") for f in tmp_path.glob("serve-*.log"))
        assert "restored" in logs and "Ray worker calls" in logs
        stop(p2)
        # a corrupt ring: counted, set aside, the exporter serves
        (state / tr.FILENAME).write_bytes(b"\x00garbage")
        p3, url3 = serve(tmp_path, state, ray_port)
        procs.append(p3)
        assert value(scrape(url3), n.INGEST_ERRORS, source=tr.SOURCE, reason="corrupt_ring") == 1
        assert (state / (tr.FILENAME + ".corrupt")).exists()
    finally:
        for p in procs:
            stop(p)
        demo_endpoints.stop(server)
