"""``omniwatch ps [--ray-address ADDR] [--json]``: who holds the step, from Ray's own task events.

Asks the running exporter first (``--exporter``, ``GET /api/v1/ps``: it has watched every poll) and
otherwise looks at Ray once: the RUNNING tasks, then, for each worker group still running, the
FINISHED calls of the same method that started with it (how many ranks are done, and when).
"""
from __future__ import annotations

import json
import sys
import time

import httpx

from ..redact import redact
from ..runlabel import strip_control
from . import taskevents as te
from .rayapi import RayAPIError, dashboard_of
from .taskwatch import TaskPoller, TaskSnapshot


def _stack(d) -> dict | None:
    """A dump as ps shows it: where the call is stuck in one line (not the whole dump: the exporter's /stacks)."""
    if d is None:
        return None
    return {"of": d.of, "stack": d.text, "ok": d.ok, "rank": d.rank, "node": d.node, "pid": d.pid,
            "method": d.method, "phase": d.phase, "at": d.at}


def snapshot_json(snap: TaskSnapshot, project: str | None = None, experiment: str | None = None,
                  holder_stack=None, straggler_stack=None, job=None) -> dict:
    return {"ts": snap.ts, "up": snap.up, "why": redact(snap.why),
            "jobs": [{"job_id": snap.job_id, "project": project, "experiment": experiment,
                      "holder": redact(snap.holder.get("text", "")), "phase": snap.holder.get("phase", ""),
                      "role": snap.holder.get("role", ""), "age_s": snap.holder.get("age_s", 0.0),
                      "since": (snap.ts - snap.holder.get("age_s", 0.0)) if snap.holder else None,
                      "stack": _stack(holder_stack), "straggler_stack": _stack(straggler_stack),
                      "ray_job": job.to_json() if job is not None else None,
                      "groups": list(snap.groups), "replicas": list(snap.replicas), "dead": list(snap.dead)}]
            if snap.up else [],
            "ray_dropped_task_events": snap.dropped, "lossy": snap.lossy, "truncated_polls": snap.truncated_polls,
            "poll": {"polls": snap.polls, "calls": snap.cost.calls, "bytes": snap.cost.bytes,
                     "wall_s": round(snap.cost.wall_s, 4), "cpu_s": round(snap.cost.cpu_s, 4)}}


def look_once_with_stack(address: str | None, job_id: str | None = None, timeout: float = 10.0):
    """One look (``_look``) and, when a worker call holds the step, one stack dump of it (Ray's /task/traceback): a person
    asked, so it is asked now (traceback.py says what a refusal means)."""
    from .traceback import StackDumper, StackWatch
    p = TaskPoller(address, interval=1.0, timeout=timeout, page=10000, job_id=job_id, actor_refresh_s=0)
    try:
        snap = _look(p)
        watch = StackWatch(StackDumper(p.api, timeout=timeout), lambda: (None, None))
        with p.lock:
            task, g = watch._holder_task(p.ledger, snap)
            rank = p.ledger.rank(task) if task is not None else None
        dump = None
        if task is not None:
            dump = watch.dumper.dump(task, "holder", rank, (g.get("slowest") or {}).get("node", ""))
        return snap, dump
    finally:
        p.api.close()


def line(v, n: int = 120) -> str:
    """A value from Ray (or an exporter) as terminal text: one line without control characters, at most ``n``
    characters (a 400-character actor name with newlines plants no line), markup escaped."""
    from rich.markup import escape
    s = strip_control(" ".join(str(v).split()))
    return escape(s if len(s) <= n else s[: n - 1] + "…")


def _look(p: TaskPoller) -> TaskSnapshot:
    """One poll, then the FINISHED calls of each running worker group's method (how many ranks are done)."""
    snap = p.poll()
    led = p.ledger
    names = {t.name for d in led._open_dispatch.values() for t in d.running if not t.call.role.endswith("_server")}
    job_f = [("job_id", "=", snap.job_id)] if snap.job_id else []
    for name in sorted(names):
        page = p.api.list("tasks", [("state", "=", "FINISHED"), ("name", "=", name)] + job_f, detail=True)
        led.add_finished(page.rows)
    now = time.time()
    return TaskSnapshot(now, True, snap.why, snap.job_id, te.holder(led, now, snap.job_id or None),
                        tuple(te.groups(led, now, snap.job_id or None)), snap.replicas, snap.dead,
                        snap.dropped, snap.lossy, snap.truncated_polls, snap.drop_increases, snap.polls, snap.cost)


