"""Trainer-side overhead of the Ray task-event source (issue 24, ``make bench``): a CPU worker-group loop on
verl's real single controller, timed with and without omniwatch's poller reading the same cluster.

    .venv/bin/python benchmarks/raytasks_overhead.py [--pairs 8] [--steps 10] [--intervals 5 0.5]

What runs (inside ``unshare -n``, as the Ray tests do: the cluster sees only loopback):

- a Ray 2.60 head (``ray start --head``, token authentication on, as Ray 2.60's default);
- the driver: ``RayResourcePool([4], use_gpu=False)`` + ``create_colocated_worker_cls`` + ``RayWorkerGroup``
  (verl's real single controller, the legacy diffusion trainer's construction), a ``WorkerDict`` of 4 ranks
  whose ``@register(Dispatch.ONE_TO_ALL)`` methods (named as VeRL-Omni's workers: ``generate_sequences``,
  ``infer_actor_batch``, ``update_actor``, ``update_weights``) each do a fixed amount of CPU work; one step =
  the four dispatches, each ``ray.get`` of all ranks, as verl's driver does;
- omniwatch's ``TaskPoller`` (the exporter's task-event source: 3 state-API calls per poll + the actor and node
  tables when new) in a process of its own, as the exporter is, polling only while a flag file exists.

Blocks of ``--steps`` steps alternate poller off / on in ABBA order (off-on, on-off, ...) so drift in this
machine's load (2 cores shared with other work) cancels; the ratio is on / off step time per pair, reported as
the median over pairs and as total on time / total off time. Goal: <= 1.01 at the default 5 s interval.

Without Ray 2.60 + verl in this Python (``bash .ci/install-ray-tq.sh .venv``) or without ``unshare -n`` the
benchmark records ``{"status": "skipped", "why": ...}`` instead of numbers (the docs say so).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK_ITERS = 120_000   # ~10-20 ms of pure-Python work per call on one free core
PHASES = ("generate_sequences", "infer_actor_batch", "update_actor", "update_weights")


def missing() -> str | None:
    import importlib.util
    for mod in ("ray", "verl"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed in this Python (bash .ci/install-ray-tq.sh .venv installs Ray 2.60 and verl)"
    if shutil.which("unshare") is None:
        return "unshare is not on PATH (the Ray benchmark runs in a private network namespace)"
    r = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare -n is not permitted here ({r.stderr.strip()[:120]})"
    return None


def run(pairs: int = 8, steps: int = 10, intervals: tuple[float, ...] = (5.0, 0.5), timeout: float = 1200) -> dict:
    why = missing()
    if why:
        return {"status": "skipped", "why": why}
    out = Path(tempfile.mkdtemp(prefix="owov-")) / "overhead.json"
    bindir = os.path.dirname(sys.executable)
    args = f"--inside {out} --pairs {pairs} --steps {steps} --intervals {' '.join(str(i) for i in intervals)}"
    cmd = f"ip link set lo up && PATH={bindir}:$PATH exec {sys.executable} {Path(__file__).resolve()} {args}"
    r = subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if not out.exists():
        return {"error": f"the benchmark wrote nothing (rc={r.returncode}): {(r.stdout + r.stderr)[-600:]}"}
    res = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return res


# -- inside the namespace ------------------------------------------------------------------------------
POLLER = r"""
import os, sys, time, json
from omniwatch.discovery.taskwatch import TaskPoller
dash, interval, flag, stop, stats = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
p = TaskPoller(dash, interval=interval, timeout=5)
polls = cpu = calls = 0
while not os.path.exists(stop):
    if os.path.exists(flag):
        c0 = time.process_time()
        try:
            with p.lock:
                snap = p.poll()
            calls += snap.cost.calls
        except Exception as e:
            print("poll failed:", e, file=sys.stderr, flush=True)
        polls += 1
        cpu += time.process_time() - c0
        with open(stats, "w") as f:
            json.dump({"polls": polls, "cpu_s": cpu, "calls": calls}, f)
        t = time.monotonic()
        while time.monotonic() - t < interval and os.path.exists(flag) and not os.path.exists(stop):
            time.sleep(0.02)
    else:
        time.sleep(0.02)
"""


def head_cpu_s(ray_tmp: str) -> float:
    """CPU seconds so far of this cluster's head processes (GCS, raylet, the dashboard that serves the state
    API, its agents): the processes whose command line names the cluster's temp dir. Workers rename
    themselves (``ray::WorkerDict...``) and are not counted: their time is the step time."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if ray_tmp.encode() not in f.read():
                    continue
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tck
        except (OSError, IndexError, ValueError):
            pass
    return total


