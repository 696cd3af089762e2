"""Issue 35 (hardening IV), the Ray task-event source under a slow or odd Ray: items 1, 2 (actor names), 3, 9
(rows validated one by one, clocks ahead, a failed poll is not "up") and 10 (error texts and terminal lines).

Each attack runs against a Ray dashboard on 127.0.0.1 that misbehaves on demand (tests/ray_fake.py: the demo's
recorded-row stand-in behind it) -- through a real ``omniwatch serve`` where the attack is on what the exporter
serves, in-process where it is on one mechanism. Each has its control. Waits are bounded; nothing asserts a
speed: "the scrape did not wait on the poll" is shown by order (the poll's request to Ray is still open when
the scrape has its answer)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from omniwatch import names
from omniwatch.demo.raytasks import JOB_ID
from omniwatch.discovery import phases
from omniwatch.discovery import taskevents as te
from omniwatch.discovery.rayapi import RayAPIError, StateAPI
from omniwatch.discovery.taskwatch import TaskPoller
from omniwatch.core.model import RunStore

from .conftest import wait_for
from .ray_fake import FakeDashboard
from .test_faults import serve  # noqa: F401 (a fixture)


@pytest.fixture
def fake():
    f = FakeDashboard()
    yield f
    f.close()


def _ray_args(url: str) -> list[str]:
    return ["--ray-address", "off", "--ray-tasks", url, "--ray-tasks-interval", "0.5", "--ray-job", JOB_ID,
            "--discovery-project", "p", "--discovery-experiment", "e"]


def _ps(s) -> dict:
    return httpx.get(s.url + "/api/v1/ps", timeout=10).json()


# --- item 1: a slow Ray never holds /metrics; every call has a total deadline --------------------------------------
@pytest.mark.integration
def test_a_trickling_or_slow_ray_dashboard_never_holds_a_scrape_and_the_poll_gives_up_at_its_deadline(fake, serve):
    """Before: the poller held its lock through the poll's HTTP calls and the collector took it: Ray answering
    each call after 4.5 s made scrapes wait; Ray trickling its body (a byte every 0.5 s here; the timeout was per
    read) failed every scrape until Ray hung up, while /api/v1/ps said up. Now a scrape renders the last completed
    poll, and a call Ray has not finished within its deadline (5 s) is given up: ps says so."""
    s = serve(_ray_args(fake.url))
    wait_for(lambda: s.value(names.STEP_HOLDER_INFO) is not None, 30, 0.2, what="a first poll's holder")
    for mode, delay in (("slow", 4.5), ("trickle", 0.5)):
        fake.mode, fake.delay = mode, delay
        wait_for(lambda: fake.inflight >= 1, 15, 0.02, what=f"a poll waiting on the {mode} dashboard")
        for _ in range(3):
            r = httpx.get(s.url + "/metrics", timeout=5)
            assert r.status_code == 200 and "omniwatch_step_holder_info{" in r.text
            assert fake.inflight >= 1, "the scrape was answered while the poll still waited on Ray"
            time.sleep(0.2)
    # the trickled answer is given up at the call's deadline, and ps says so (before: "up" as long as Ray trickled)
    ps = wait_for(lambda: (p := _ps(s))["up"] is False and p, 30, 0.2, what="ps saying the poll gave up")
    assert "did not finish answering" in ps["why"] and "within 5 s" in ps["why"]
    # control: Ray answers normally again -> up, holder as before
    fake.mode = "ok"
    wait_for(lambda: _ps(s)["up"] is True, 60, 0.2, what="ps up again once Ray answers")
    assert s.value(names.STEP_HOLDER_INFO) is not None


def test_a_call_is_given_up_at_its_total_deadline_whatever_stage_it_is_in(fake):
    """The deadline covers the head and the body: a trickled answer fails at 1 s, not after its bytes (and the
    request to Ray is closed); control: the same answer at full speed is read whole."""
    fake.mode, fake.delay = "trickle", 0.2
    with StateAPI(fake.url, timeout=1.0) as api:
        with pytest.raises(RayAPIError, match="within 1 s"):
            api.list("actors")
        assert api.cut_answers == 1
        wait_for(lambda: fake.trickling == 0, 10, 0.05, what="the trickle to stop: the client hung up")
        fake.mode = "ok"
        assert len(api.list("actors").rows) == 9   # the stand-in's ranks, server and loop workers


# --- item 3: every answer bounded in bytes and rows; no unbounded FAILED listing; a ledger bounded in calls ----------
def test_a_ray_ignoring_the_page_size_is_cut_at_the_row_and_byte_caps(fake):
    """Before: a Ray that ignored ``limit`` (100,000 detailed rows) was read whole and parsed (0.8-1.1 GB RSS, 5 s
    scrapes). Now an answer over 16 MiB is given up unread past the cap, and rows beyond ``limit`` are dropped and
    the page marked cut (the ledger then closes nothing it merely did not see). Control: a normal page."""
    fake.mode = "flood"
    with StateAPI(fake.url, timeout=60, limit=100) as api:
        with pytest.raises(RayAPIError, match="over 16384 KiB"):
            api.list("tasks", [("state", "=", "RUNNING")], detail=True)
        assert fake.sent < 48 << 20, f"the client read {fake.sent >> 20} MiB of a 100,000-row answer"
        fake.flood_rows = 300
        page = api.list("tasks", [("state", "=", "RUNNING")], detail=True)
        assert len(page.rows) == 100 and page.truncated and api.cut_rows == 200
        fake.mode = "ok"
        page = api.list("actors")
        assert len(page.rows) == 9 and not page.truncated


def test_a_poll_asks_no_failed_listing_and_a_failed_call_still_ends_exactly(fake):
    """Before: every poll listed the job's FAILED tasks (20 kB tracebacks each, no time bound: a run's failures
    piled into every poll). Now the calls that left the RUNNING set are looked up by task id, which gives a failed
    call its FAILED state and exact end. Control: the lookup's FAILED row closes the call exactly."""
    p = TaskPoller(fake.url, interval=0.5, job_id=JOB_ID)
    try:
        p.poll()
        p.poll()
    finally:
        p.api.close()
    assert fake.paths and not [x for x in fake.paths if "filter_values=FAILED" in x]
    led = te.TaskLedger()
    row = {"task_id": "t1", "attempt_number": 0, "name": "WorkerDict.actor_rollout_update_actor", "type": "ACTOR_TASK",
           "actor_id": "a1", "node_id": "n1", "job_id": JOB_ID, "start_time_ms": 1_000_000}
    led.apply([row], now=1001.0)
    led.apply([], now=1005.0)
    assert led.apply_final(("t1", 0), dict(row, state="FAILED", end_time_ms=1_003_000))
    t = led.closed[("t1", 0)]
    assert t.failed and t.final and t.end == 1003.0 and not t.end_estimated


