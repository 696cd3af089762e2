"""Node agents end to end, run INSIDE a private network namespace (everything binds 127.0.0.1):

    unshare -n sh -c 'ip link set lo up && exec python tests/agents_scenario.py OUT.json'

A real 3-node Ray cluster on one host (ray.cluster_utils.Cluster), the real exporter app with the
agent registry, a real Prometheus reading the agents' HTTP service discovery and evaluating the
rules of alerts/ (holds shortened to 1 s). Then: ``omniwatch.agents.start()`` (one agent per node,
idempotent), a node joins (gets an agent), an agent is killed (SD drops it, OmniwatchSourceDown
fires, the supervisor replaces it), a node is removed (SD drops it, the alert fires), ``stop()``.
Writes observations to OUT.json for tests/test_agents_live.py to assert on. Bounded waits only.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ray_start import ray_start_lock  # noqa: E402
from scale_support import Prometheus, cpu_seconds, fast_rule_files, http, poll  # noqa: E402

NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
TOKEN = "agents-scenario-token"
HEARTBEAT_S = 1.0
RECONCILE_S = 20.0   # longer than TTL (4 s) + sweep + scrape + eval + hold, so a killed agent alerts before it is replaced
obs: dict = {"steps": []}
T0 = time.monotonic()


def step(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[agents {time.monotonic() - T0:6.1f}s] {name}", flush=True)


def sd(exp: str) -> dict[str, str]:
    """node label -> address, from the exporter's agent SD."""
    return {g["labels"]["node"]: g["targets"][0] for g in http.get(f"{exp}/api/v1/agents/sd").json()}


def source_up(exp: str) -> dict[str, float]:
    out = {}
    for ln in http.get(f"{exp}/metrics").text.splitlines():
        if ln.startswith('omniwatch_source_up{source="agent"'):
            target = ln.split('target="', 1)[1].split('"', 1)[0]
            out[target] = float(ln.rsplit(" ", 1)[1])
    return out


def firing_for(prom: Prometheus, node: str) -> bool:
    return any(a["labels"].get("source") == "agent" and a["labels"].get("target") == node
               for a in prom.alerts("OmniwatchSourceDown", "firing"))


