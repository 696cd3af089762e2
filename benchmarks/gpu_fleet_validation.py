#!/usr/bin/env python3
"""Per-fleet GPU time against the truth on a real GPU (issue 33: "GPU time you can bill").

A Ray 2.60 head (``ray start --head``, token authentication) and a driver that builds its worker the way verl's
single controller does (docs/verl-source.md R3, R11): a placement group with one ``{"CPU": 1, "GPU": 1}``
bundle, a colocated ``WorkerDict`` actor named ``<prefix>WorkerDict_0:0`` in bundle 0 with ``num_gpus=1``, its
methods bound as ``actor_rollout_<method>`` (so Ray names the calls ``WorkerDict.actor_rollout_<method>``, as
verl's ``create_colocated_worker_cls`` does). The driver runs ``init_model`` and then ``STEPS`` FlowGRPO-shaped
steps: wake_up (0.3 s), generate_sequences (5.8 s with a 0.8 s idle wait inside), sleep (0.25 s),
compute_log_prob (2 s), update_actor (4 s with a 0.5 s idle wait inside), update_weights (1.5 s), with the
driver's own 0.4 s between calls and 1 s at the step's end. Every call runs bf16 8192x8192 matmuls for its
busy segments and sleeps for its idle ones; each segment is timed after ``torch.cuda.synchronize()``: the
workers' own segments are the truth.

Beside it, in this process, the exporter's side exactly as ``omniwatch serve --gpu on --ray-tasks`` runs it at
its defaults: the NVML sampler (1 s drains), the task-event poller (``--ray-tasks-interval`` 5 s), the call
observer (0.05 s) and the fleet accountant. Scored: productive / overhead / idle inside calls against the
truth, per (fleet, phase), and the share of every call longer than 0.2 s charged to its own fleet and phase.
The run is recorded (gpu/fleettrace.py) and replayed here, with and without Ray's recorded ends and the
observer (the poll-time view the accountant used before), so the same numbers come out of the fixture in CI.

    PYTHONPATH=exporter python benchmarks/gpu_fleet_validation.py --out "$OUT"            # on the GPU machine
    PYTHONPATH=exporter python benchmarks/gpu_fleet_validation.py --out /tmp/x --dry-run  # no GPU: CPU Ray,
                                                                                        # a synthetic NVML device
Writes ``<out>/gpu_fleet_validation.json`` (results) and ``<out>/h200_fleet.trace.json`` (the recording: the CI
fixture ``tests/fixtures/gpu/h200_fleet.trace.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))

STEPS = 8
PREFIX = "gpubil"
PLAN = (("wake_up", "rollout", (("busy", 0.2), ("idle", 0.1))),
        ("generate_sequences", "rollout", (("busy", 3.0), ("idle", 0.8), ("busy", 2.0))),
        ("sleep", "rollout", (("busy", 0.15), ("idle", 0.1))),
        ("compute_log_prob", "actor", (("busy", 2.0),)),
        ("update_actor", "actor", (("busy", 2.5), ("idle", 0.5), ("busy", 1.0))),
        ("update_weights", "actor", (("busy", 1.0), ("idle", 0.5))))
INIT = (("busy", 2.0), ("idle", 0.5))
GAP_S, STEP_END_S = 0.4, 1.0
NODE_IP = "127.0.0.1"


# -- the worker (runs in the Ray actor) -------------------------------------------------------------------
class WorkerDict:
    """verl's colocated worker class, as far as Ray sees it: its name and its bound method names."""

    def __init__(self, dry_file: str = ""):
        self.dry_file = dry_file
        self.per_mm = 0.0
        self.torch = None

    def _gpu(self):
        if self.torch is None and not self.dry_file:
            import torch
            self.torch = torch
            bf = torch.bfloat16
            self.a = torch.randn(8192, 8192, device="cuda", dtype=bf)
            self.b = torch.randn(8192, 8192, device="cuda", dtype=bf)
            for _ in range(10):
                self.a @ self.b
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(100):
                self.a @ self.b
            torch.cuda.synchronize()
            self.per_mm = (time.perf_counter() - t) / 100

    def _sync(self):
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def _busy(self, sec: float) -> list:
        self._sync()
        t0 = time.time()
        if self.dry_file:
            with open(self.dry_file, "a") as f:
                f.write(f"{t0} 1\n")
            time.sleep(sec)
            t1 = time.time()
            with open(self.dry_file, "a") as f:
                f.write(f"{t1} 0\n")
            return ["busy", t0, t1]
        for _ in range(max(1, int(sec / self.per_mm))):
            self.a @ self.b
        self._sync()
        return ["busy", t0, time.time()]

    def _idle(self, sec: float) -> list:
        self._sync()
        t0 = time.time()
        time.sleep(sec)
        return ["idle", t0, time.time()]

    def _run(self, method: str, segs) -> dict:
        entry = time.time()
        out = [self._busy(s) if k == "busy" else self._idle(s) for k, s in segs]
        return {"method": method, "phase": method, "entry": entry, "exit": time.time(), "segments": out,
                "pid": os.getpid()}

    def actor_rollout_init_model(self, segs):
        entry = time.time()
        self._gpu()
        r = self._run("init_model", segs)
        r["entry"] = entry
        return r

    def actor_rollout_wake_up(self, segs):
        return self._run("wake_up", segs)

    def actor_rollout_generate_sequences(self, segs):
        return self._run("generate_sequences", segs)

    def actor_rollout_sleep(self, segs):
        return self._run("sleep", segs)

    def actor_rollout_compute_log_prob(self, segs):
        return self._run("compute_log_prob", segs)

    def actor_rollout_update_actor(self, segs):
        return self._run("update_actor", segs)

    def actor_rollout_update_weights(self, segs):
        return self._run("update_weights", segs)


