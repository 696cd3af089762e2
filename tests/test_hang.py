"""The hang's parts without a cluster (issue 31 items 1, 2): the stack summary of a real py-spy dump Ray 2.60 served
(tests/fixtures/hang/), Ray's refusals and what omniwatch does with them, the dumper's bounds, and finish / crash /
hang from Ray's recorded job table and failed TaskRunner — all through a loopback HTTP stand-in of the dashboard
that answers what the recorded Ray answered (the live cluster proof is tests/test_hang_live.py)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from conftest import fixture
from omniwatch import names
from omniwatch.discovery import jobs as jb
from omniwatch.discovery import traceback as tb
from omniwatch.discovery.phases import classify
from omniwatch.discovery.rayapi import StateAPI
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep
from omniwatch.core.planned import JobState

from .test_model import value

DUMP = json.loads(fixture("hang/ray_2.60_stacks.json").read_text())["dumps"][0]["dump"]
# Ray 2.60's own texts (ray/dashboard/modules/reporter/reporter_head.py _profiling_disabled_response,
# profile_manager.py trace_dump / _format_failed_profiler_command, get_worker_details_for_running_task)
DISABLED = ("Profiling is disabled by default for security reasons. To enable profiling, set the environment variable "
            "RAY_DASHBOARD_ENABLE_PROFILING=1 on the Ray head node. See https://docs.ray.io/en/latest/ray-observability/"
            "user-guides/profiling.html for details.")
NO_PYSPY = "Failed to execute: py-spy is not installed"
NO_PTRACE = ("Failed to execute `['/usr/bin/py-spy', 'dump', '-p', '123']`.\nNote that this command requires `py-spy` "
             "to be installed with root permissions.\n=== stderr ===\nError: Permission denied (os error 13)")
ENDED = "The task attempt is not running: the current state is FINISHED."


# --- the stack of the held call ------------------------------------------------------------------------------
def test_the_summary_of_a_real_dump_is_the_line_inside_update_actor():
    text, found = tb.summary(DUMP, "actor_rollout_update_actor")   # the bound name Ray records for a WorkerDict
    assert found and text.startswith("ActorRolloutRefWorker.update_actor (tests/hang_trainer.py:")
    assert "ray/_private" not in text and "threading.py" not in text
    threads = tb.parse(DUMP)
    assert threads[0].name == "MainThread" and threads[0].frames[0].func == "ActorRolloutRefWorker.update_actor"


def test_the_summary_keeps_the_innermost_training_frames_and_the_method_bounded():
    dump = "\n".join(["Process 1: ray::WorkerDict.actor_rollout_update_actor", "",
                      'Thread 1 (active): "MainThread"'] +
                     [f"    f{i} (torch/distributed/distributed_c10d.py:{100 + i})" for i in range(9)] +
                     ["    ActorRolloutRefWorker.update_actor (verl_omni/workers/engine_workers.py:412)",
                      "    Worker.main_loop (ray/_private/worker.py:1069)",
                      'Thread 2 (idle): "side"', "    Condition.wait (threading.py:327)"])
    text, found = tb.summary(dump, "update_actor")
    parts = text.split(" ← ")
    assert found and len(parts) == tb.MAX_FRAMES and parts[0] == "f0 (torch/distributed/distributed_c10d.py:100)"
    assert parts[-2] == "…" and parts[-1] == "ActorRolloutRefWorker.update_actor (verl_omni/workers/engine_workers.py:412)"
    assert len(text) <= tb.MAX_SUMMARY_CHARS
    # a credential in a frame never reaches a label
    secret = dump.replace("f0 (", "f0 (HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123/")
    assert "hf_abcdefghij" not in tb.summary(secret, "update_actor")[0]


@pytest.mark.parametrize("status,body,scope", [(403, DISABLED, "cluster"), (500, NO_PYSPY, "node"),
                                               (500, NO_PTRACE, "node"), (403, "Unauthorized", "cluster"),
                                               (404, "Not Found", "cluster"), (500, ENDED, None),
                                               (500, "Failed to get agent address", None)])
def test_rays_refusals_are_told_from_transient_answers(status, body, scope):
    got = tb.classify(status, body)
    assert (got[0] if got else None) == scope
    if scope:
        assert got[1] and got[2]   # why, and the fix


class Dashboard:
    """A loopback stand-in of Ray's dashboard: ``/task/traceback`` answers ``answers`` in turn (then the last),
    ``/api/jobs/`` and ``/api/v0/tasks`` the recorded bodies; every request is recorded."""

    def __init__(self, answers=((200, DUMP),), jobs=None, failed=None):
        self.answers, self.jobs, self.failed = list(answers), jobs, failed
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                u = urlparse(self.path)
                q = parse_qs(u.query)
                outer.requests.append((u.path, q))
                if u.path == "/task/traceback":
                    code, body = outer.answers.pop(0) if len(outer.answers) > 1 else outer.answers[0]
                    ctype = "text/plain"
                elif u.path == "/api/jobs/":
                    code, body, ctype = 200, json.dumps(outer.jobs), "application/json"
                elif u.path == "/api/v0/tasks":   # Ray's `=` filters (job_id, state) on the recorded rows
                    rows = ((outer.failed or {}).get("data") or {}).get("result", {}).get("result", [])
                    for k, op, v in zip(q.get("filter_keys", []), q.get("filter_predicates", []),
                                        q.get("filter_values", [])):
                        rows = [r for r in rows if (str(r.get(k)) == v) == (op == "=")]
                    page = {"result": rows, "total": len(rows), "num_after_truncation": len(rows),
                            "num_filtered": len(rows)}
                    code, body, ctype = 200, json.dumps({"result": True, "data": {"result": page}}), "application/json"
                else:
                    code, body, ctype = 404, "Not Found", "text/plain"
                raw = body.encode()
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Call:
    def __init__(self, tid: str, node: str = "n1"):
        self.key, self.node_id, self.pid = (tid, 0), node, 4242
        self.call = classify("WorkerDict.actor_rollout_update_actor", "", "WorkerDict")


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def test_one_dump_per_call_per_interval_and_a_refusal_is_said_once_and_not_retried(caplog):
    dash = Dashboard([(200, DUMP), (403, DISABLED)])
    clock = Clock()
    api = StateAPI(dash.url)
    try:
        d = tb.StackDumper(api, interval=60, clock=clock)
        got = d.dump(Call("t1"), "holder", 1, "127.0.0.1")
        assert got.ok and got.method_found and "update_actor" in got.text and "Thread " in got.full
        assert not d.due(("t1", 0), "n1") and d.due(("t2", 0), "n1")      # t1 again only after the interval
        clock.t += 61
        assert d.due(("t1", 0), "n1")
        refused = d.dump(Call("t2"), "holder", 1, "127.0.0.1")
        assert not refused.ok and refused.text.startswith("not available: Ray's dashboard has profiling disabled")
        assert "RAY_DASHBOARD_ENABLE_PROFILING=1" in refused.text
        assert sum("refused a stack dump" in r.getMessage() for r in caplog.records) == 1
        # nothing asked again for an hour, on any node: no loop
        for _ in range(5):
            clock.t += 60
            assert not d.due(("t3", 0), "n2") and d.refusal("n2")
        clock.t += tb.REFUSED_RETRY_S
        assert d.due(("t3", 0), "n2")
        traceback_requests = [q for p, q in dash.requests if p == "/task/traceback"]
        assert len(traceback_requests) == 2
        assert traceback_requests[0] == {"task_id": ["t1"], "attempt_number": ["0"], "node_id": ["n1"], "native": ["0"]}
    finally:
        api.close()
        dash.close()


def test_a_missing_py_spy_stops_asking_that_node_only():
    dash = Dashboard([(500, NO_PYSPY), (200, DUMP)])
    api = StateAPI(dash.url)
    try:
        d = tb.StackDumper(api, clock=Clock())
        assert "py-spy is not installed on that node" in d.dump(Call("a", "nodeA"), "holder", 0, "a").text
        assert not d.due(("b", 0), "nodeA") and d.due(("b", 0), "nodeB")
        assert d.dump(Call("b", "nodeB"), "holder", 0, "b").ok
    finally:
        api.close()
        dash.close()


# --- finish, crash or hang from Ray's job ------------------------------------------------------------------
JOBS = json.loads(fixture("hang/ray_2.60_jobs.json").read_text())
FAILED = json.loads(fixture("hang/ray_2.60_tasks_failed_job.json").read_text())


class Poller:
    """What JobWatch reads of the task-event poller: its lock and its ledger's running calls and actors."""

    def __init__(self, actors=()):
        from omniwatch.discovery.taskevents import TaskLedger
        self.lock = threading.Lock()
        self.ledger = TaskLedger()
        self.ledger.apply_actors(list(actors))