def test_the_task_ledger_is_bounded_in_calls_not_dispatches():
    """Before: 2,000 dispatches x their calls were kept (512 workers: a million calls, 705 MB). Now the
    dispatches hold at most ``max_calls`` calls together. Control: the newest dispatches are all kept, whole."""
    led = te.TaskLedger(max_done=20000)
    led.apply_actors([{"actor_id": f"a{i}", "name": f"bWorkerDict_{i // 8}:{i % 8}", "class_name": "WorkerDict",
                       "state": "ALIVE", "job_id": JOB_ID} for i in range(512)])
    for k in range(100):   # 100 phases of 512 workers, one per poll
        method = f"actor_rollout_{phases.PHASES[k % 10]}"
        rows = [{"task_id": f"{k:08x}{i:08x}", "name": "WorkerDict." + method, "actor_id": f"a{i}", "node_id": "n",
                 "job_id": JOB_ID, "start_time_ms": (1000 + 10 * k) * 1000 + i} for i in range(512)]
        led.apply(rows, now=1000 + 10 * k + 5)
    held = sum(len(d.tasks) for d in led.dispatches)
    assert held <= 20000 and held == led.dispatch_calls and len(led.done) <= 20000
    assert [len(d.tasks) for d in list(led.dispatches)[-30:]] == [512] * 30