def driver(gcs: str, truth_path: str, dry_file: str, steps: int) -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address=gcs, namespace="verl_run", log_to_driver=False)
    gpu = 0 if dry_file else 1
    bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
    pg = placement_group([bundle], strategy="STRICT_PACK", name=f"{PREFIX}verl_group_0:")
    ray.get(pg.ready(), timeout=120)
    w = ray.remote(WorkerDict).options(
        name=f"{PREFIX}WorkerDict_0:0", num_cpus=1, num_gpus=gpu, max_concurrency=1,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)).remote(dry_file)
    with open(truth_path, "w") as out:
        def record(r, step, fleet):
            r.update(step=step, fleet=fleet)
            out.write(json.dumps(r) + "\n")
            out.flush()
        time.sleep(1.0)
        record(ray.get(w.actor_rollout_init_model.remote(INIT)), -1, "actor")
        for step in range(steps):
            for method, fleet, segs in PLAN:
                time.sleep(GAP_S)
                record(ray.get(getattr(w, "actor_rollout_" + method).remote(segs)), step, fleet)
            time.sleep(STEP_END_S)
    print(json.dumps({"done": True}), flush=True)
    time.sleep(2.0)
    return 0


# -- a synthetic NVML device for --dry-run --------------------------------------------------------------------
class DryDevice:
    """One sample per 0.2 s; utilization = the busy share of its period, from the worker's busy file."""
    index, uuid, name = 0, "GPU-dry-run-fleet", "Dry Run GPU"

    def __init__(self, path: str):
        self.path, self.t0 = path, time.time()

    def _busy(self):
        marks, out, on = [], [], None
        try:
            with open(self.path) as f:
                marks = [(float(a), int(b)) for a, b in (ln.split() for ln in f if ln.strip())]
        except OSError:
            pass
        for t, b in marks:
            if b and on is None:
                on = t
            elif not b and on is not None:
                out.append((on, t))
                on = None
        if on is not None:
            out.append((on, float("inf")))
        return out

    def samples(self, last_us):
        busy = self._busy()
        out, now = [], time.time()
        t = (int(max(self.t0, last_us / 1e6) / 0.2) + 1) * 0.2
        while t <= now:
            b = sum(max(0.0, min(e, t) - max(s, t - 0.2)) for s, e in busy)
            out.append((int(round(t * 1e6)), int(round(100 * b / 0.2))))
            t += 0.2
        return out

    def memory(self):
        return 1 << 30, 141 << 30

    def power_watts(self):
        return 100.0

    def sm_clock_hz(self):
        return 1.98e9

    def pids(self):
        return frozenset()


class DryBackend:
    def __init__(self, path):
        self.dev = DryDevice(path)

    def open(self):
        return [self.dev]

    def close(self):
        pass


# -- the exporter's side ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((NODE_IP, 0))
        return s.getsockname()[1]