def _store_with(*runs: str) -> RunStore:
    store = RunStore()
    for e in runs:
        store.ingest("proj", e, ParsedStep(5, {"timing_s/step": 20.0}), "jsonl")
    return store


def test_the_recorded_job_table_tells_a_finish_from_a_crash_with_rays_error():
    """The recorded jobs: 01000000 ended cleanly, 02000000's TaskRunner.run failed (both DRIVER jobs: Ray calls a
    dead driver SUCCEEDED either way), 03000000 runs; the failed TaskRunner's error is the crash."""
    by_id = {j["job_id"]: j for j in JOBS}
    assert {j["type"] for j in JOBS} == {"DRIVER"}
    assert [by_id[k]["status"] for k in ("01000000", "02000000", "03000000")] == ["SUCCEEDED", "SUCCEEDED", "RUNNING"]
    dash = Dashboard(jobs=JOBS, failed=FAILED)
    api = StateAPI(dash.url)
    try:
        w = jb.JobWatch(api, RunStore(), lambda: (None, None))
        ok, bad = w.state_of(by_id["01000000"], "test"), w.state_of(by_id["02000000"], "test")
        assert (ok.status, ok.error) == ("SUCCEEDED", "")
        assert w.state_of(by_id["03000000"], "test").status == "RUNNING"
        assert bad.status == "FAILED"
        assert bad.error.startswith("RuntimeError: CUDA error: an illegal memory access was encountered")
        assert bad.error.endswith("(in TaskRunner.run)") and len(bad.error) <= jb.MAX_ERROR_CHARS
        # asked once per ended job
        n = len([p for p, _ in dash.requests if p == "/api/v0/tasks"])
        w.state_of(by_id["02000000"], "test")
        assert len([p for p, _ in dash.requests if p == "/api/v0/tasks"]) == n
    finally:
        api.close()
        dash.close()