def inside(out_path: str, pairs: int, steps: int, intervals: list[float]) -> int:
    from omniwatch.proc import free_port
    sys.path.insert(0, str(ROOT / "tests"))
    from discovery_scenario import stop_own_ray
    work = tempfile.mkdtemp(prefix="owov-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owov", dir="/tmp")
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".ray"))
    with open(os.path.join(home, ".ray", "auth_token"), "w") as f:
        f.write(secrets.token_hex(32))
    env = dict(os.environ, HOME=home, RAY_AUTH_MODE="token", RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    os.environ.update(RAY_AUTH_MODE="token", HOME=home, RAY_USAGE_STATS_ENABLED="0")
    gcs_port, dash_port = free_port(), free_port()
    dash = f"http://127.0.0.1:{dash_port}"
    res: dict = {"workers": 4, "steps_per_block": steps, "pairs": pairs, "phases": list(PHASES),
                 "work_iters_per_call": WORK_ITERS, "intervals": []}
    poller = None
    try:
        for attempt in range(2):   # a loaded machine can time Ray's node startup out: one retry
            r = subprocess.run(["ray", "start", "--head", f"--port={gcs_port}", f"--dashboard-port={dash_port}",
                                "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--num-cpus=8",
                                f"--temp-dir={ray_tmp}", "--include-dashboard=true", "--disable-usage-stats"],
                               capture_output=True, text=True, timeout=240, env=env)
            if r.returncode == 0:
                break
            stop_own_ray(ray_tmp)
            res["ray_start_retries"] = attempt + 1
        if r.returncode != 0:
            raise RuntimeError(f"ray start failed: {(r.stdout + r.stderr)[-400:]}")
        import ray
        from verl.single_controller.base import Worker
        from verl.single_controller.base.decorator import Dispatch, register
        from verl.single_controller.ray import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,
                                                create_colocated_worker_cls)

        def cpu_work(n: int = WORK_ITERS) -> int:
            s = 0
            for i in range(n):
                s += i * i
            return s

        class ActorRolloutRefWorker(Worker):
            @register(dispatch_mode=Dispatch.ONE_TO_ALL)
            def generate_sequences(self, step: int):
                return cpu_work()

            @register(dispatch_mode=Dispatch.ONE_TO_ALL)
            def infer_actor_batch(self, step: int):
                return cpu_work()

            @register(dispatch_mode=Dispatch.ONE_TO_ALL)
            def update_actor(self, step: int):
                return cpu_work()

            @register(dispatch_mode=Dispatch.ONE_TO_ALL)
            def update_weights(self, step: int):
                return cpu_work()

        ray.init(address=f"127.0.0.1:{gcs_port}", namespace="verl_bench", log_to_driver=False)
        pool = RayResourcePool([4], use_gpu=False, max_colocate_count=1)
        cls = create_colocated_worker_cls({"actor_rollout": RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker))})
        wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu", use_gpu=False)
        wg = wg.spawn(prefix_set={"actor_rollout"})["actor_rollout"]

        def step(k: int) -> float:
            t0 = time.perf_counter()
            for ph in PHASES:
                getattr(wg, ph)(k)   # ONE_TO_ALL: one call per rank, the driver waits for all (ray.get)
            return time.perf_counter() - t0

        for k in range(2 * steps):   # warm-up: workers, Ray's task-event pipeline
            step(k)
        flag, stop = os.path.join(work, "poll.on"), os.path.join(work, "poll.stop")
        for interval in intervals:
            stats = os.path.join(work, f"stats-{interval}.json")
            poller = subprocess.Popen([sys.executable, "-c", POLLER, dash, str(interval), flag, stop, stats],
                                      env=env, stderr=subprocess.PIPE, text=True)
            on_t: list[float] = []
            off_t: list[float] = []
            ratios = []
            head = {"on": 0.0, "off": 0.0}
            wall = {"on": 0.0, "off": 0.0}
            k = 0
            for p in range(pairs):
                order = ("off", "on") if p % 2 == 0 else ("on", "off")
                block = {}
                for mode in order:
                    if mode == "on":
                        open(flag, "w").close()
                        time.sleep(0.2)
                    elif os.path.exists(flag):
                        os.remove(flag)
                        time.sleep(0.2)
                    h0, w0 = head_cpu_s(ray_tmp), time.perf_counter()
                    ts = [step(k + i) for i in range(steps)]
                    head[mode] += head_cpu_s(ray_tmp) - h0
                    wall[mode] += time.perf_counter() - w0
                    k += steps
                    block[mode] = statistics.mean(ts)
                    (on_t if mode == "on" else off_t).extend(ts)
                ratios.append(block["on"] / block["off"])
            if os.path.exists(flag):
                os.remove(flag)
            open(stop, "w").close()
            poller.wait(timeout=30)
            os.remove(stop)
            st = json.loads(Path(stats).read_text()) if os.path.exists(stats) else {"polls": 0, "cpu_s": 0, "calls": 0}
            res["intervals"].append({
                "interval_s": interval, "step_s_off_median": statistics.median(off_t),
                "step_s_on_median": statistics.median(on_t),
                "ratio_median_of_pairs": statistics.median(ratios),
                "ratio_total": sum(on_t) / sum(off_t),
                "pair_ratios": [round(x, 4) for x in ratios],
                "polls": st["polls"], "state_api_calls": st["calls"], "poller_cpu_s": round(st["cpu_s"], 3),
                "head_cpu_share_on": round(head["on"] / wall["on"], 4), "head_cpu_share_off": round(head["off"] / wall["off"], 4),
                "head_cpu_s_per_poll": round((head["on"] / wall["on"] - head["off"] / wall["off"]) * wall["on"]
                                             / max(1, st["polls"]), 4),
                "load_avg": [round(x, 2) for x in os.getloadavg()],
                "on_seconds": round(sum(on_t), 1)})
            poller = None
        ray.shutdown()
    except Exception as e:  # recorded, not raised: the caller reports it
        import traceback
        res["error"] = f"{type(e).__name__}: {e}"[:400]
        res["trace"] = traceback.format_exc()[-1500:]
    finally:
        if poller is not None:
            poller.kill()
        try:
            stop_own_ray(ray_tmp)
        except Exception:
            pass
        with open(out_path, "w") as f:
            json.dump(res, f)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)   # the cluster's sessions and sockets (its processes are stopped)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inside")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--intervals", type=float, nargs="+", default=[5.0, 0.5])
    a = ap.parse_args(argv)
    if a.inside:
        return inside(a.inside, a.pairs, a.steps, a.intervals)
    print(json.dumps(run(a.pairs, a.steps, tuple(a.intervals)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
