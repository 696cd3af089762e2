"""A live stack for the dashboard tests and the committed PNGs: a real Prometheus (1 s scrape and rule
evaluation, the rules of alerts/) scraping a real omniwatch exporter app fed with the recorded verl
fixtures, and the demo endpoints (vLLM-Omni, reward vLLM, TransferQueue, DCGM, Ray) with run labels.

The exporter's GPU sampler runs on the recorded H200 trace (``gpu/loop.py``: two GPUs replaying it in
wall time, looping). Once the fixtures are in, the demo run keeps stepping with the trace's own
recorded steps (``LoopBackend.steps_between``), ingested when their recorded end comes round, so
the timing-layout phase attribution lines up with the samples exactly as it did on the H200.

Beside the fixtures, two simulated runs (``omniwatch.simulate``, verl's key set) log what no recorded run
does: rollout correction drifting (and a run that finished: a forced final checkpoint and validation off
their cadence), a rollout straggler and a hang of a run with 2-second steps (SIM_RUNS).

Used by tests/test_dashboards_live.py; ``python -m tests.dashboards_live_support docs/img`` renders the
PNGs committed under docs/img from the same setup."""
from __future__ import annotations

import argparse
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import uvicorn
import yaml

from omniwatch import names, proc
from omniwatch.demo import standins as demo_endpoints
from omniwatch.app import create_app
from omniwatch.discovery import config as disc_config
from omniwatch.core.exposition import make_registry
from omniwatch.gpu import loop
from omniwatch.proc import free_port
from omniwatch.promapi import PromAPI, PromError
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line
from omniwatch.settings import Settings
from omniwatch.simulate import Fault, RunSpec, step_dict

REPO = Path(__file__).resolve().parents[1]
# (project, experiment, fixture): two projects, several experiments, each fault shape present.
RUNS = [
    ("flowgrpo-sd35", "healthy", "flowgrpo_healthy"),
    ("flowgrpo-sd35", "h200-replay", "flowgrpo_healthy"),  # then the H200 trace's recorded steps (DEMO_RUN)
    ("flowgrpo-sd35", "reward-bound", "flowgrpo_reward_bound"),
    ("flowgrpo-sd35", "async-reward-tail", "flowgrpo_async_reward_tail"),
    ("flowgrpo-sd35", "mfu-above-one", "flowgrpo_mfu_above_one"),
    ("v1-wan", "transfer-idle", "v1_transfer_idle"),
]
# Simulated runs (omniwatch.simulate, verl's key set) fed beside the fixtures, for what no recorded run logs:
# rollout correction (decoupled, its RS share drifting from step 20: RolloutRejectionHigh) with checkpoints,
# validations and a forced final pair off their cadence at its last step (a finished run); a straggler
# from step 20 (RolloutStraggler) on a reward function; and a run of 2-second steps whose log stops (a hang).
SIM_STEPS = 37
SIM_RUNS = [
    ("flowgrpo-sim", "rollout-drift", RunSpec(seed=11, rollout_corr="decoupled", checkpoint_every=10,
                                              validation_every=8, total_steps=SIM_STEPS,
                                              faults=[Fault("rs_drift", 20, value=0.12)])),
    ("flowgrpo-sim", "straggler", RunSpec(seed=12, reward="function", faults=[Fault("straggler", 20, factor=3.0)])),
    # 2-second steps that stop once fed: TrainingStalled escalates info -> warning -> critical within a minute
    ("flowgrpo-sim", "hang", RunSpec(seed=13, pace=2.0)),
]
FINISHED_RUN, HANG_RUN = SIM_RUNS[0][:2], SIM_RUNS[2][:2]
# the run the first demo endpoint set joins and the replayed run: its own, so the reward-bound fixture run stays a
# reward-bound run to its end (the previews' "reward-bound" run went on with the trace's steps, idle between phases)
DEMO_RUN = ("flowgrpo-sd35", "h200-replay")
# Trainer configs read for two runs (rendered by a real Hydra app from VeRL-Omni's examples; the run names set): the
# reward-bound run's remedy is its config's (a colocated reward model, 4 GPUs, offloads on); the hang's resume_mode.
CONFIGS = {("flowgrpo-sd35", "reward-bound"): "finished_on_cadence", ("flowgrpo-sim", "hang"): "reward_server"}
# The overview's first screen per fault (docs/dashboards.md): (project, experiment, the fault's file name)
FIRST_SCREENS = [("flowgrpo-sd35", "reward-bound", "reward-bound"), ("flowgrpo-sim", "hang", "stall"),
                 ("flowgrpo-sd35", "mfu-above-one", "mfu-above-one"), ("v1-wan", "transfer-idle", "transfer-idle"),
                 ("flowgrpo-sim", "straggler", "straggler"), ("flowgrpo-sim", "rollout-drift", "rollout-drift"),
                 ("flowgrpo-sd35", "healthy", "healthy")]