def test_jobwatch_matches_the_only_training_job_and_the_run_follows_it():
    running = [dict(JOBS[0], status="RUNNING", end_time=None)]   # the finish job while it ran
    dash = Dashboard(jobs=running, failed=FAILED)
    api = StateAPI(dash.url)
    store = _store_with("hang")
    clock = Clock()
    try:
        w = jb.JobWatch(api, store, lambda: ("proj", "hang"), clock=clock)
        w(Poller(), None)
        run = store.runs[("proj", "hang")]
        assert run.planned.ray.status == "RUNNING" and run.planned.ray.how == "only_job"
        assert store.expiry_of(run) == 0            # its job runs: a stop is a hang, never expired
        # the job ends cleanly: the run is finished, nothing stalls
        dash.jobs = [JOBS[0]]
        clock.t += 10
        w(Poller(), None)
        assert run.planned.ray.status == "SUCCEEDED" and value(store, names.RUN_FINISHED, project="proj", experiment="hang") == 1
        assert value(store, names.RUN_CRASHED, project="proj", experiment="hang") == 0
        # a later live step: a resumed run, a new job to match
        store.ingest("proj", "hang", ParsedStep(6, {"timing_s/step": 20.0}), "jsonl")
        assert run.planned.ray is None
    finally:
        api.close()
        dash.close()