def main(out_path: str) -> int:
    os.environ["OMNIWATCH_PUSH_TOKEN"] = TOKEN
    ray_tmp = tempfile.mkdtemp(prefix="owa", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ.pop("RAY_ADDRESS", None)
    work = Path(tempfile.mkdtemp(prefix="owagents-"))
    import ray
    from ray.cluster_utils import Cluster

    from omniwatch import agents
    from omniwatch.httpguard import BackgroundServer
    from omniwatch.server import Exporter
    from omniwatch.settings import Settings

    cluster = srv = prom = None
    try:
        step("exporter")
        settings = Settings.from_env(port=0)
        settings.extra["discovery"] = False
        settings.extra["gpu"] = "off"
        ex = Exporter.build(settings)
        srv = BackgroundServer(ex.app).start()
        exp = srv.url

        step("prometheus")
        rules = work / "rules"
        rules.mkdir()
        prom = Prometheus({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in fast_rule_files(rules)],
            "scrape_configs": [
                {"job_name": "omniwatch", "static_configs": [{"targets": [f"{srv.host}:{srv.port}"]}]},
                {"job_name": "omniwatch-agent",
                 "http_sd_configs": [{"url": f"{exp}/api/v1/agents/sd", "refresh_interval": "1s"}]}]},
            workdir=work / "prom").start()

        step("ray cluster: 3 nodes")
        with ray_start_lock():  # one Ray start at a time on this machine (tests/ray_start.py)
            cluster = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
            nodes = [cluster.head_node] + [cluster.add_node(**NODE) for _ in range(2)]
            cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="omniwatch", log_to_driver=False)
        obs["nodes"] = [n.node_id for n in nodes]

        step("agents.start")
        st = agents.start(exporter_url=exp, heartbeat_s=HEARTBEAT_S, reconcile_s=RECONCILE_S, gpu="off")
        obs["start1"] = st
        obs["sd1"] = poll(lambda: (lambda d: d if len(d) == 3 else None)(sd(exp)), 30)
        obs["prom_up1"] = poll(lambda: (lambda r: r if len(r) == 3 and all(x["value"][1] == "1" for x in r) else None)(
            prom.query('up{job="omniwatch-agent"}')), 30)
        obs["prom_nodes1"] = sorted(x["metric"].get("node", "") for x in obs["prom_up1"] or [])

        step("agents.start again (idempotent)")
        obs["start2"] = agents.start(exporter_url=exp, heartbeat_s=HEARTBEAT_S, reconcile_s=RECONCILE_S, gpu="off")

        step("agent CPU cost")
        pids = [a["pid"] for a in st["agents"].values() if "pid" in a]
        c0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        time.sleep(10)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}/stat")]
        obs["agents_died_during_cpu_window"] = sorted(set(pids) - set(alive))
        c1, t1 = sum(cpu_seconds(p) for p in alive), time.monotonic()
        c0 = sum(cpu_seconds(p) for p in alive) if alive != pids else c0
        obs["agent_cpu_fraction_each"] = (c1 - c0) / (t1 - t0) / max(1, len(pids))

        step("a node joins")
        n4 = cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        obs["n4"] = n4.node_id
        obs["sd_join"] = poll(lambda: (lambda d: d if len(d) == 4 else None)(sd(exp)), RECONCILE_S + 30)

        step("kill one agent (right after a reconcile round)")
        sup = ray.get_actor(agents.placement.SUPERVISOR, namespace="omniwatch")
        rounds = ray.get(sup.status.remote())["rounds"]
        poll(lambda: ray.get(sup.status.remote())["rounds"] > rounds, RECONCILE_S + 30, 0.2)
        cur = ray.get(sup.status.remote())["agents"]
        victim = next(a for nid, a in cur.items() if nid != cluster.head_node.node_id and nid != n4.node_id)
        obs["victim"] = victim
        os.kill(victim["pid"], signal.SIGKILL)
        obs["kill_sd_dropped"] = bool(poll(lambda: victim["node"] not in sd(exp), 15, 0.2))
        obs["kill_source_up"] = source_up(exp).get(victim["node"])
        obs["kill_alert"] = bool(poll(lambda: firing_for(prom, victim["node"]), 15, 0.3))
        step("wait for the replacement")
        back = poll(lambda: (lambda d: d.get(victim["node"]) if d.get(victim["node"]) else None)(sd(exp)), RECONCILE_S + 30)
        obs["replaced_address"] = back
        # the new agent registers with the exporter (SD above) before the supervisor's round that started it
        # records its pid: wait for the supervisor's record to change too
        def new_pid():
            pid = ray.get(sup.status.remote())["agents"].get(victim["node_id"], {}).get("pid")
            return pid if pid and pid != victim["pid"] else None
        obs["replaced_pid"] = poll(new_pid, RECONCILE_S + 30, 0.2)
        obs["replaced_source_up"] = poll(lambda: source_up(exp).get(victim["node"]) == 1.0, 10)

        step("remove a node")
        gone = next(a for nid, a in ray.get(sup.status.remote())["agents"].items() if nid == n4.node_id)
        obs["gone"] = gone
        cluster.remove_node(n4)
        obs["remove_sd_dropped"] = bool(poll(lambda: gone["node"] not in sd(exp), 30, 0.3))
        obs["remove_alert"] = bool(poll(lambda: firing_for(prom, gone["node"]), 20, 0.3))

        step("placement per node after a reconcile round")
        obs["final"] = ray.get(sup.reconcile.remote(), timeout=120)
        obs["alive_nodes"] = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))

        step("agents.stop")
        obs["stopped"] = agents.stop()
        poll(lambda: sd(exp) == {}, 15)
        obs["sd_after_stop"] = sd(exp)
        obs["actors_after_stop"] = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                                    if a.get("namespace") == "omniwatch"]
        obs["ok"] = True
    except Exception:
        obs["error"] = traceback.format_exc()
    finally:
        step("cleanup")
        for fn in (lambda: ray.shutdown(), lambda: cluster and cluster.shutdown(), lambda: prom and prom.stop(),
                   lambda: srv and srv.stop()):
            try:
                fn()
            except Exception:
                obs.setdefault("cleanup_errors", []).append(traceback.format_exc()[-500:])
        Path(out_path).write_text(json.dumps(obs, indent=1, default=str))
        import shutil
        for d in (ray_tmp, work):
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
