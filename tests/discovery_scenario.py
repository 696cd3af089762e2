"""Discovery end to end, run INSIDE a private network namespace (``unshare -n`` + ``ip link set lo up``)
so every Ray / TransferQueue endpoint binds 127.0.0.1. Started by tests/test_discovery_live.py:

    unshare -n sh -c 'ip link set lo up && exec python tests/discovery_scenario.py OUT.json'

Starts a real Ray head, the real omniwatch exporter app (uvicorn), stand-in vLLM-Omni / vLLM
servers registered the way verl registers them (the rollout prometheus.yml verl writes; a Ray
actor named ``vllm_server_reward_0_0``), a real TransferQueue with metrics on, and a real
Prometheus reading /api/v1/sd and loading alerts/endpoints.rules.yml. Writes what it observed to
OUT.json; the pytest asserts on that. Every wait is bounded; everything started is stopped.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import httpx
import yaml

from omniwatch import proc
from omniwatch.proc import free_port
from omniwatch.promapi import PromAPI, PromError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
PY = sys.executable
PROJECT, EXPERIMENT = "proj", "exp1"
PUSH_TOKEN = "discovery-scenario-push-token"
http = httpx.Client(timeout=5, trust_env=False)
procs: list[subprocess.Popen] = []
obs: dict = {"steps": []}


def step(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[scenario {time.monotonic() - T0:6.1f}s] {name}", flush=True)


def spawn(args: list[str], **kw) -> tuple[subprocess.Popen, dict]:
    """Start a child that prints one JSON line (its port) first."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True, **kw)
    procs.append(p)
    line = p.stdout.readline()
    return p, json.loads(line)


def wait_observed(obs: dict, what: str, fn, timeout: float, every: float = 0.5):
    """``proc.wait_for`` that records a timeout among the observations (the pytest side judges them)."""
    try:
        return proc.wait_for(fn, timeout, every, what)
    except TimeoutError as e:
        obs.setdefault("timeouts", []).append(str(e)[:400])
        return None


wait_for = functools.partial(wait_observed, obs)


def prom_query(prom: str, q: str, at: float | None = None) -> list[dict]:
    """An instant query's result; [] while Prometheus cannot answer (the scenario polls)."""
    try:
        with PromAPI(f"http://{prom}", timeout=5) as api:
            return api.query(q, at)
    except PromError:
        return []


def exporter_metrics(exp: str) -> tuple[str, float]:
    t = time.monotonic()
    body = http.get(f"http://{exp}/metrics").text
    return body, time.monotonic() - t


def source_up(body: str, source: str) -> float | None:
    for ln in body.splitlines():
        if ln.startswith("omniwatch_source_up{") and f'source="{source}"' in ln:
            return float(ln.rsplit(" ", 1)[1])
    return None