def stop_own(tag: str) -> None:
    """Stop this run's Ray processes only (their command lines name its temp dir)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        if tag.encode() in f.read():
                            os.kill(int(d), sig)
                except (OSError, ProcessLookupError):
                    pass
        time.sleep(2.0)


def run(args) -> dict:
    from omniwatch.discovery.rayapi import StateAPI
    from omniwatch.discovery.taskwatch import TaskPoller
    from omniwatch.gpu import fleettrace as ft
    from omniwatch.gpu.devices import NvmlBackend
    from omniwatch.gpu.fleet import FleetAccountant
    from omniwatch.gpu.sampler import GpuSampler

    work = tempfile.mkdtemp(prefix="owfl-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owfr", dir="/tmp")
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".ray"))
    with open(os.path.join(home, ".ray", "auth_token"), "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(HOME=home, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT / "exporter"), os.environ.get("PYTHONPATH", "")] if p))
    dry_file = os.path.join(work, "busy.txt") if args.dry_run else ""
    gcs_port, dash_port = free_port(), free_port()
    dash = f"http://{NODE_IP}:{dash_port}"
    t_start = time.time()
    meta = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "argv": sys.argv[1:]}
    r = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={gcs_port}",
                        f"--dashboard-port={dash_port}", f"--node-ip-address={NODE_IP}", "--dashboard-host=127.0.0.1",
                        "--num-cpus=8", f"--num-gpus={0 if args.dry_run else 1}", f"--temp-dir={ray_tmp}",
                        "--include-dashboard=true", "--disable-usage-stats"], capture_output=True, text=True,
                       timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError("ray start failed: " + (r.stdout + r.stderr)[-3000:])
    procs = []
    try:
        api = StateAPI(dash, timeout=10)
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if api.list("nodes").rows:
                    break
            except Exception:
                pass
            time.sleep(1.0)
        else:
            raise RuntimeError("Ray's state API did not answer")
        api.close()
        backend = DryBackend(dry_file) if args.dry_run else NvmlBackend()
        sampler = GpuSampler(backend, None, node=NODE_IP, interval_s=1.0)
        poller = TaskPoller(dash, interval=args.interval, timeout=10)
        acct = FleetAccountant(sampler, poller, lambda: ("gpubill", "fleet"), None, addresses=set(),
                               observe=args.observe_s)
        acct.trace = []
        rec = ft.Recorder().attach(poller, sampler, acct, acct.observer)
        poll_costs = []
        orig = poller.poll

        def poll(now=None):
            snap = orig(now)
            poll_costs.append([snap.cost.calls, snap.cost.bytes, round(snap.cost.wall_s, 4), round(snap.cost.cpu_s, 4)])
            return snap
        poller.poll = poll
        poller.start()
        sampler.start()
        truth_path = os.path.join(work, "truth.jsonl")
        dp = subprocess.Popen([sys.executable, __file__, "--driver", f"{NODE_IP}:{gcs_port}", truth_path,
                               dry_file or "-", str(args.steps)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        procs.append(dp)
        out, _ = dp.communicate(timeout=args.timeout)
        t_done = time.time()
        truth = [json.loads(x) for x in open(truth_path)] if os.path.exists(truth_path) else []
        if dp.returncode != 0 or not truth:
            raise RuntimeError(f"driver failed rc={dp.returncode}: {out[-3000:]}")
        last_exit = max(c["exit"] for c in truth)
        deadline = time.time() + 60
        while time.time() < deadline:   # until every call is attributed (the horizon trails the last poll)
            with acct.lock:
                done = acct.until and min(acct.until.values()) > last_exit + 1.0
            if done:
                break
            time.sleep(0.5)
        poller.stop()
        sampler.stop()
        acct.close()
        for c in truth:
            c["phase"] = c["phase"]
        live = ft.score(truth, acct, acct.trace)
        with acct.lock:
            live_series = sorted([list(k), round(v, 4)] for k, v in acct.totals.items())
        node_id = next(iter(poller.ledger.node_info), "")
        doc = rec.document(sampler, node_id="", run=("gpubill", "fleet"), interval=args.interval, truth=truth,
                           live={"score": {k: v for k, v in live.items() if k != "calls_below_95pct"},
                                 "series": live_series})
        replayed = {}
        for name, kw in (("replay", {}), ("replay_poll_time_view", {"finals": False, "observe": False})):
            rr = ft.replay(json.loads(json.dumps(doc)), trace=True, **kw)
            replayed[name] = dict(ft.score(truth, rr["accountant"], rr["accountant"].trace),
                                  mismatches=rr["mismatches"])
        led = poller.ledger
        res = {
            "host": platform.node(), "python": platform.python_version(), "dry_run": args.dry_run,
            "poll_interval_s": args.interval, "observer_interval_s": args.observe_s, "steps": args.steps,
            "wall_s": round(t_done - t_start, 1), "ray_node_id": node_id,
            "gpu": [g.name for g in sampler.snapshot()], "sampler_cpu_s": round(sampler.cpu_s, 3),
            "ledger": {"finals_exact": led.finals_exact, "finals_estimated": led.finals_estimated,
                       "recovered": led.recovered, "done": len(led.done), "bad_rows": led.bad_rows},
            "recovery": {"pages": poller.recovery.pages, "cut_pages": poller.recovery.cut_pages,
                         "observed_only": poller.recovery.observed, "given_up": len(poller.recovery.given_up)},
            "observer": {"samples": acct.observer.samples if acct.observer else 0,
                         "unreadable": acct.observer.unreadable if acct.observer else 0},
            "accountant": {"observed_s": round(acct.observed_s, 3), "skipped_s": round(acct.skipped_s, 3)},
            "poll_cost": {"polls": len(poll_costs), "calls_median": _median([c[0] for c in poll_costs]),
                          "calls_max": max((c[0] for c in poll_costs), default=0),
                          "bytes_median": _median([c[1] for c in poll_costs]),
                          "wall_s_median": _median([c[2] for c in poll_costs]),
                          "cpu_s_median": _median([c[3] for c in poll_costs])},
            "live": live, **replayed, "meta": dict(meta, section_wall_s=round(t_done - t_start, 1))}
        return {"results": res, "doc": doc}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop_own(ray_tmp)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


RECORDED = ("gpu", "python", "poll_interval_s", "observer_interval_s", "steps", "wall_s", "sampler_cpu_s", "ledger",
            "recovery", "observer", "accountant", "poll_cost", "live", "replay", "replay_poll_time_view")


def record_result(path: Path, res: dict) -> None:
    """Put a run under ``gpu_fleet`` in a results.json (docs/benchmarks.md's block), the other sections kept."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        results = {}
    sec = {k: res.get(k) for k in RECORDED}
    for name in ("live", "replay", "replay_poll_time_view"):   # the per-call list is in the run's own file
        if isinstance(sec.get(name), dict):
            sec[name] = {k: v for k, v in sec[name].items() if k != "calls_below_95pct"}
    sec["meta"] = res.get("meta") or {}
    results["gpu_fleet"] = sec
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        _, _, gcs, truth, dry, steps = sys.argv
        return driver(gcs, truth, "" if dry == "-" else dry, int(steps))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU Ray and a synthetic NVML device (plumbing only)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--interval", type=float, default=5.0, help="task-event poll interval (default: the exporter's)")
    ap.add_argument("--observe-s", type=float, default=0.05, help="call observer interval (default: the exporter's)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--results", help="record this run under 'gpu_fleet' in this results.json (not with --dry-run)")
    ap.add_argument("--record", metavar="RESULT_JSON", help="run nothing: record the gpu_fleet_validation.json of a "
                    "finished GPU run into --results")
    args = ap.parse_args()
    if args.record:
        if not args.results:
            ap.error("--record needs --results")
        record_result(Path(args.results), json.loads(Path(args.record).read_text()))
        return 0
    if args.results and args.dry_run:
        ap.error("--results records a real GPU run; a --dry-run's figures are synthetic")
    os.makedirs(args.out, exist_ok=True)
    got = run(args)
    with open(os.path.join(args.out, "gpu_fleet_validation.json"), "w") as f:
        json.dump(got["results"], f, indent=1)
    with open(os.path.join(args.out, "h200_fleet.trace.json" if not args.dry_run else "dry_fleet.trace.json"), "w") as f:
        json.dump(got["doc"], f, separators=(",", ":"))
    r = got["results"]
    if args.results:
        record_result(Path(args.results), r)
    for name in ("live", "replay", "replay_poll_time_view"):
        b = r[name]["buckets"]
        print(name, {k: (v["truth_s"], v["measured_s"], v["error_pct"]) for k, v in b.items()},
              "calls", r[name].get("calls"), "min share", r[name].get("calls_min_share"), flush=True)
    print(json.dumps({k: r[k] for k in ("ledger", "recovery", "observer", "accountant", "poll_cost", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
