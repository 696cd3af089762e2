"""TransferQueue under load, run INSIDE a private network namespace (``unshare -n`` + ``ip link set lo up``) so
every Ray / TransferQueue endpoint binds 127.0.0.1. Started by tests/test_tq_backlog_live.py:

    unshare -n sh -c 'ip link set lo up && exec python tests/tq_backlog_scenario.py OUT_DIR'

A real Ray head, a real TransferQueue 0.1.11 (metrics on, SimpleStorage: total_storage_size 4,000 over two
units, the default TQ_METRICS_COLLECT_INTERVAL of 10 s), the real exporter (``omniwatch serve``: Ray
discovery of the controller and both storage units, and the trainer's JSONL steps) and a real Prometheus at
production's 15 s scrape/evaluation interval with every rule file of alerts/.

The driver plays the V1 pattern every second: a producer puts 32 new keys (tags put, then fields put) and
writes a computed field back to the previous second's 32 keys; a consumer gets and clears the oldest
written-back keys; every 4 s the trainer logs a step. Phases:

  healthy   consumer clears 32/s for HEALTHY_S: live samples stay ~64, NOTIFY_DATA_UPDATE counts 64/s
  backlog   consumer clears 16/s until TransferQueueBacklog fires (bounded): live samples +16/s
  drain     consumer clears 64/s until it resolves (bounded), and 20 s more

It writes what it observed to OUT_DIR/observed.json (plus the controller's and a storage unit's /metrics
bodies); the pytest asserts on that. Every wait is bounded; everything started is stopped.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import httpx
import yaml

from omniwatch import proc
from omniwatch.proc import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(0, TESTS)
from discovery_scenario import prom_query as q, ray_init, stop_own_ray, wait_observed  # noqa: E402  (kills only this scenario's Ray processes)

PY = sys.executable
BIN = os.path.dirname(PY)
PROJECT, EXPERIMENT = "tqload", "v1-writeback"
CAPACITY, UNITS = 4000, 2
PRODUCE = 32                    # samples/s
CONSUME = {"healthy": 32, "backlog": 16, "drain": 64}
HEALTHY_S = float(os.environ.get("TQ_SCENARIO_HEALTHY_S", 60))
BACKLOG_MAX_S, DRAIN_MAX_S, DRAIN_TAIL_S = 210.0, 150.0, 20.0
STEP_EVERY = 4                  # ticks (seconds) per logged trainer step
SCRAPE = os.environ.get("TQ_SCENARIO_SCRAPE", "15s")
http = httpx.Client(timeout=5, trust_env=False)
procs: list[subprocess.Popen] = []
obs: dict = {"steps": [], "phases": {}, "config": {"capacity": CAPACITY, "units": UNITS, "produce_per_s": PRODUCE,
                                                     "consume_per_s": CONSUME, "scrape_interval": SCRAPE,
                                                     "tq_metrics_collect_interval_s": 10}}
T0 = time.monotonic()


def step(name: str) -> None:
    obs["steps"].append([round(time.monotonic() - T0, 1), name])
    print(f"[tq scenario {time.monotonic() - T0:6.1f}s] {name}", flush=True)


wait_for = functools.partial(wait_observed, obs)


def q1(prom: str, expr: str, at: float | None = None) -> float | None:
    r = q(prom, expr, at)
    return float(r[0]["value"][1]) if r else None


def q_range(prom: str, expr: str, start: float, end: float, step_s: float = 15) -> list[dict]:
    r = http.get(f"http://{prom}/api/v1/query_range",
                 params={"query": expr, "start": start, "end": end, "step": step_s}).json()
    return r["data"]["result"] if r.get("status") == "success" else []


def tq_alerts(prom: str) -> list[dict]:
    body = http.get(f"http://{prom}/api/v1/alerts").json()
    return [a for a in body["data"]["alerts"] if a["labels"]["alertname"].startswith("TransferQueue")]


class Workload:
    """The V1 pattern on the real TQ client: tags put, fields put, write-back of a computed field to the
    previous second's keys, get + clear of the oldest written-back keys."""

    def __init__(self, tq, torch, TensorDict, jsonl: str):
        self.tq, self.torch, self.TD = tq, torch, TensorDict
        self.n = 0
        self.prev: list[str] = []
        self.ready: list[str] = []
        self.ticks = 0
        self.step_no = 0
        self.jsonl = jsonl
        self.tick_s: list[float] = []

    def tick(self, consume: int) -> None:
        t = time.monotonic()
        tq, td = self.tq, self.TD
        keys = [f"s{self.n + i}" for i in range(PRODUCE)]
        self.n += PRODUCE
        tq.kv_batch_put(keys=keys, partition_id="train", tags=[{"status": "pending", "global_steps": self.step_no}] * PRODUCE)
        tq.kv_batch_put(keys=keys, partition_id="train",
                        fields=td({"x": self.torch.randn(PRODUCE, 16)}, batch_size=PRODUCE))
        if self.prev:  # the reward computed for the previous second's samples, written back to the same keys
            tq.kv_batch_put(keys=self.prev, partition_id="train",
                            fields=td({"reward": self.torch.randn(len(self.prev), 1)}, batch_size=len(self.prev)))
            self.ready.extend(self.prev)
        self.prev = keys
        take, self.ready = self.ready[:consume], self.ready[consume:]
        if take:
            tq.kv_batch_get(keys=take, partition_id="train")
            tq.kv_clear(keys=take, partition_id="train")
        self.ticks += 1
        if self.ticks % STEP_EVERY == 0:
            self.log_step()
        self.tick_s.append(time.monotonic() - t)

    def log_step(self) -> None:
        """One verl file-logger line (``{"step": N, "data": {...}}``) per trainer step."""
        self.step_no += 1
        data = {"timing_s/step": float(STEP_EVERY), "timing_s/gen": 2.0, "timing_s/reward": 0.5,
                "timing_s/update_actor": 1.4, "training/global_step": self.step_no}
        with open(self.jsonl, "a") as f:
            f.write(json.dumps({"step": self.step_no, "data": data}) + "\n")

    @property
    def live(self) -> int:
        return len(self.prev) + len(self.ready)