def write_rollout_file(path: str, targets: list[str]) -> None:
    """The file verl's update_prometheus_config writes (endpoints.md §2.2), atomically."""
    doc = {"global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
           "scrape_configs": [
               {"job_name": "ray", "file_sd_configs": [{"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}]},
               {"job_name": "rollout", "metrics_path": "/metrics", "static_configs": [{"targets": targets}]}]}
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(doc, f)
    os.replace(path + ".tmp", path)


def sd_addresses(exp: str, kind: str | None = None) -> set[str]:
    params = {"kind": kind} if kind else {}
    return {t for g in http.get(f"http://{exp}/api/v1/sd", params=params).json() for t in g["targets"]}


def main(out_path: str) -> int:
    work = tempfile.mkdtemp(prefix="owd-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owr", dir="/tmp")  # short: Ray puts unix sockets under it
    env = dict(os.environ, RAY_TMPDIR=ray_tmp, TQ_METRICS_COLLECT_INTERVAL="1")
    env.pop("RAY_ADDRESS", None)
    os.environ.update(RAY_TMPDIR=ray_tmp, TQ_METRICS_COLLECT_INTERVAL="1")
    import ray
    try:
        step("ray.init")
        ctx = ray_init(ray_tmp, num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
                       log_to_driver=False, namespace="verl_run",
                       runtime_env={"env_vars": {"PYTHONPATH": TESTS, "TQ_METRICS_COLLECT_INTERVAL": "1"}})
        gcs = ctx.address_info["gcs_address"]
        obs["gcs"] = gcs

        step("stand-in servers")
        standin = os.path.join(TESTS, "standins", "vllm_omni_server.py")
        _, ok = spawn([PY, standin, "--running", "8", "--waiting", "3"])
        _, hang = spawn([PY, standin, "--mode", "hang"])
        _, garbage = spawn([PY, standin, "--mode", "garbage"])
        ok_a, hang_a, garb_a = (f"127.0.0.1:{x['port']}" for x in (ok, hang, garbage))
        obs["rollout_addresses"] = {"ok": ok_a, "hang": hang_a, "garbage": garb_a}
        rollout_file = os.path.join(work, "prometheus.yml")
        write_rollout_file(rollout_file, [ok_a, hang_a, garb_a])

        step("exporter")
        _, e = spawn([PY, os.path.join(TESTS, "standins", "exporter_app.py"), "--log-file", os.path.join(work, "exporter.log"),
                      "--ray-address", gcs, "--rollout-prometheus-file", rollout_file, "--ray-sd-file", "off",
                      "--max-num-seqs", "rollout=8,reward=4", "--discovery-interval", "1",
                      "--discovery-project", PROJECT, "--discovery-experiment", EXPERIMENT],
                     env=dict(env, OMNIWATCH_PUSH_TOKEN=PUSH_TOKEN))
        exp = f"127.0.0.1:{e['port']}"
        # The run's step timers: RolloutQueueSaturated fires only while the step waits on the servers (legacy,
        # gen 190 s and reward 30 s of a 250 s step).
        steps = [{"step": i, "data": {"timing_s/step": 250.0, "timing_s/gen": 190.0, "timing_s/reward": 30.0,
                                      "timing_s/update_actor": 28.0}} for i in (1, 2, 3)]
        obs["pushed_steps"] = wait_for("push the run's steps", lambda: http.post(
            f"http://{exp}/api/v1/push", headers={"authorization": f"Bearer {PUSH_TOKEN}"},
            json={"project": PROJECT, "experiment": EXPERIMENT, "steps": steps}).status_code == 200 and 200, 30)

        # Phase A: Ray attached, TransferQueue not started -> tq source down, no crash.
        step("phase A: no TransferQueue yet")
        body = wait_for("ray source up", lambda: (lambda b: b if source_up(b, "ray") == 1 else None)(exporter_metrics(exp)[0]), 60)
        obs["A_ray_up"] = source_up(body or "", "ray")
        obs["A_tq_up"] = source_up(body or "", "transferqueue")
        obs["A_status"] = http.get(f"http://{exp}/api/v1/discovery").json()["status"]
        obs["A_sd_tq"] = sorted(sd_addresses(exp, "tq"))

        step("TransferQueue init + put/get/clear")
        import torch
        import transfer_queue as tq
        from tensordict import TensorDict
        tq.init({"metrics": {"enabled": True, "port": 0},
                 "backend": {"SimpleStorage": {"total_storage_size": 1000, "num_data_storage_units": 2}}})
        keys = [f"s{i}" for i in range(8)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"x": torch.arange(32.0).reshape(8, 4)}, batch_size=8))
        got = tq.kv_batch_get(keys=keys, partition_id="train")
        obs["tq_roundtrip"] = [t.tolist() for t in got["x"].unbind(0)] == torch.arange(32.0).reshape(8, 4).tolist()
        tq.kv_clear(keys=keys[:4], partition_id="train")
        obs["tq_endpoint"] = tq.get_metrics_endpoint()

        step("reward stand-in as a verl-named Ray actor")

        @ray.remote(num_cpus=0)
        class RewardServer:  # what verl's vLLMHttpServer looks like to discovery
            def __init__(self):
                from standins.vllm_omni_server import start
                self.srv = start("ok", running=4, waiting=2, omni=False, model="reward-model")

            def get_server_address(self):
                return self.srv.server_address[0], self.srv.server_address[1]

        reward = RewardServer.options(name="vllm_server_reward_0_0").remote()
        obs["reward_address"] = "%s:%d" % tuple(ray.get(reward.get_server_address.remote(), timeout=60))

        step("prometheus")
        prom_port = free_port()
        prom = f"127.0.0.1:{prom_port}"
        from omniwatch.discovery import scrape_configs
        cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
               "rule_files": [os.path.join(ROOT, "alerts", "endpoints.rules.yml")],
               "scrape_configs": [{"job_name": "omniwatch", "static_configs": [{"targets": [exp]}]}]
               + scrape_configs(exp, refresh_interval="1s")}
        with open(os.path.join(work, "prom.yml"), "w") as f:
            yaml.safe_dump(cfg, f)
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={work}/prom.yml", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={prom}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"), start_new_session=True))
        wait_for("prometheus ready", lambda: http.get(f"http://{prom}/-/ready").status_code == 200, 30)

        step("phase B: everything discovered and scraped")
        obs["B_tq"] = wait_for("tq series with run labels", lambda: prom_query(
            prom, f'tq_controller_uptime_seconds{{project="{PROJECT}",experiment="{EXPERIMENT}"}}'), 90)
        obs["B_tq_samples"] = wait_for("tq produced/cleared samples", lambda: (lambda r: r if len(r) >= 2 else None)(prom_query(
            prom, f'tq_controller_request_samples_total{{project="{PROJECT}",op_type=~"NOTIFY_DATA_UPDATE|CLEAR_META"}}')), 60)
        obs["B_tq_keys"] = wait_for("active keys after clearing 4 of 8", lambda: prom_query(
            prom, f'run:tq_storage_active_keys:sum{{project="{PROJECT}"}} == 4'), 30)
        obs["B_tq_live"] = wait_for("live samples rule", lambda: prom_query(prom, "run:tq_partition_samples:sum == 4"), 30)
        obs["B_tq_storage_targets"] = wait_for("storage unit targets", lambda: (lambda r: r if len(r) == 2 else None)(
            prom_query(prom, 'up{job="transfer_queue",role="storage"} == 1')), 30)
        obs["B_ray"] = wait_for("ray node series", lambda: prom_query(prom, 'ray_node_cpu_count{job="ray"}'), 90)
        # both saturated servers (the rollout stand-in and the reward one found as a Ray actor): the reward
        # replica's series may arrive a scrape after the rollout one's
        obs["B_saturated"] = wait_for("saturation rule for rollout and reward", lambda: (
            lambda r: r if {x["metric"].get("role") for x in r} >= {"rollout", "reward"} else None)(prom_query(
                prom, 'replica:omniwatch_rollout_saturated:bool == 1')), 60)
        obs["B_alert"] = wait_for("alert evaluated", lambda: prom_query(
            prom, 'ALERTS{alertname="RolloutQueueSaturated"}'), 60)
        obs["B_vllm_both"] = prom_query(prom, 'count by (__name__, role) ({__name__=~"vllm_omni:num_requests_running|vllm:num_requests_running"})')
        obs["B_bad_up"] = wait_for("hang/garbage down", lambda: (lambda r: r if len(r) == 2 else None)(prom_query(
            prom, f'up{{job="rollout",instance=~"{hang_a}|{garb_a}"}} == 0')), 60)
        obs["B_rollout_up"] = prom_query(prom, 'up{job="rollout"}')
        obs["B_reward_up"] = prom_query(prom, 'up{job="reward",role="reward"}')
        obs["B_max_num_seqs"] = prom_query(prom, "omniwatch_rollout_max_num_seqs")
        lat = []
        for _ in range(10):
            lat.append(exporter_metrics(exp)[1])
            time.sleep(0.2)
        obs["B_exporter_scrape_max_s"] = max(lat)
        obs["B_exporter_up"] = prom_query(prom, 'up{job="omniwatch"}')
        obs["B_sd"] = http.get(f"http://{exp}/api/v1/sd").json()

        # Phase C: targets go away -> they leave the SD list and Prometheus' active targets.
        step("phase C: targets go away")
        write_rollout_file(rollout_file, [ok_a])
        ray.kill(reward)
        obs["C_sd_rollout"] = sorted(wait_for("rollout file shrink", lambda: (lambda s: s if s == {ok_a} else None)(
            sd_addresses(exp, "rollout")), 30) or [])
        obs["C_sd_reward"] = sorted(wait_for("reward actor gone", lambda: (lambda s: ["none"] if not s else None)(
            sd_addresses(exp, "reward")), 30) or ["still there"])
        obs["C_prom_rollout_targets"] = wait_for("prometheus drops targets", lambda: (lambda ts: ts if ts == [ok_a] else None)(
            sorted(t["labels"]["instance"] for t in http.get(f"http://{prom}/api/v1/targets").json()["data"]["activeTargets"]
                   if t["labels"].get("job") == "rollout")), 30)

        # Phase D: the Ray cluster goes away -> ray source down, TQ and Ray targets leave, exporter keeps serving.
        step("phase D: Ray cluster stops")
        ray.shutdown()
        stop_own_ray(ray_tmp)
        body = wait_for("ray source down", lambda: (lambda b: b if source_up(b, "ray") == 0 else None)(exporter_metrics(exp)[0]), 90)
        obs["D_ray_up"] = source_up(body or "", "ray")
        obs["D_sd_tq"] = sorted(sd_addresses(exp, "tq"))
        obs["D_sd_ray"] = sorted(sd_addresses(exp, "ray"))
        obs["D_exporter_status"] = http.get(f"http://{exp}/healthz").status_code
        with open(os.path.join(work, "exporter.log")) as f:
            obs["exporter_log"] = f.read()[-6000:]
    except Exception:
        obs["error"] = traceback.format_exc()
    finally:
        step("cleanup")
        for p in procs:
            proc.stop(p, 10, group=True)
        try:
            ray.shutdown()
        except Exception:
            pass
        stop_own_ray(ray_tmp)
        with open(out_path, "w") as f:
            json.dump(obs, f, indent=1, default=str)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return 0


def ray_init(ray_tmp: str, **kw):
    """``ray.init`` that starts over once when Ray's own startup deadline passes: Ray waits a fixed 30 s
    (wall clock, not configurable) for its raylet to register, which a 2-core machine under a parallel
    ``make test`` can miss although nothing is wrong."""
    import ray
    from ray_start import ray_start_lock
    try:
        with ray_start_lock():
            return ray.init(_temp_dir=ray_tmp, **kw)
    except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
        if "timed out during startup" not in str(e):
            raise
        print(f"ray.init: {e}; starting over once", flush=True)
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
        stop_own_ray(ray_tmp)
        with ray_start_lock():
            return ray.init(_temp_dir=ray_tmp, **kw)


def stop_own_ray(ray_tmp: str, timeout: float = 30.0) -> None:
    """Stop only this scenario's Ray processes (their command lines name its temp dir). ``ray stop
    --force`` would kill every Ray process on the host, other tests' clusters included."""
    def own():
        pids = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if ray_tmp.encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
        return pids
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in own():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout / 2
        while own() and time.monotonic() < deadline:
            time.sleep(0.2)


if __name__ == "__main__":
    T0 = time.monotonic()
    sys.exit(main(sys.argv[1]))
