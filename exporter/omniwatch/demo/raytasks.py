"""Stand-in of Ray's state API (the dashboard's ``/api/v0/{tasks,actors,nodes}``) for the demo and the
task-event benchmark: what ``omniwatch serve --ray-tasks`` polls (discovery/rayapi.py), answered with rows
shaped exactly like the ones recorded from Ray 2.60 (``raytasks_rows/``, byte copies of
tests/fixtures/raytasks): every row is a recorded row with its ids, name, pid and times changed.

Two ways to move:

- ``StateStandIn()`` (the demo): a FlowGRPO step every ``CYCLE_S`` seconds of wall time on the recorded
  colocated ``WorkerDict`` (4 ranks) and the ``vllm_omni_server_0_0`` replica: the replica holds
  ``REQUESTS`` generate requests while ``LOOP_WORKERS`` agent-loop workers run generate_sequences and as many
  reward-loop workers score the samples as they finish (every fleet of the step has its lanes; the loop workers
  are recorded actor rows renamed as verl names them: ``agent_loop_worker_<i>_<hex>``, ``reward_loop_worker_<i>``),
  then the ranks run compute_log_prob, update_actor, update_weights; rank
  ``SLOW_RANK`` takes ``SLOW_FACTOR`` times as long in the first two, so it is the straggler of every
  dispatch (a RankStraggler streak); every ``HANG_EVERY``-th step its update_actor stays running until
  the step's end and the step has no update_weights (the holder panels show one rank holding the step).
- ``StateStandIn(workers=N, advance="poll")`` (benchmarks/raytasks_poll.py): N workers, and every
  RUNNING-task poll moves all of them to the next phase.

``python -m omniwatch.demo.raytasks --port N`` serves it alone: the demo runs it as its own process (``raystate``)
and stops it when the demo ends, so no straggling rank outlives the demo (issue 35 item 16).

Filters are Ray's (``=`` / ``!=`` on any row key), ``limit`` cuts the answer as Ray does (``num_filtered``
says by how much). A ``task_id=`` lookup or a ``state=FINISHED`` page answers the finished calls with their
scheduled end (``end_time_ms``), as Ray keeps them (discovery/taskfinal.py reads those). Loopback only (the demo endpoints' server binds 127.0.0.1); bounded: the rows are a
function of the clock, nothing accumulates.
"""
from __future__ import annotations

import copy
import json
import math
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

ROWS = Path(__file__).with_name("raytasks_rows")
JOB_ID = "01000000"          # the recorded job (Ray numbers jobs from 01000000)
CYCLE_S = 10.0
REQUESTS = 6
SLOW_RANK, SLOW_FACTOR = 3, 1.8
HANG_EVERY = 3
# (phase method, start s, duration s for a normal rank) within one cycle; the replica's requests first
WORKER_PHASES = (("actor_rollout_compute_log_prob", 3.0, 1.3), ("actor_rollout_update_actor", 5.6, 1.4),
                 ("actor_rollout_update_weights", 8.8, 0.6))
LOOP_WORKERS = 2
GEN_S, SCORE_FROM_S = 2.9, 0.8  # the agent loops' generate_sequences spans gen; scoring starts with the first samples
BENCH_PHASES = ("generate_sequences", "infer_actor_batch", "infer_ref_batch", "update_actor", "update_weights",
                "save_checkpoint", "compute_log_prob", "copy_adapter", "ema_update_adapter", "init_model")


def _recorded(name: str) -> list[dict]:
    with open(ROWS / f"ray_2.60_{name}.json", encoding="utf-8") as f:
        return json.load(f)["data"]["result"]["result"]


def body(rows: list[dict], limit: int | None = None) -> bytes:
    """Ray 2.60's list answer (``ListApiResponse`` inside the dashboard's ``{"result", "msg", "data"}``)."""
    cut = rows[:limit] if limit is not None else rows
    return json.dumps({"result": True, "msg": "", "data": {"result": {
        "total": len(rows), "num_after_truncation": len(rows), "num_filtered": len(rows), "result": cut,
        "partial_failure_warning": "", "warnings": None}}}).encode()