def run_phase(name: str, wl: Workload, until, max_s: float, prom: str, tail_s: float = 0.0) -> dict:
    """Tick once a second until ``until(prom)`` returns something (or ``max_s``), then ``tail_s`` more
    seconds; returns what it saw."""
    step(f"phase {name}: consumer clears {CONSUME[name]}/s")
    start = time.time()
    seen, stop_at = None, None
    last_check = 0.0
    while time.time() - start < max_s + tail_s:
        t = time.monotonic()
        wl.tick(CONSUME[name])
        if stop_at is not None:
            if time.time() >= stop_at:
                break
        elif until is not None and time.monotonic() - last_check >= 5:
            last_check = time.monotonic()
            seen = until(prom)
            if seen:
                stop_at = time.time() + tail_s
                if not tail_s:
                    break
        elif time.time() - start >= max_s:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    end = time.time()
    obs["phases"][name] = {"start": start, "end": end, "live_at_end": wl.live, "ended_by": "condition" if seen else "time"}
    return {"start": start, "end": end, "seen": seen}


def firing(prom: str):
    alerts = [a for a in tq_alerts(prom) if a["state"] == "firing"]
    return alerts or None


def resolved(prom: str):
    return (not tq_alerts(prom)) or None


def main(out_dir: str) -> int:
    work = tempfile.mkdtemp(prefix="owq-", dir="/tmp")
    ray_tmp = tempfile.mkdtemp(prefix="owq", dir="/tmp")  # short: Ray puts unix sockets under it
    env = dict(os.environ, RAY_TMPDIR=ray_tmp)
    env.pop("RAY_ADDRESS", None)
    env.pop("TQ_METRICS_COLLECT_INTERVAL", None)  # TransferQueue's default, 10 s
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(k, None)
    os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ.pop("TQ_METRICS_COLLECT_INTERVAL", None)
    import ray
    try:
        step("ray.init")
        ctx = ray_init(ray_tmp, num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
                       log_to_driver=False, namespace="verl_run")
        gcs = ctx.address_info["gcs_address"]

        step("TransferQueue init")
        import torch
        import transfer_queue as tq
        from tensordict import TensorDict
        tq.init({"metrics": {"enabled": True, "port": 0},
                 "backend": {"SimpleStorage": {"total_storage_size": CAPACITY, "num_data_storage_units": UNITS}}})
        obs["tq_endpoint"] = tq.get_metrics_endpoint()
        units = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a["name"].startswith("TransferQueueStorageUnit#"):
                h = ray.get_actor(a["name"], namespace=a["namespace"])
                units[a["name"]] = {"endpoint": ray.get(h.start_metrics.remote(port=0), timeout=30),
                                    "storage_unit_id": ray.get(h.get_zmq_server_info.remote(), timeout=30).id}
        obs["units"] = units

        # the trainer's log: the run exists before the exporter starts, so discovered targets join it
        logs = os.path.join(work, "logs")
        os.makedirs(os.path.join(logs, PROJECT))
        jsonl = os.path.join(logs, PROJECT, f"{EXPERIMENT}.jsonl")
        wl = Workload(tq, torch, TensorDict, jsonl)
        wl.log_step()

        step("exporter (omniwatch serve)")
        exp = f"127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(
            [os.path.join(BIN, "omniwatch"), "serve", "--listen", exp, "--watch", logs, "--gpu", "off",
             "--ray-address", gcs, "--rollout-prometheus-file", os.path.join(work, "none.yml"), "--ray-sd-file", "off",
             "--discovery-interval", "1", "--discovery-project", PROJECT, "--discovery-experiment", EXPERIMENT],
            env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "exporter.log"), "w"),
            start_new_session=True))
        wait_for("exporter healthy", lambda: http.get(f"http://{exp}/healthz").status_code == 200, 60)
        t_disc = time.monotonic()
        sd = wait_for("controller and both storage units in SD", lambda: (lambda b: b if len(b) == 1 + UNITS else None)(
            http.get(f"http://{exp}/api/v1/sd", params={"kind": "tq"}).json()), 90)
        obs["discovery_s"] = round(time.monotonic() - t_disc, 1)
        obs["sd_tq"] = sd

        step("prometheus")
        prom = f"127.0.0.1:{free_port()}"
        from omniwatch.discovery import scrape_configs
        from omniwatch.rules import rule_files
        cfg = {"global": {"scrape_interval": SCRAPE, "scrape_timeout": "5s", "evaluation_interval": SCRAPE},
               "rule_files": [str(p) for p in rule_files()],
               "scrape_configs": [{"job_name": "omniwatch", "static_configs": [{"targets": [exp]}]}]
               + [j for j in scrape_configs(exp, refresh_interval="1s") if j["job_name"] == "transfer_queue"]}
        with open(os.path.join(work, "prom.yml"), "w") as f:
            yaml.safe_dump(cfg, f)
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={work}/prom.yml", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={prom}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"), start_new_session=True))
        wait_for("prometheus ready", lambda: http.get(f"http://{prom}/-/ready").status_code == 200, 30)
        obs["scraped_up"] = wait_for("all three TQ targets up", lambda: (lambda r: r if len(r) == 1 + UNITS else None)(
            q(prom, f'up{{job="transfer_queue",project="{PROJECT}"}} == 1')), 60)

        h = run_phase("healthy", wl, None, HEALTHY_S, prom)
        b = run_phase("backlog", wl, firing, BACKLOG_MAX_S, prom)
        obs["alerts_at_firing"] = b["seen"]
        obs["firing_checked_at"] = time.time()
        if b["seen"]:  # the state Prometheus evaluated when it first fired, and bodies with a backlog in them
            obs["bodies_saved"] = save_bodies(out_dir, obs["tq_endpoint"], units)
        d = run_phase("drain", wl, resolved, DRAIN_MAX_S, prom, tail_s=DRAIN_TAIL_S)  # the tail: after resolution
        obs["resolved_checked_at"] = time.time()
        obs["tick_s_max"] = round(max(wl.tick_s), 3)
        obs["tick_s_median"] = round(sorted(wl.tick_s)[len(wl.tick_s) // 2], 3)
        time.sleep(2)
        collect(prom, h, b, d)
        obs["dashboard_failures"] = dashboard_failures(prom)
        with open(os.path.join(work, "exporter.log")) as f:
            obs["exporter_log"] = f.read()[-4000:]
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
        with open(os.path.join(out_dir, "observed.json"), "w") as f:
            json.dump(obs, f, indent=1, default=str)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return 0


def save_bodies(out_dir: str, controller: str, units: dict) -> list[str]:
    saved = []
    targets = [("controller", controller)] + [(f"unit{n.rsplit('#', 1)[1]}", u["endpoint"]) for n, u in sorted(units.items())]
    for name, ep in targets:
        path = os.path.join(out_dir, f"{name}.metrics.txt")
        with open(path, "wb") as f:
            f.write(http.get(f"http://{ep}/metrics").content)
        saved.append(os.path.basename(path))
    return saved


def collect(prom: str, h: dict, b: dict, d: dict) -> None:
    """What Prometheus recorded, phase by phase (range queries at the 15 s evaluation grid)."""
    run = f'project="{PROJECT}",experiment="{EXPERIMENT}"'
    start, end = h["start"], d["end"] + 1
    series = {
        "utilization": f"run:tq_storage_utilization:max{{{run}}}",
        "active_keys": f"run:tq_storage_active_keys:sum{{{run}}}",
        "partition_samples": f"run:tq_partition_samples:sum{{{run}}}",
        "net_rate": f"run:tq_storage_active_keys:deriv{{{run}}}",
        "seconds_to_full": f"run:tq_storage_seconds_to_full:min{{{run}}}",
        "backlog": f"run:tq_storage_backlog:utilization{{{run}}}",
        "writes": f'sum(tq_controller_request_samples_total{{{run},op_type="NOTIFY_DATA_UPDATE"}})',
        "clears": f'sum(tq_controller_request_samples_total{{{run},op_type="CLEAR_META"}})',
        "index_allocated": f"max(tq_global_index_allocated_total{{{run}}})",
        "index_reusable": f"max(tq_global_index_reusable_total{{{run}}})",
        "step": f"max(omniwatch_step{{{run}}})",
    }
    obs["range"] = {k: [[float(t), float(v)] for r in q_range(prom, e, start, end)[:1] for t, v in r["values"]]
                    for k, e in series.items()}
    obs["alerts_range"] = [{"labels": r["metric"], "values": [[float(t), float(v)] for t, v in r["values"]]}
                           for r in q_range(prom, 'ALERTS{alertname=~"TransferQueue.*"}', start, end)]
    obs["storage_p99_by_op"] = {r["metric"].get("op_type"): float(r["value"][1]) for r in q(
        prom, f'histogram_quantile(0.99, sum by (le, op_type) (rate(tq_storage_request_duration_seconds_bucket'
              f'{{{run},role="storage"}}[2m])))', b["end"]) if r["value"][1] not in ("NaN",)}
    obs["storage_lifetime_p99_by_op"] = {r["metric"].get("op_type"): float(r["value"][1]) for r in q(
        prom, f"max by (op_type) (tq_storage_request_latency_p99{{{run}}})", b["end"])}
    # the units' own series and the controller's per-unit series join on storage_unit_id
    obs["join"] = [r["metric"] for r in q(
        prom, f'sum by (project, experiment, storage_unit_id, replica) (tq_storage_request_total{{{run},role="storage"}})'
              f' * on (project, experiment, storage_unit_id) group_left ()'
              f' max by (project, experiment, storage_unit_id) (tq_storage_capacity_total{{{run},role="controller"}})')]
    # arrivals (the controller's copy, refreshed every 10 s) against completions (the units' histograms):
    # read once the load has stopped and the controller's next collection has been scraped
    def by_op():
        arrived = {r["metric"]["op_type"]: float(r["value"][1]) for r in q(
            prom, f"sum by (op_type) (tq_storage_arrivals_by_op{{{run}}})")}
        done = {r["metric"]["op_type"]: float(r["value"][1]) for r in q(
            prom, f'sum by (op_type) (tq_storage_request_duration_seconds_count{{{run},role="storage"}})')}
        return arrived, done
    t = time.monotonic()
    arrived, done = wait_for("controller's arrivals caught up with the units", lambda: (lambda a, d: (a, d) if d and all(
        abs(a.get(op, 0) - n) <= 4 for op, n in d.items()) else None)(*by_op()), 60, every=2) or by_op()
    obs["caught_up_s"] = round(time.monotonic() - t, 1)
    obs["arrivals_by_op"], obs["completed_by_op"] = arrived, done


def dashboard_failures(prom: str) -> list[dict]:
    """The TransferQueue dashboard's targets that show no data on this real TransferQueue."""
    from omniwatch.config import DEFAULT
    from omniwatch.dashboards import verify
    from omniwatch.dashboards.catalog import by_uid
    fails = verify.verify(f"http://{prom}", PROJECT, EXPERIMENT, rate_interval="1m", interval=SCRAPE,
                          dashboards=[by_uid("omniwatch-transferqueue", DEFAULT)])
    return verify.as_dicts(fails)


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    sys.exit(main(sys.argv[1]))