# --- item 9: every row validated on its own; a node's clock ahead; a failed poll is not "up" ---------------------------
def _bad_rows(kind: str, rows: list[dict]) -> list[dict]:
    if kind == "tasks" and rows and rows[0].get("state") == "RUNNING":
        # a rank's call (the stand-in also runs server requests and agent/reward-loop calls, each its own kind)
        r0 = next((r for r in rows if str(r.get("name", "")).startswith("WorkerDict.")), rows[0])
        rows = rows + [dict(r0, task_id="f" * 40, attempt_number="x"),       # a malformed attempt
                       dict(r0, task_id="e" * 40, actor_id=["not", "an", "id"]),   # an id that is a list
                       dict(r0, task_id="d" * 40, start_time_ms=(time.time() + 3600) * 1000)]   # a clock 1 h ahead
    if kind == "actors" and rows:
        rows = rows + [dict(rows[0], actor_id={"a": 1})]
    return rows


def test_malformed_ray_rows_are_counted_and_skipped_and_a_clock_ahead_is_no_negative_age(fake):
    """Before: one malformed field (``attempt_number: "x"``, an ``actor_id`` list) raised in the poll: the loop kept
    the last snapshot and everything stayed frozen while "up"; a start 1 h ahead gave a negative holder age. Now a
    bad row is a counted skip, the poll goes on, and a start after the poll is the poll's time (counted). Control:
    the good rows of the same answers are read (the holder names the recorded ranks)."""
    fake.rows = _bad_rows
    store = RunStore()
    p = TaskPoller(fake.url, interval=0.5, job_id=JOB_ID)
    p.store = store
    try:
        snap = p.poll()
        snap = p.poll()
    finally:
        p.api.close()
    assert snap.up is True and snap.holder and snap.holder["age_s"] >= 0
    assert all(g["age_s"] >= 0 and g["slowest"]["age_s"] >= 0 for g in snap.groups)
    assert store.errors[("ray_tasks", "bad_row")] >= 3 and store.errors[("ray_tasks", "clock_ahead")] >= 1
    assert any(t.key[0] == "d" * 40 for t in p.ledger.running.values())   # the clock-ahead call is kept, clamped
    assert p.ledger.running and len(p.ledger.actors) == 9


def test_a_poll_that_fails_for_any_reason_is_not_up(fake):
    """Before: an unexpected exception kept the last good snapshot (``up``), so ps, the holder and the lanes stayed
    frozen. Now the snapshot says the last poll failed. Control: a good poll before it was up."""
    p = TaskPoller(fake.url, interval=0.2, job_id=JOB_ID)
    assert p.poll().up is True

    def broken(now=None):
        raise KeyError("something Ray never sent before")
    p.poll = broken
    p.start()
    try:
        snap = wait_for(lambda: p.snapshot.up is False and p.snapshot, 10, 0.05, what="a failed poll seen")
    finally:
        p.stop()
    assert "the last poll failed" in snap.why


# --- item 2 (actor names) ----------------------------------------------------------------------------------------------
class _Spy:
    """WORKER_NAME with the lengths it was asked to match recorded (never runs the regex on a long name)."""

    def __init__(self, real):
        self.real, self.lengths = real, []

    def match(self, s):
        self.lengths.append(len(s))
        return self.real.match(s) if len(s) <= 1024 else None