def _match(row: dict, filters: list[tuple[str, str, str]]) -> bool:
    for k, p, v in filters:
        have = "" if row.get(k) is None else str(row.get(k))
        if (p == "=" and have != v) or (p == "!=" and have == v):
            return False
    return True


class StateStandIn:
    def __init__(self, workers: int = 0, advance: str = "clock"):
        self.task = _recorded("tasks_running_hang")[0]
        self.advance = advance
        self._lock = threading.Lock()
        self._poll = 0
        actors, node = _recorded("actors"), _recorded("nodes")[0]
        if workers:  # the benchmark's fleet: N ranks, 8 per node
            a = next(x for x in actors if "WorkerDict" in x["name"])
            self.actors = [dict(a, actor_id=f"{i:024x}{JOB_ID}", name=f"benchWorkerDict_{i // 8}:{i % 8}",
                                pid=10000 + i, node_id=f"{i // 8:056x}") for i in range(workers)]
            self.nodes = [dict(node, node_id=f"{k:056x}", node_ip=f"10.0.{k // 250}.{k % 250}")
                          for k in range((workers + 7) // 8)]
        else:
            a = next(x for x in actors if "WorkerDict" in x["name"])
            loops = [dict(a, actor_id=f"{0xa1 + i:024x}{JOB_ID}", name=f"agent_loop_worker_{i}_{0x5eed0 + i:08x}",
                          class_name="DiffusionAgentLoopWorker", pid=17000 + i) for i in range(LOOP_WORKERS)]
            loops += [dict(a, actor_id=f"{0xb1 + i:024x}{JOB_ID}", name=f"reward_loop_worker_{i}",
                           class_name="RewardLoopWorker", pid=17100 + i) for i in range(LOOP_WORKERS)]
            self.actors, self.nodes = actors + loops, [node]
        self.loops = [x for x in self.actors if x["class_name"] in ("DiffusionAgentLoopWorker", "RewardLoopWorker")]
        self.ranks = sorted((x for x in self.actors if "WorkerDict" in x["name"]), key=lambda x: x["name"])
        self.servers = [x for x in self.actors if x["name"].startswith("vllm_omni_server_")]

    def _row(self, tid: int, actor: dict, name: str, start: float) -> dict:
        r = copy.deepcopy(self.task)
        ms = round(start * 1000.0, 3)
        r.update(task_id=f"{tid:040x}{JOB_ID}", actor_id=actor["actor_id"], name=name, func_or_class_name=name,
                 node_id=actor["node_id"], worker_pid=actor["pid"], job_id=actor.get("job_id", JOB_ID),
                 creation_time_ms=ms, start_time_ms=ms)
        for e in r.get("events") or []:
            e["created_ms"] = ms
        return r

    def _calls(self, kk: int):
        """The calls of cycle ``kk``: (task number, actor row, task name, start, end)."""
        t0 = kk * CYCLE_S
        for s in self.servers:
            cls = s["class_name"].rsplit(".", 1)[-1]
            for j in range(REQUESTS):  # requests in flight on the replica, ending one by one
                yield kk * 1000 + 900 + j, s, f"{cls}.generate", t0 + 0.1 * j, t0 + 1.6 + 0.25 * j
        for i, a in enumerate(self.loops):  # the agent loops generate, the reward loops score as samples finish
            agent = a["class_name"] == "DiffusionAgentLoopWorker"
            yield (kk * 1000 + 800 + i, a,
                   "DiffusionAgentLoopWorker.generate_sequences" if agent else "RewardLoopWorker.compute_score",
                   t0 + (0.0 if agent else SCORE_FROM_S + 0.2 * i), t0 + (GEN_S if agent else GEN_S + 0.1))
        for pi, (method, start, dur) in enumerate(WORKER_PHASES):
            for r, a in enumerate(self.ranks):
                d = dur * (SLOW_FACTOR if r == SLOW_RANK and pi < 2 else 1.0)
                if kk % HANG_EVERY == 0:  # the held step: the slow rank's update_actor runs to the step's end
                    if method.endswith("update_weights"):
                        continue
                    if r == SLOW_RANK and method.endswith("update_actor"):
                        d = CYCLE_S - 0.1 - start
                yield kk * 1000 + pi * 100 + r, a, "WorkerDict." + method, t0 + start, t0 + start + d

    def running(self, now: float) -> list[dict]:
        """The RUNNING actor tasks at ``now`` (clock mode) or of the next phase (poll mode)."""
        if self.advance == "poll":
            with self._lock:
                p = self._poll
                self._poll += 1
            cls = "WorkerDict.actor_rollout_" + BENCH_PHASES[p % len(BENCH_PHASES)]
            return [self._row(p * 100000 + i, a, cls, 1_700_000_000 + p + i / 1000) for i, a in enumerate(self.ranks)]
        k = math.floor(now / CYCLE_S)
        return [self._row(tid, a, name, st) for kk in (k - 1, k)   # a hang of the previous step may still run
                for tid, a, name, st, end in self._calls(kk) if st <= now < end]

    def finished(self, now: float, filters: list[tuple[str, str, str]]) -> list[dict]:
        """FINISHED rows (clock mode) as Ray keeps them: one ``task_id=`` lookup, or the calls of an actor /
        name in the last few cycles (a finished-task page)."""
        if self.advance == "poll":
            return []
        want = dict((k, v) for k, p, v in filters if p == "=")
        tid_hex = want.get("task_id")
        if tid_hex:
            try:
                tid = int(tid_hex[:40], 16)
            except ValueError:
                return []
            kks = [tid // 1000]
        else:
            k = math.floor(now / CYCLE_S)
            kks = range(k - 5, k + 1)
        out = []
        for kk in kks:
            for n, a, name, st, end in self._calls(kk):
                if end <= now and (not tid_hex or n == tid):
                    r = self._row(n, a, name, st)
                    r.update(state="FINISHED", end_time_ms=round(end * 1000.0, 3))
                    out.append(r)
        return out

    def answer(self, path: str, now: float | None = None) -> tuple[int, bytes]:
        """``GET /api/v0/<kind>?...`` -> (HTTP status, body)."""
        u = urlparse(path)
        if u.path.rstrip("/") == "/api/version":   # the dashboard's version (job_head.py get_version, Ray 2.60)
            return 200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "stand-in",
                                    "session_name": "omniwatch-demo"}).encode()
        q = parse_qs(u.query)
        kind = u.path.rstrip("/").rsplit("/", 1)[-1]
        filters = list(zip(q.get("filter_keys", []), q.get("filter_predicates", []), q.get("filter_values", [])))
        try:
            limit = max(1, int(q.get("limit", ["100"])[0]))
        except ValueError:
            return 400, json.dumps({"result": False, "msg": "limit is not a number", "data": {}}).encode()
        if kind == "tasks":
            t = time.time() if now is None else now
            rows = self.running(t) if ("state", "=", "RUNNING") in filters else \
                self.finished(t, filters) if any(k == "task_id" for k, _, _ in filters) or ("state", "=", "FINISHED") in filters \
                else []
        elif kind == "actors":
            rows = self.actors
        elif kind == "nodes":
            rows = self.nodes
        elif kind == "placement_groups":   # the demo's workers were placed without GPU bundles
            rows = []
        else:
            return 404, json.dumps({"result": False, "msg": f"no such list: {kind}", "data": {}}).encode()
        return 200, body([r for r in rows if _match(r, filters)], limit)


def serve(host: str = "127.0.0.1", port: int = 0, standin: StateStandIn | None = None):
    """Serve ``standin`` (a new demo one by default) in a background thread; returns (server, bound port)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = standin or StateStandIn()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server API)
            status, out = state.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            try:
                self.wfile.write(out)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, fmt, *args):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="ray-state-standin",
                     daemon=True).start()
    return server, server.server_address[1]


def main(argv: list[str] | None = None) -> int:
    """``python -m omniwatch.demo.raytasks --port N``: Ray's state API stand-in alone, until SIGINT/SIGTERM."""
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="omniwatch.demo.raytasks", description=main.__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="N ranks, 8 per node (the benchmarks' fleet); 0: the demo's")
    args = p.parse_args(argv)
    server, port = serve(args.host, args.port, StateStandIn(workers=args.workers))
    print(f"Ray state API stand-in on http://{args.host}:{port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