def _print(out: dict) -> None:
    from rich.console import Console
    escape = line
    con = Console(soft_wrap=True)   # one printed line per line: a long value is never broken into a new line
    if not out["jobs"]:
        con.print(f"[yellow]no answer[/yellow]: {escape(out.get('why', ''))}")
        return
    for j in out["jobs"]:
        run = f"{j['project']}/{j['experiment']}" if j.get("project") else f"Ray job {j['job_id'] or '?'}"
        con.print(f"[bold]{escape(run)}[/bold]: {escape(j['holder'], 240)} (for {j['age_s']:.0f} s)")
        if j.get("ray_job"):
            rj = j["ray_job"]
            con.print(f"  Ray job {escape(rj['job_id'])} ({escape(rj['type'])}): {escape(rj['status'])}"
                      + (f": {escape(rj['error'], 300)}" if rj.get("error") else ""))
        for key, what in (("stack", "stuck in"), ("straggler_stack", "straggler rank stuck in")):
            st = j.get(key)
            if st:
                who = f"rank {st['rank']} pid {st['pid']}" if st.get("rank") is not None else f"pid {st.get('pid')}"
                con.print(f"  {what}: {escape(st['stack'], 300)} ({escape(who)}; whole dump: the exporter's /stacks)")
        for g in j["groups"]:
            s = g["slowest"]
            con.print(f"  {escape(g['role']):<18} {escape(g['phase']):<22} running {g['running']:>4}  done {g['done']:>4}  "
                      f"for {g['age_s']:>7.1f} s  slowest rank {s['rank']} node {escape(str(s['node']))} pid {s['pid']} "
                      f"({s['age_s']:.1f} s)")
        for r in j["replicas"]:
            con.print(f"  {escape(r['role']):<18} replica {escape(r['replica']):<6} {r['in_flight']} requests in flight, "
                      f"oldest {r['oldest_s']:.1f} s")
        for d in j["dead"]:
            con.print(f"  [red]{escape(d['state'])}[/red] {escape(d['class'])} {escape(d['name'])} rank {d['rank']} "
                      f"node {escape(d['node'])}: {escape(d['why'], 200)}")
    if out["lossy"]:
        con.print("[yellow]Ray dropped task events or the answer was cut: lanes may be incomplete[/yellow]")


def run_ps(args) -> int:
    out = None
    if args.exporter:
        try:
            with httpx.Client(timeout=5, trust_env=False) as c:
                r = c.get(args.exporter.rstrip("/") + "/api/v1/ps")
            if r.status_code == 200 and r.json().get("enabled", True) is not False:
                out = r.json()
        except (httpx.HTTPError, ValueError):
            out = None
    if out is None:
        try:
            dash, how = dashboard_of(args.ray_address, args.timeout)
            if how != "given":   # which address was used, when it was not the one typed
                print(f"omniwatch ps: Ray dashboard {dash} ({how})", file=sys.stderr)
            snap, dump = look_once_with_stack(dash, args.ray_job, args.timeout)
            out = snapshot_json(snap, holder_stack=dump)
            out["ray_dashboard"] = dash
        except RayAPIError as e:
            out = {"jobs": [], "why": redact(str(e)), "up": False, "lossy": False}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(out)
    return 0 if out.get("jobs") else 1


def add_commands(sub) -> None:
    p = sub.add_parser("ps", help="who holds the step: phase in progress, slowest worker, replicas, dead actors (Ray task events)")
    p.add_argument("--ray-address", default="auto",
                   help="the Ray cluster: its dashboard (http://host:8265) or its GCS address (host:6379, what "
                        "`ray start` prints and `serve --ray-address` takes: its dashboard is looked up through it, "
                        "as Ray's CLI does). Default auto: RAY_API_SERVER_ADDRESS, RAY_ADDRESS, 127.0.0.1:8265, the "
                        "local cluster")
    p.add_argument("--ray-job", default=None, help="Ray job id to look at (default: the job whose workers run)")
    p.add_argument("--exporter", default=None, help="ask this omniwatch exporter (http://host:port) first")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_ps)