def test_a_64k_character_actor_name_never_reaches_the_backtracking_regex(monkeypatch):
    """Before: ``WORKER_NAME`` (``.*?`` then ``…_\\d+:\\d+$``) ran on every actor name: a dead actor named with
    64,000 characters froze scrapes and /healthz and ignored SIGTERM. Now a name is length-checked first (and cut
    to 512 characters when read). Control: verl's names still give ranks and groups."""
    spy = _Spy(phases.WORKER_NAME)
    monkeypatch.setattr(phases, "WORKER_NAME", spy)
    led = te.TaskLedger()
    huge = "a" * 64_000
    led.apply_actors([{"actor_id": "x" * 24, "name": huge, "class_name": "WorkerDict", "state": "DEAD", "job_id": "j"},
                      {"actor_id": "y" * 24, "name": "abcdWorkerDict_0:1", "class_name": "WorkerDict", "state": "ALIVE",
                       "job_id": "j"},
                      {"actor_id": "z" * 24, "name": "abcdWorkerDict_0:0", "class_name": "WorkerDict", "state": "ALIVE",
                       "job_id": "j"}])
    phases.classify("WorkerDict.actor_rollout_update_actor", huge, "WorkerDict")
    phases.ranks([huge, "abcdWorkerDict_0:0"])
    assert spy.lengths and max(spy.lengths) <= getattr(phases, "MAX_WORKER_NAME", 256)
    assert led.rank_of == {"abcdWorkerDict_0:0": 0, "abcdWorkerDict_0:1": 1}
    assert phases.classify("WorkerDict.actor_rollout_update_actor", "abcdWorkerDict_0:1").group == "abcdWorkerDict"
    assert len(led.actors["x" * 24].name) == te.MAX_NAME


# --- item 10: error texts redacted before they are served; no planted terminal lines ------------------------------------
@pytest.mark.integration
def test_an_error_text_echoing_the_token_is_redacted_before_ps_serves_it(fake, serve):
    """Before: a Ray (or proxy) answering 500 with a message echoing the Authorization header had it served,
    unredacted, by the unauthenticated /api/v1/ps as ``why``. Control: the HTTP status still says what happened."""
    token = "rAyT0ken-0123456789abcdefABCDEF"
    s = serve(_ray_args(fake.url), env={"RAY_AUTH_TOKEN": token})
    fake.mode = "echo"
    ps = wait_for(lambda: (p := _ps(s))["up"] is False and p, 30, 0.2, what="the refused poll")
    assert "HTTP 500" in ps["why"] and token not in json.dumps(ps) and token not in s.log.read_text(errors="replace")


@pytest.mark.integration
def test_an_actor_name_with_newlines_plants_no_line_in_omniwatch_ps(fake):
    """Before: a 400-character actor name with newlines printed extra lines in ``omniwatch ps`` (a fake
    "proj/exp: ..." answer). Now every value printed is one line without control characters. Control: the
    holder and the dead actor are still printed."""
    planted = "x" * 300 + "\nproj/exp: update_actor: 4/4 ranks done, all healthy\n\x1b[2Jok"

    def rows(kind, rs):
        if kind == "actors" and rs:
            rs = [dict(rs[0], actor_id="ab" * 14, name=planted, state="DEAD", job_id=JOB_ID)] + rs
        return rs
    fake.rows = rows
    # ps maps actors from the calls it sees running: the stand-in's step has idle moments (~1 s of its 10 s) where no
    # call runs and no actor is asked for, so ps is asked up to 3 times 2.5 s apart, each output checked
    for attempt in range(3):
        out = subprocess.run([sys.executable, "-m", "omniwatch", "ps", "--ray-address", fake.url, "--ray-job", JOB_ID,
                              "--timeout", "10"], capture_output=True, text=True, timeout=60)
        lines = out.stdout.splitlines()
        assert out.returncode == 0, out.stderr[-2000:]
        assert not [ln for ln in lines if ln.lstrip().startswith("proj/exp:")] and "\x1b[2J" not in out.stdout
        if any("actor DEAD" in ln for ln in lines):
            break
        time.sleep(2.5)
    assert any("actor DEAD" in ln for ln in lines) and any("DEAD" in ln and "xxxx" in ln for ln in lines), out.stdout


