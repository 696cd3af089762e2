"""Per-fleet GPU time across a cluster (issue 33 items 3 and 4), run INSIDE a private network namespace:

    unshare -n sh -c 'ip link set lo up && exec python tests/fleet_cluster_scenario.py OUT.json'

A CPU Ray 2.60 cluster of two nodes on one host (``ray.cluster_utils.Cluster``: a head with the dashboard and a
second raylet, each declaring 3 GPUs), the real exporter app with the task-event source on (1 s polls) and the
agent registry, and one real node agent per Ray node (``NodeAgent`` with its Ray node id, a simulated 3-GPU
sampler that reads 100 % busy, its ledger mirror, call observer and fleet report). The driver
(tests/fleet_cluster_trainer.py) places GPU pools and WorkerDict ranks as verl does: two ranks per node, a
teacher pool and a standalone rollout pool. Then: both agents attribute their node's calls; a pushed step makes
the run exist, so its GPUs from Ray's placement groups show; one agent stops beating (its node is then counted
unmeasured). Writes what it saw to OUT.json for tests/test_fleet_cluster_live.py. Bounded waits only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ray_start import ray_start_lock  # noqa: E402

TOKEN = "fleet-cluster-token"
STEPS = 4
POLL_S = 1.0
GPUS_PER_NODE = 3
obs: dict = {"steps": []}
T0 = time.monotonic()


def step(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[fleet {time.monotonic() - T0:6.1f}s] {name}", flush=True)


def wait_for(what: str, fn, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
        except Exception:
            v = None
        if v:
            return v
        time.sleep(every)
    obs.setdefault("timeouts", []).append(what)
    return None


class SimGpu:
    """One simulated GPU: an NVML utilization sample every 0.2 s of the wall clock, always 100 % busy."""

    def __init__(self, index: int, node: str):
        self.index, self.uuid, self.name = index, f"GPU-sim-{node}-{index}", "Simulated GPU"
        self.t0 = time.time()

    def samples(self, last_us: int):
        now, out = time.time(), []
        t = (int(max(self.t0, last_us / 1e6) / 0.2) + 1) * 0.2
        while t <= now:
            out.append((int(round(t * 1e6)), 100))
            t += 0.2
        return out

    def memory(self):
        return 1 << 30, 80 << 30

    def power_watts(self):
        return 300.0

    def sm_clock_hz(self):
        return 1.9e9

    def pids(self):
        return frozenset()


class SimBackend:
    def __init__(self, node: str):
        self.devices = [SimGpu(i, node) for i in range(GPUS_PER_NODE)]

    def open(self):
        return list(self.devices)

    def close(self):
        pass


def metrics(url: str) -> str:
    import httpx
    return httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text


def fleet_series(url: str) -> list[dict]:
    from prometheus_client.parser import text_string_to_metric_families
    out = []
    for f in text_string_to_metric_families(metrics(url)):
        if f.name in ("omniwatch_gpu_fleet_seconds", "omniwatch_gpu_fleet_gpus", "omniwatch_run_gpus",
                      "omniwatch_run_pool_gpus"):
            out += [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples
                    if not s.name.endswith("_created")]
    return out


def main(out_path: str) -> int:
    os.environ["OMNIWATCH_PUSH_TOKEN"] = TOKEN
    ray_tmp = tempfile.mkdtemp(prefix="owf", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ.pop("RAY_ADDRESS", None)
    work = Path(tempfile.mkdtemp(prefix="owfleet-"))
    cluster = srv = driver = None
    agents = []
    try:
        import httpx
        from ray.cluster_utils import Cluster

        from omniwatch.agents.node import NodeAgent
        from omniwatch.discovery.config import DiscoveryConfig
        from omniwatch.proc import free_port
        from omniwatch.httpguard import BackgroundServer
        from omniwatch.server import Exporter
        from omniwatch.settings import Settings

        step("ray cluster: 2 nodes x 3 GPUs")
        dash_port = free_port()
        node = {"num_cpus": 4, "num_gpus": GPUS_PER_NODE, "node_ip_address": "127.0.0.1",
                "object_store_memory": 80 << 20}
        with ray_start_lock():
            cluster = Cluster(initialize_head=True, head_node_args=dict(
                node, include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=dash_port))
            nodes = [cluster.head_node, cluster.add_node(**node)]
            cluster.wait_for_nodes()
        obs["nodes"] = [n.node_id for n in nodes]
        dash = f"http://127.0.0.1:{dash_port}"

        step("exporter (task events every 1 s)")
        settings = Settings.from_env(port=0)
        settings.push_token = TOKEN
        settings.extra.update(gpu="off", discovery=DiscoveryConfig(
            ray_address=None, ray_sd_file=None, ray_tasks=dash, ray_tasks_interval=POLL_S, project="proj",
            experiment="fleet"))
        ex = Exporter.build(settings)
        ex.app.state.fleet_nodes.down_lag_s = 2.0   # the test cannot wait the default 30 s
        srv = BackgroundServer(ex.app).start()
        exp = srv.url
        from omniwatch.discovery.rayapi import StateAPI
        api = StateAPI(dash, timeout=10)
        obs["state_api"] = bool(wait_for("state API", lambda: api.list("nodes").rows, 120, 1.0))

        step("one agent per node")
        for i, n in enumerate(nodes):
            a = NodeAgent("127.0.0.1", 0, node=f"node{i}", gpu="on", exporter_url=exp, token=TOKEN, heartbeat_s=1.0,
                          node_id=n.node_id, extra={"gpu_backend": SimBackend(f"node{i}"), "gpu_interval_s": 0.5})
            agents.append(a.start())
        obs["agents_fleet"] = [a.fleet is not None for a in agents]

        step("driver: verl-shaped pools and ranks")
        truth_path = work / "truth.json"
        driver = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fleet_cluster_trainer.py"), cluster.address,
                                   str(truth_path), str(STEPS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(iter(driver.stdout.readline, "")), daemon=True).start()
        wait_for("driver done", lambda: truth_path.exists() and any('"done"' in x for x in lines), 240, 0.5)
        obs["driver_out"] = lines[-20:]
        truth = json.loads(truth_path.read_text()) if truth_path.exists() else []
        obs["truth"] = truth
        last_end = max((t["end"] for t in truth), default=time.time())

        step("both agents attribute past the last call")
        def caught_up():
            return all(a.fleet.reports and min(a.fleet.accountant.until.values(), default=0) > last_end + 0.5
                       and a.fleet.report() for a in agents)
        obs["caught_up"] = bool(wait_for("agents caught up", caught_up, 90, 0.5))
        obs["agent_state"] = [{"node": a.node, "node_id": a.node_id, "since": min(a.fleet.accountant.since.values(), default=0),
                               "until": min(a.fleet.accountant.until.values(), default=0),
                               "observed_s": a.fleet.accountant.observed_s, "mirror_fetches": a.fleet.mirror.fetches,
                               "mirror_bad_rows": a.fleet.mirror.bad_rows, "reports": a.fleet.reports}
                              for a in agents]
        poller = ex.app.state.ray_tasks
        obs["ledger"] = {"finals_exact": poller.ledger.finals_exact, "finals_estimated": poller.ledger.finals_estimated,
                         "recovered": poller.ledger.recovered, "pools": poller.pools,
                         "recovery_pages": poller.recovery.pages}
        with poller.lock:
            obs["ledger_calls"] = [{"name": t.name, "actor": t.actor_id, "node": t.node_id, "start": t.start,
                                    "end": t.end, "final": t.final, "recovered": t.recovered}
                                   for t in poller.ledger.done]
            obs["actors"] = [{"id": a.actor_id, "name": a.name, "node": a.node_id, "pid": a.pid, "state": a.state}
                             for a in poller.ledger.actors.values()]
            obs["created"] = dict(poller.ledger.created)
        from omniwatch.discovery.taskfinal import creation_task_id
        aid = next(a["id"] for a in obs["actors"] if "WorkerDict" in a["name"])
        obs["creation_rows"] = [{k: r.get(k) for k in ("task_id", "name", "type", "state", "start_time_ms", "end_time_ms")}
                                for r in api.list("tasks", [("task_id", "=", creation_task_id(aid))], detail=True).rows]
        obs["creation_by_actor"] = [{k: r.get(k) for k in ("task_id", "name", "type", "state", "start_time_ms", "end_time_ms")}
                                    for r in api.list("tasks", [("actor_id", "=", aid)], detail=True).rows
                                    if r.get("type") == "ACTOR_CREATION_TASK"]
        rows = api.list("placement_groups", detail=True).rows
        obs["placement_groups"] = [{"name": r.get("name"), "state": r.get("state"),
                                    "bundles": [b.get("unit_resources") for b in r.get("bundles") or []]} for r in rows]

        step("a pushed step makes the run exist: its GPUs from Ray's placement groups")
        httpx.post(f"{exp}/api/v1/push", headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False, timeout=10,
                   json={"project": "proj", "experiment": "fleet", "step": 1, "data": {"timing_s/step": 10.0}})
        obs["series"] = wait_for("run gpus", lambda: (lambda s: s if any(x["name"] == "omniwatch_run_gpus" for x in s)
                                                      else None)(fleet_series(exp)), 30, 0.5)

        step("agent node1 stops beating (no deregistration)")
        dead = agents[1]
        dead.fleet._report.stop()
        dead.heartbeat.stop(deregister=False)
        t_dead = time.time()
        def down_counted():
            s = fleet_series(exp)
            hit = [x for x in s if x["labels"].get("node") == "node1" and x["labels"].get("bucket") == "unmeasured"
                   and x["value"] > 2.0]
            return s if hit else None
        obs["series_down"] = wait_for("unmeasured counted", down_counted, 60, 0.5)
        obs["down_after_s"] = round(time.time() - t_dead, 1)
        obs["agents_api"] = httpx.get(f"{exp}/api/v1/agents", timeout=10, trust_env=False).json()
    except Exception:
        obs["error"] = traceback.format_exc()
    finally:
        for a in agents:
            try:
                a.stop(deregister=False)
            except Exception:
                pass
        if driver is not None:
            driver.kill()
        if srv is not None:
            srv.stop()
        if cluster is not None:
            try:
                cluster.shutdown()
            except Exception:
                pass
        with open(out_path, "w") as f:
            json.dump(obs, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
