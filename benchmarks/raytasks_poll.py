#!/usr/bin/env python3
"""Cost of one Ray task-event poll (discovery/taskwatch.TaskPoller.poll) at 8, 64 and 512 workers x 10 phases
per step: state-API calls, bytes and the exporter's CPU per poll.

Ray's side is replaced by the package's stand-in (omniwatch.demo.raytasks, poll mode) in a child process that
answers ``/api/v0/{tasks,actors,nodes}`` exactly as Ray 2.60's dashboard does (the recorded bodies of
tests/fixtures/raytasks: every RUNNING row is the recorded detailed row with its ids, actor, pid and start changed), so the client, the JSON
decoding and the ledger are the real ones and the CPU measured is the exporter's alone (the child's is not
counted). Every poll the step moves to its next phase: all N workers close their call and open the next.

    .venv/bin/python benchmarks/raytasks_poll.py [--polls 30] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The package's stand-in (omniwatch.demo.raytasks, the one the demo serves) in "poll" mode, in a child process
SERVER = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from omniwatch.demo.raytasks import StateStandIn
ray = StateStandIn(workers=int(sys.argv[1]), advance="poll")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        code, b = ray.answer(self.path)
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


def measure(workers: int, polls: int) -> dict:
    sys.path.insert(0, str(REPO / "exporter"))
    from omniwatch.discovery.taskwatch import TaskPoller
    env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"))
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(workers)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(srv.stdout.readline())
        p = TaskPoller(f"http://127.0.0.1:{port}", interval=5.0, timeout=30, page=10000)
        p.poll()  # warm-up: the actor table, first opens
        cpu, wall, calls, nbytes = [], [], [], []
        for _ in range(polls):
            s = p.poll()
            cpu.append(s.cost.cpu_s), wall.append(s.cost.wall_s), calls.append(s.cost.calls), nbytes.append(s.cost.bytes)
        led = p.ledger
        p.api.close()
        cpu.sort(), wall.sort()
        return {"workers": workers, "polls": polls, "calls_per_poll": max(calls), "kbytes_per_poll": round(max(nbytes) / 1024, 1),
                "cpu_ms_median": round(1000 * cpu[len(cpu) // 2], 2), "cpu_ms_max": round(1000 * cpu[-1], 2),
                "wall_ms_median": round(1000 * wall[len(wall) // 2], 2), "closed_calls": len(led.done),
                "dispatches_kept": len(led.dispatches)}
    finally:
        srv.kill()
        srv.wait()


def run(polls: int = 20) -> list[dict]:
    return [measure(n, polls) for n in (8, 64, 512)]


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--polls", type=int, default=30)
    a.add_argument("--json", action="store_true")
    args = a.parse_args()
    out = run(args.polls)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in out:
            print(f"{r['workers']:>4} workers: {r['calls_per_poll']} calls, {r['kbytes_per_poll']:>8} KiB, CPU median "
                  f"{r['cpu_ms_median']} ms (max {r['cpu_ms_max']}), wall median {r['wall_ms_median']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