# --- item 9: the holder scoped to the run's job; the ring keyed by job ---------------------------------------------------
OTHER_JOB = "02000000"


def _two_jobs(kind: str, rows: list[dict]) -> list[dict]:
    """The demo's job and a second training job on the same cluster (its own actors and calls)."""
    twin = []
    for r in rows:
        r2 = dict(r, job_id=OTHER_JOB)
        if r.get("actor_id"):
            r2["actor_id"] = "b" + r["actor_id"][1:]
        if r.get("task_id"):
            r2["task_id"] = "b" + r["task_id"][1:]
        if kind == "actors" and r.get("name"):
            r2["name"] = "other" + r["name"]
        twin.append(r2)
    return rows + twin if kind in ("tasks", "actors") else rows


def test_with_two_jobs_on_one_cluster_the_holder_describes_the_runs_job(fake):
    """Before: without --ray-job the poller took the last job id it saw: with two training jobs on one cluster the
    holder (and so TrainingStalled's text) described the other job in 30 of 30 samples. Now the views describe the
    run's job (as JobWatch matched it), and with several jobs and none matched, none is shown as the run's.
    Control: the run's own job's calls are all there."""
    fake.rows = _two_jobs
    p = TaskPoller(fake.url, interval=0.5)
    p.run_job = lambda: JOB_ID   # JobWatch matched the run to the demo's job (its log writer, say)
    try:
        busy = 0
        for _ in range(60):
            snap = p.poll()
            assert snap.job_id == JOB_ID
            assert not [d for d in snap.dead if d["name"].startswith("other")]
            mine = [t for t in p.ledger.running.values() if t.job_id == JOB_ID]
            assert sum(g["running"] for g in snap.groups) == len(mine)   # the other job's calls are not counted
            busy += bool(mine)
            if busy >= 3:
                break
            time.sleep(0.2)
        assert busy >= 3 and any(t.job_id == OTHER_JOB for t in p.ledger.running.values())
        p.run_job = lambda: None   # no match: several jobs, none known to be the run's
        snap = p.poll()
        assert "2 Ray jobs run and none is known to be this run's" in snap.holder["text"] and not snap.groups
    finally:
        p.api.close()


def test_the_ring_of_a_previous_job_is_not_restored_into_the_next(fake, tmp_path):
    """Before: the persisted ring of the previous job was restored into the next one (its RankStraggler streak
    exported for the new job). Now it is restored at the first poll only when the job then is the one it was written
    for. Control: a ring of the job now running is restored."""
    from omniwatch.discovery import taskring as tr
    from omniwatch.discovery.taskmetrics import straggler_streaks
    run = ("p", "e")
    for ring_job, restored in ((OTHER_JOB, False), (JOB_ID, True)):
        led = te.TaskLedger(dispatch_gap_s=2.0)
        stand = fake.standin
        led.apply_actors([dict(a, job_id=ring_job) for a in stand.actors])
        now = 1_800_000_010.0
        while now < 1_800_000_050.0:
            led.apply([dict(r, job_id=ring_job) for r in stand.running(now)], [], now)
            now += 0.5
        assert straggler_streaks(led)
        store = RunStore()
        ring = tr.TaskRing(tmp_path, store, lambda: run)
        assert ring.save(ring.snapshot(led, ring_job))
        p = TaskPoller(fake.url, interval=0.2, ring=tr.TaskRing(tmp_path, store, lambda: run))
        p.start()
        try:
            wait_for(lambda: p.snapshot.polls >= 1, 20, 0.05, what="a first poll")
        finally:
            p.stop()
        old = [d for d in p.ledger.dispatches if d.tasks and d.tasks[0].job_id == ring_job]
        if restored:
            assert old and p.ring.restored > 0
        else:
            assert not old and store.errors[("ray_tasks", "ring_other_run")] == 1
        (tmp_path / tr.FILENAME).unlink()