def test_a_crash_survives_an_exporter_restart_and_a_second_job_is_no_match(tmp_path):
    from omniwatch.core.state import Checkpointer
    store = _store_with("fail")
    store.set_ray_job("proj", "fail", JobState("02000000", "DRIVER", "FAILED", "RuntimeError: boom (in TaskRunner.run)"))
    Checkpointer(store, [], str(tmp_path)).save()
    again = RunStore()
    Checkpointer(again, [], str(tmp_path)).load()
    again.reveal("proj", "fail")
    run = again.runs[("proj", "fail")]
    assert run.planned.crashed and run.planned.ray.error == "RuntimeError: boom (in TaskRunner.run)"
    # two training jobs and no flag, no writer: no match, said once, nothing set
    two = [dict(JOBS[0], status="RUNNING"), dict(JOBS[2])]
    dash = Dashboard(jobs=two, failed=FAILED)
    api = StateAPI(dash.url)
    try:
        store = _store_with("x")
        w = jb.JobWatch(api, store, lambda: ("proj", "x"))
        w(Poller(), None)
        assert store.runs[("proj", "x")].planned.ray is None
    finally:
        api.close()
        dash.close()


def test_one_line_keeps_the_exception_of_a_python_traceback():
    tbtext = ('Traceback (most recent call last):\n  File "/x/a.py", line 3, in f\n    g()\n'
              '  File "/x/b.py", line 9, in g\n    raise ValueError("bad batch")\n    ^^^^^^^^\nValueError: bad batch\n')
    assert jb.one_line(tbtext) == "ValueError: bad batch"
    assert jb.one_line("Job entrypoint command failed with exit code 1, last available logs ...") .startswith("Job entrypoint")
    assert jb.one_line("x" * 1000).endswith("…") and len(jb.one_line("x" * 1000)) == jb.MAX_ERROR_CHARS


def test_a_short_run_that_ended_between_writer_scans_is_matched_by_when_its_lines_came():
    """The failing job ended before the 10 s log-writer scan saw its TaskRunner write: the one run without a job
    whose last line arrived while the job ran is its run (recorded job 02000000 failed; job 03 still runs)."""
    by_id = {j["job_id"]: j for j in JOBS}
    j2 = by_id["02000000"]
    inside = (j2["start_time"] + j2["end_time"]) / 2000.0
    dash = Dashboard(jobs=JOBS, failed=FAILED)
    api = StateAPI(dash.url)
    # the store's clock is the recording's (just after the "later" line): at the wall clock, hours after the
    # recording, the ended runs would have expired and left /metrics (a test that failed once CI ran 6 h later)
    store = RunStore(clock=lambda: j2["end_time"] / 1000 + 601)
    store.ingest("proj", "fail", ParsedStep(2, {"timing_s/step": 2.5}), "jsonl", arrival=inside)
    store.ingest("proj", "later", ParsedStep(2, {"timing_s/step": 2.5}), "jsonl", arrival=j2["end_time"] / 1000 + 600)
    try:
        # the finish job (01) ran at the same time: while it is unmatched too, neither is matched by time
        jb.JobWatch(api, store, lambda: (None, None))(Poller(), None)
        assert store.runs[("proj", "fail")].planned.ray is None
        # the finish run matched by its writer: the failed job and the run are each other's only fit
        store.ingest("proj", "finish", ParsedStep(2, {"timing_s/step": 2.5}), "jsonl", arrival=inside)
        store.set_ray_job("proj", "finish", JobState("01000000", "DRIVER", "SUCCEEDED", "", None, "log_writer"))
        jb.JobWatch(api, store, lambda: (None, None))(Poller(), None)
        run = store.runs[("proj", "fail")]
        assert run.planned.ray.how == "by_time" and run.planned.crashed
        assert "CUDA error: an illegal memory access" in run.planned.ray.error
        assert store.runs[("proj", "later")].planned.ray is None   # its lines came after every ended job
        assert value(store, names.RUN_CRASHED, project="proj", experiment="fail") == 1
    finally:
        api.close()
        dash.close()
