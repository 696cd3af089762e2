"""The issue's proof on the demo's own setup: every panel query of every dashboard executed against
the live Prometheus of the real native stack (``Stack``, fast profile, free ports, a tmp run dir),
fed as ``omniwatch demo`` feeds it: the demo endpoints in their own process, the demo's simulated
FlowGRPO runs written into the watched root, and the exporter's GPU sampler on the recorded H200
trace (``omniwatch serve --gpu replay:``, what the demo passes when there is no NVML)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from omniwatch import demo, names
from omniwatch.demo import standins as demo_endpoints
from omniwatch.alerting.records import REC_STEP_DRIFT
from omniwatch.dashboards import verify as v
from omniwatch.gpu import loop
from omniwatch.promapi import PromAPI, PromError
from omniwatch.stack import Stack, StackConfig

from .conftest import free_port, require_binary, wait_evaluations

pytestmark = [pytest.mark.integration]

PACE_S = 0.5         # seconds per simulated step (the demo: 5 s); faults from step ONSET
STEPS, ONSET = 40, 6
GPU_NODE = "h200-replay"
JOINED = "reward-bound-colocated"  # the runs the demo endpoints' target labels join (as in the demo)
ALSO_JOINED = "v1-transfer-idle"
WRITERS: list[threading.Thread] = []  # the demo runs' writers: a wait for what follows their end joins them
FIRST_SCREEN: list[dict] = []  # the reward-bound run's "Why slow" row at each evaluation while it writes (sampler)


def _why_slow_sampler(prom: str, writer: threading.Thread, stop: threading.Event) -> None:
    """Issue 32 'Done when': the first screen of the reward-bound run, read as Grafana reads it (the generated
    "Why slow" query for that run) once a second until the stack stops, with whether RewardBoundRollout fires for it
    at that moment and whether a stall past its warning does (it then costs every GPU of the run: the costlier
    cause, rightly on top). The run's writer is paced by the wall clock and Prometheus by its evaluations: the alert
    may fire only after the last step was written, so sampling does not stop with the writer."""
    import json
    from omniwatch.dashboards.jsonfiles import default_dir
    doc = json.loads((default_dir() / "omniwatch-run-overview.json").read_text())
    panel = next(p for p in doc["panels"] if p.get("title") == "Why slow" and p.get("type") != "row")
    q = v.substitute(panel["targets"][0]["expr"], demo.PROJECT, v.prom_regex_escape(JOINED))
    firing = f'ALERTS{{alertname="{names.ALERT_REWARD_BOUND}",alertstate="firing",experiment="{JOINED}"}}'
    stalled = (f'ALERTS{{alertname="{names.ALERT_STALLED}",alertstate="firing",severity=~"warning|critical",'
               f'experiment="{JOINED}"}}')
    while not stop.wait(1.0):
        # the three at one instant, a little in the past (every evaluation up to it written): asked at "now" one after
        # the other, an evaluation between them saw the alert fire with the row still from before it
        at = time.time() - 2.0
        rows = _query(prom, q, at)
        FIRST_SCREEN.append({"firing": bool(_query(prom, firing, at)), "rows": [r["metric"] for r in rows],
                             "stalled": bool(_query(prom, stalled, at)), "writing": writer.is_alive()})


def _query(prom: str, expr: str, at: float | None = None) -> list:
    try:
        with PromAPI(prom, timeout=5) as api:
            return api.query(expr, at)
    except PromError:
        return []


def _serve_supports_replay() -> bool:
    r = subprocess.run([sys.executable, "-m", "omniwatch", "serve", "--help"], capture_output=True, text=True,
                       timeout=60)
    return "replay:" in r.stdout


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    if not _serve_supports_replay():
        pytest.fail("`omniwatch serve --gpu replay:TRACE` is missing (server.py change from the dashboards area)")
    tmp = tmp_path_factory.mktemp("demo-stack")
    root = tmp / "demo-logs"
    root.mkdir()
    endpoints, ep_port = demo_endpoints.start()
    cfg = StackConfig(run_dir=tmp / "run", prometheus_port=free_port(), alertmanager_port=free_port(),
                      exporter_port=free_port(), grafana_port=free_port(), profile="fast", watch=[str(root)],
                      exporter_args=["--poll-interval", "0.2", "--gpu", f"replay:{loop.DEFAULT_TRACE}",
                                     "--gpu-node", GPU_NODE]
                      + demo_endpoints.ray_tasks_args("127.0.0.1", ep_port, demo.PROJECT, JOINED),
                      extra_scrape_configs=demo_endpoints.scrape_configs("127.0.0.1", ep_port, demo.PROJECT, JOINED,
                                                                        also=[(demo.PROJECT, ALSO_JOINED)]))
    stack = Stack(cfg)
    stop = threading.Event()
    threads = []
    try:
        stack.up()
        for sc in demo.scenarios(PACE_S, STEPS, ONSET):
            t = threading.Thread(target=demo.write_run, args=(sc, root, PACE_S, stop), daemon=True)
            t.start()
            threads.append(t)
        WRITERS[:] = threads
        joined = next(t for t, sc in zip(threads, demo.scenarios(PACE_S, STEPS, ONSET)) if sc.experiment == JOINED)
        sampler = threading.Thread(target=_why_slow_sampler, args=(cfg.prometheus_url, joined, stop), daemon=True)
        sampler.start()
        threads.append(sampler)
        _wait_ready(cfg.prometheus_url)
        yield cfg
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        stack.down()
        demo_endpoints.stop(endpoints)


def _wait_ready(prom: str, evaluations: int = 240) -> None:
    """Bounded by Prometheus's own progress (rule evaluations, 1 s each in the fast profile), not by the wall
    clock: demo runs scraped with their windows, GPU phases attributed, demo series and an alert."""
    run = f'project="{demo.PROJECT}",experiment="{JOINED}"'
    checks = {
        "runs": lambda: len(_query(prom, f"{names.STEP} >= 12")) >= 6,
        "window stats": lambda: bool(_query(prom, f'{names.REWARD_BOUND_WINDOW}{{{run}}}')),
        "gpu rate": lambda: bool(_query(prom, f"rate({names.GPU_BUSY_SECONDS_TOTAL}[1m])")),
        # the ranking panels rank over a 15 s subquery grid: Grafana shows them once one grid point has a rate
        "gpu history": lambda: bool(_query(prom, f"avg_over_time(rate({names.GPU_BUSY_SECONDS_TOTAL}[1m])[1h:15s])")),
        "gpu phases": lambda: bool(_query(prom, f"rate({names.GPU_PHASE_IDLE_SECONDS_TOTAL}{{{run}}}[1m])")),
        "gpu idle ratio": lambda: bool(_query(prom, f"{names.GPU_IDLE_RATIO}{{{run}}}")),
        "demo endpoints": lambda: bool(_query(prom, "rate(vllm_omni:e2e_request_latency_s_count[1m]) > 0")),
        "alerts": lambda: bool(_query(prom, 'ALERTS{experiment=~".+"}')),
        # StepTimeRegression's creep series needs the reference's 10th normal step after warm-up and 10 normal
        # steps after it: step ~22 of the joined run (the demo writes 24)
        "drift": lambda: bool(_query(prom, f'{REC_STEP_DRIFT}{{{run}}}')),
        # worker lanes (the Ray state-API stand-in): a finished dispatch with its straggler, and the held step
        "worker lanes": lambda: bool(_query(prom, f'{names.RAY_STRAGGLER_STREAK}{{{run}}}'))
        and bool(_query(prom, f'{names.STEP_HOLDER_SECONDS}{{{run}}} > 2')),
        # GPU time by fleet (the replayed GPU charged to the stand-in's workers)
        "gpu fleet": lambda: bool(_query(prom, f"rate({names.GPU_FLEET_SECONDS_TOTAL}{{{run}}}[1m]) > 0")),
    }
    pending = dict(checks)

    def all_seen() -> bool:
        for what, fn in list(pending.items()):
            if fn():
                del pending[what]
        return not pending
    wait_evaluations(prom, all_seen, evaluations, what=lambda: f"demo stack not ready: {sorted(pending)}")
    time.sleep(2)  # two more scrapes: every rate() window holds post-ready samples


def test_every_panel_of_every_dashboard_shows_data_on_the_demo_stack(demo_stack):
    failures = v.verify(demo_stack.prometheus_url, rate_interval="1m")
    assert not failures, f"{len(failures)} of {v.count_targets()} targets empty:\n" + "\n".join(map(str, failures))


# Panels that depend on what the run logs, not on its sources: the joined demo run never validates, saves no
# checkpoint and has no rollout correction configured (healthy-control does all three, so the all-runs check
# above proves those panels).
NOT_LOGGED_BY_JOINED = {"Validation reward", "Rejected sequences, window min", "Planned work before the next step"}


def test_the_demo_run_with_gpu_and_engine_sources_fills_every_panel(demo_stack):
    failures = v.verify(demo_stack.prometheus_url, demo.PROJECT, JOINED, "1m")
    failures = [f for f in failures if not (f.panel in NOT_LOGGED_BY_JOINED and f.reason == "no series")]
    assert not failures, "\n".join(map(str, failures))


def test_the_first_screen_of_the_reward_bound_run_names_reward_bound_rollout_and_its_fix(demo_stack):
    """Issue 32 'Done when': on the demo, while RewardBoundRollout fires for the reward-bound run (it also straggles
    a rank: RankStraggler, from the Ray stand-in joined to it), the first screen's "Why slow" row names
    RewardBoundRollout, what it costs (reward on the critical path) and its one-line fix — at every sample it
    fires (until a stall past its warning, which costs every GPU, rightly takes the top), not only some."""
    for t in WRITERS:
        t.join(timeout=240)
    for _ in range(120):  # bounded: until RewardBoundRollout has fired at a few samples (Prometheus may lag)
        if sum(x["firing"] for x in FIRST_SCREEN) >= 5:
            break
        time.sleep(1)
    during = [x for x in list(FIRST_SCREEN) if x["firing"] and not x["stalled"]]
    assert len(during) >= 3, (f"RewardBoundRollout fired at {len(during)} samples of {len(FIRST_SCREEN)}",
                              [(x["firing"], x["stalled"], [r.get("alertname") for r in x["rows"]])
                               for x in FIRST_SCREEN])
    for x in during:
        [row] = x["rows"]
        assert row["alertname"] == names.ALERT_REWARD_BOUND and row["part"] == "reward_critical_path", x
        assert "reward.reward_model.enable_resource_pool=True" in row.get("action", ""), x


def test_the_worker_lanes_show_every_fleet_of_the_step(demo_stack):
    """Issue 32 item 6: the lanes showed actor ranks only; the demo's Ray stand-in runs agent-loop workers
    (generate_sequences) and reward-loop workers (compute_score) beside the actor ranks, and each has its lanes."""
    run = f'project="{demo.PROJECT}",experiment="{JOINED}"'
    roles = {s["metric"]["role"] for s in _query(
        demo_stack.prometheus_url, f"count by (role) (count_over_time({names.RAY_WORKER_PHASE}{{{run}}}[5m]))")}
    assert {"actor_rollout", "agent_loop", "reward_loop"} <= roles, roles


def test_the_demo_attaches_its_endpoints_to_two_runs_and_panels_keep_them_apart(demo_stack):
    """As `omniwatch demo` does: two runs with endpoints; every TransferQueue and scheduler series keeps its run."""
    prom = demo_stack.prometheus_url
    for expr in ("max by (project, experiment) (tq_controller_uptime_seconds)",
                 "max by (project, experiment) (replica:omniwatch_rollout_requests_running:sum)"):
        assert {s["metric"]["experiment"] for s in _query(prom, expr)} == {JOINED, ALSO_JOINED}, expr


def test_the_gpu_series_are_the_replayed_h200(demo_stack):
    prom = demo_stack.prometheus_url
    info = _query(prom, f'{names.GPU_INFO}{{node="{GPU_NODE}"}}')
    assert [s["metric"]["name"] for s in info] == ["NVIDIA H200"]
    busy = _query(prom, f'{names.GPU_BUSY_SECONDS_TOTAL}{{node="{GPU_NODE}"}}')
    idle = _query(prom, f'{names.GPU_IDLE_SECONDS_TOTAL}{{node="{GPU_NODE}"}}')
    assert float(busy[0]["value"][1]) > 0 and float(idle[0]["value"][1]) > 0


def test_the_healthy_run_ends_finished_and_the_stall_stage_says_so(demo_stack):
    """healthy-control ends as verl ends a run (a forced checkpoint and validation off the validation cadence on
    its last step): omniwatch marks it finished, the stall stage shows it, and TrainingStalled stays quiet for
    it while the run that stopped mid-way escalates."""
    from omniwatch.dashboards import panels as spec
    prom = demo_stack.prometheus_url
    for t in WRITERS:  # the runs end when their writers do (40 steps at 0.5 s); what follows is Prometheus's clock
        t.join(timeout=240)
        assert not t.is_alive(), "a demo writer still writing after 240 s"
    stages: dict = {}

    def ended_and_stalled() -> bool:
        stages.clear()
        stages.update({s["metric"]["experiment"]: float(s["value"][1])
                       for s in _query(prom, v.substitute(spec.stall_stage()))})
        return stages.get("healthy-control") == spec.STAGE_FINISHED and stages.get("stalled") == spec.STAGE_CRITICAL
    # the stall escalates through its for: windows once the writers stop: bounded by 120 evaluations, not seconds
    wait_evaluations(prom, ended_and_stalled, 120, what=lambda: f"stall stages {stages}", every=1)
    assert stages.get("healthy-control") == spec.STAGE_FINISHED, stages
    assert stages.get("stalled") == spec.STAGE_CRITICAL, stages
    assert not _query(prom, f'ALERTS{{alertname="{names.ALERT_STALLED}", experiment="healthy-control"}}')