SECOND_RUN = ("v1-wan", "transfer-idle")        # the run the second endpoint set joins (its replicas: vllm:omni_)
ENDPOINT_RUNS = (DEMO_RUN, SECOND_RUN)
VALIDATION_EVERY = 3  # every 3rd replayed step carries validation keys (val-core/...): validation panel and annotation
VAL_KEY = "val-core/ocr/reward/mean@1"
GEN_SEQ_KEYS = "timing_s/agent_loop/generate_sequences/"
GPU_NODE = "h200-replay"
REPLAY_GPUS = 2


def _run(run: tuple[str, str]) -> str:
    return f'project="{run[0]}",experiment="{run[1]}"'


def _bind() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


class LiveStack:
    def __init__(self, fixtures_dir: Path, prometheus_bin: str = "prometheus", step_delay: float = 0.1,
                 gpu_trace: Path = loop.DEFAULT_TRACE, scrape_s: int = 1):
        self.fixtures_dir, self.prometheus_bin, self.step_delay = fixtures_dir, prometheus_bin, step_delay
        self.scrape_s = scrape_s  # the previews scrape less often: a loaded machine must not miss scrapes (staleness)
        self.gpu = loop.replay_backend(gpu_trace, gpus=REPLAY_GPUS)
        self.replayed_steps = 0
        self.store = RunStore()
        self.tmp = tempfile.TemporaryDirectory(prefix="omniwatch-dash-")
        self._stop = threading.Event()
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        self.demo = None
        self.server = None
        self.prom_url = ""
        self.fed = threading.Event()
        self.log = Path(self.tmp.name) / "prometheus.log"

    # -- parts -------------------------------------------------------------------------------------------
    def _configs(self) -> None:
        """The trainer configs of CONFIGS: the fixture's settings under the run's names (no total steps: the run is
        not marked finished by it)."""
        from omniwatch import trainer_config as tc
        for (project, experiment), case in CONFIGS.items():
            c = tc.read_file(str(REPO / "tests" / "fixtures" / "trainer_config" / f"{case}.pprint.log"))
            self.store.set_trainer_config(tc.TrainerConfig(
                project, experiment, c.source, sp=c.sp, engine=c.engine, lora=c.lora, trainer=c.trainer,
                gpus_trainer=c.gpus_trainer, settings=c.settings))

    def _feed(self):
        """Ingest every fixture step and every simulated run's step, interleaving runs, a little apart so the
        series have history."""
        self._configs()
        lines = {run[:2]: (self.fixtures_dir / f"{run[2]}.jsonl").read_bytes().splitlines() for run in RUNS}
        for project, experiment, spec in SIM_RUNS:
            lines[(project, experiment)] = [orjson.dumps({"step": k, "data": step_dict(spec, k)})
                                            for k in range(1, SIM_STEPS + 1)]
        for i in range(max(len(v) for v in lines.values())):
            for (project, experiment), ls in lines.items():
                if i < len(ls):
                    self.store.ingest(project, experiment, parse_jsonl_line(ls[i]), "jsonl", feed=experiment)
            if self._stop.wait(self.step_delay):
                return
        self.fed.set()
        self._replay_steps(lines[DEMO_RUN][-1])

    def _replay_steps(self, last_line: bytes) -> None:
        """The demo run goes on with the H200 trace's recorded steps, each ingested when its recorded
        end comes round in the replay: its other keys are the fixture's last step's, its per-sample generation
        times (agent-loop keys: the legacy trainer's straggler signal) the fixture's scaled to the replayed gen.
        Every VALIDATION_EVERY-th step carries validation keys (no timing_s/testing: a validation first seen
        after 40 steps fits no cadence and would mark the run finished, as a forced last-step one does)."""
        last = orjson.loads(last_line)
        step, base = int(last["step"]), {k: v for k, v in last["data"].items() if not k.startswith("timing_s/")}
        samples = {k: v for k, v in last["data"].items() if k.startswith(GEN_SEQ_KEYS)}
        seen = time.time()
        while not self._stop.wait(0.25):
            now = time.time()
            for arrival, timing in self.gpu.steps_between(seen, now):
                step += 1
                scale = timing.get("timing_s/gen", 0.0) / last["data"]["timing_s/gen"]
                timing = {**timing, **{k: v * scale for k, v in samples.items()}}
                val = {VAL_KEY: 0.5 + 0.002 * step} if step % VALIDATION_EVERY == 0 else {}
                line = orjson.dumps({"step": step, "data": {**base, "training/global_step": step, **timing, **val}})
                self.store.ingest(*DEMO_RUN, parse_jsonl_line(line), "jsonl", arrival=arrival, feed=DEMO_RUN[1])
                self.replayed_steps += 1
            seen = now

    def _discovery(self, demo_port: int):
        """Discovery as `omniwatch demo` configures it, with no Ray cluster (Ray probe and files off): only the
        Ray task-event source, polling the demo endpoints' stand-in of Ray's state API, its job = DEMO_RUN."""
        p = argparse.ArgumentParser()
        disc_config.add_arguments(p)
        return disc_config.from_args(p.parse_args(
            ["--ray-address", "off", "--ray-sd-file", "off", "--rollout-prometheus-file", str(Path(self.tmp.name) / "none")]
            + demo_endpoints.ray_tasks_args("127.0.0.1", demo_port, *DEMO_RUN)))

    def _start_exporter(self, demo_port: int) -> int:
        extra = {"gpu": "on", "gpu_backend": self.gpu, "gpu_node": GPU_NODE, "gpu_interval_s": 0.5,
                 "discovery": self._discovery(demo_port)}
        app = create_app(self.store, make_registry(self.store), Settings(extra=extra))
        sock = _bind()
        port = sock.getsockname()[1]
        # lifespan on: the GPU sampler runs for as long as the server does (gpu.api ties it there)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        t = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        self.threads.append(t)
        return port

    def _prometheus_config(self, exporter_port: int, demo_port: int) -> Path:
        cfg = {
            "global": {"scrape_interval": f"{self.scrape_s}s", "evaluation_interval": "1s",
                       "scrape_timeout": f"{self.scrape_s}s"},
            "rule_files": [str(p) for p in sorted((REPO / "alerts").glob("*.rules.yml"))],
            "scrape_configs": [{"job_name": "omniwatch", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]
            + demo_endpoints.scrape_configs("127.0.0.1", demo_port, *DEMO_RUN, also=[SECOND_RUN]),
        }
        path = Path(self.tmp.name) / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start(self, feed_after_first_scrape: bool = False) -> "LiveStack":
        """``feed_after_first_scrape``: the fixture steps start once Prometheus has scraped the exporter (the
        previews: a slow Prometheus start on a loaded machine lost the first 18 steps of every XY chart)."""
        self.demo, demo_port = demo_endpoints.start()
        exporter_port = self._start_exporter(demo_port)
        prom_port = free_port()
        cfg = self._prometheus_config(exporter_port, demo_port)
        self.procs.append(subprocess.Popen(
            [self.prometheus_bin, f"--config.file={cfg}", f"--storage.tsdb.path={self.tmp.name}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT))
        self.prom_url = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 120
        while feed_after_first_scrape and time.monotonic() < deadline and not self.query('up{job="omniwatch"} == 1'):
            time.sleep(0.5)
        t = threading.Thread(target=self._feed, daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def query(self, expr: str) -> list:
        """An instant query's result; [] while Prometheus cannot answer yet (readiness polls this)."""
        try:   # 30 s: a loaded 2-core machine (4 test workers, Ray scenarios) can keep Prometheus seconds behind
            with PromAPI(self.prom_url, timeout=30) as api:
                return api.query(expr)
        except PromError:
            return []

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Bounded wait: fixtures ingested and scraped, demo series scraped twice, alerts evaluated."""
        deadline = time.monotonic() + timeout
        checks = {
            "runs scraped": lambda: len(self.query("omniwatch_step")) == len(RUNS) + len(SIM_RUNS) and self.fed.is_set(),
            "final steps scraped": lambda: min(float(s["value"][1]) for s in self.query("omniwatch_step")) >= 30,
            "demo series": lambda: bool(self.query('rate(vllm_omni:e2e_request_latency_s_count[1m]) > 0')),
            "alerts": lambda: bool(self.query('ALERTS{alertname="RewardBoundRollout"}')),
            "rate windows": lambda: bool(self.query("rate(omniwatch_stage_seconds_total[1m])")),
            "gpu samples": lambda: bool(self.query(f"rate({names.GPU_BUSY_SECONDS_TOTAL}[1m])")),
            "gpu phase idle ratio": lambda: bool(self.query(
                f'{names.GPU_IDLE_RATIO}{{project="{DEMO_RUN[0]}",experiment="{DEMO_RUN[1]}"}}')),
            "gpu phase counters": lambda: bool(self.query(f"rate({names.GPU_PHASE_IDLE_SECONDS_TOTAL}[1m])")),
            "validation step": lambda: bool(self.query(f'{{__name__=~"verl_val_.*", key="{VAL_KEY}"}}')),
            "endpoints of both runs": lambda: len(self.query('count by (experiment) (tq_controller_uptime_seconds)'))
            == len(ENDPOINT_RUNS),
            "reward queue share": lambda: bool(self.query("run:omniwatch_reward_bound_queue_share:ratio")),
            # the replayed run's time outside the step timer: three normal steps measured on live arrivals
            "outside-step window": lambda: bool(self.query(
                f'project_experiment:omniwatch_outside_step_ratio:min_k{{{_run(DEMO_RUN)}}}')),
            "replayed straggler window": lambda: bool(self.query(
                f'project_experiment:omniwatch_rollout_straggler_ratio:min_k{{{_run(DEMO_RUN)}}}')),
            "rollout correction": lambda: bool(self.query(
                "project_experiment_mode:omniwatch_rollout_rs_seq_masked_ratio:min_k")),
            # every run's typical step and the replayed run's step-time window (20 reference steps, then min_k)
            "typical steps": lambda: len(self.query(names.TYPICAL_STEP)) >= len(RUNS),
            "step-time window": lambda: bool(self.query(
                f'project_experiment:omniwatch_step_duration_ratio:min_k{{{_run(DEMO_RUN)}}}')),
            "storage units of both runs": lambda: len(self.query(
                'count by (experiment) (tq_storage_memory_rss_bytes)')) == len(ENDPOINT_RUNS),
            "finished run": lambda: bool(self.query(f"{names.RUN_FINISHED}{{{_run(FINISHED_RUN)}}} == 1")),
            # worker lanes (the demo endpoints' Ray state-API stand-in): a finished dispatch's straggler, a held step
            "worker lanes": lambda: bool(self.query(f"{names.RAY_STRAGGLER_STREAK}{{{_run(DEMO_RUN)}}}"))
            and bool(self.query(f"{names.STEP_HOLDER_SECONDS}{{{_run(DEMO_RUN)}}} > 2")),
            "gpu fleet": lambda: bool(self.query(f"rate({names.GPU_FLEET_SECONDS_TOTAL}{{{_run(DEMO_RUN)}}}[1m]) > 0")),
        }
        pending = dict(checks)
        while pending and time.monotonic() < deadline:
            for what, fn in list(pending.items()):
                try:
                    if fn():
                        del pending[what]
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
            if pending:
                time.sleep(0.5)
        if pending:
            raise AssertionError(f"live stack not ready after {timeout}s: {sorted(pending)}; "
                                 f"prometheus log tail: {self.log.read_text()[-2000:]}")
        time.sleep(3)  # a few more scrapes so every rate() window holds >= 2 post-ingest samples

    def stop(self) -> None:
        self._stop.set()
        for p in self.procs:
            proc.stop(p, 10)
        if self.demo is not None:
            demo_endpoints.stop(self.demo)
        if self.server is not None:
            self.server.should_exit = True
        for t in self.threads:
            t.join(timeout=5)
        self.tmp.cleanup()


RENDER = """
import sys
from pathlib import Path
from omniwatch.dashboards.preview import QUERY_ERRORS, render_all, render_first_screens
from tests.dashboards_live_support import FIRST_SCREENS
url, out, minutes = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
for p in render_first_screens(url, out, FIRST_SCREENS, minutes=minutes):
    print(p, flush=True)
for p in render_all(url, out, minutes=minutes):
    print(p, flush=True)
print(f"query errors drawn: {len(QUERY_ERRORS)}", *QUERY_ERRORS, sep=chr(10), flush=True)
sys.exit(1 if QUERY_ERRORS else 0)
"""


if __name__ == "__main__":
    import sys

    t0 = time.time()
    # each step apart by more than a scrape, so that Prometheus sees every one (the XY charts draw a point per step;
    # at 0.5 s apart an unloaded machine fed all of them before the first scrape, and the charts had one point);
    # (a scrape the exporter misses on a loaded machine marks every series stale: render on a quiet one)
    stack = LiveStack(REPO / "tests" / "fixtures" / "verl", step_delay=3.5, scrape_s=3).start(feed_after_first_scrape=True)
    try:
        stack.wait_ready(timeout=400)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 20)
        # the whole life of the stack: the fixture runs' learning curves from their first step. Drawn by a child
        # process: matplotlib in this one would hold the exporter's server thread back (a scrape that fails marks
        # every series stale, and the instant panels read "No data")
        minutes = (time.time() - t0) / 60 + 0.2
        subprocess.run(["nice", "-n", "19", sys.executable, "-c", RENDER, stack.prom_url, sys.argv[1], str(minutes)],
                       check=True, cwd=REPO)
    finally:
        stack.stop()
