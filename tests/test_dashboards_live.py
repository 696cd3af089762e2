"""Every panel of every generated dashboard shows data in a real Prometheus (the issue's proof, since
Grafana cannot run here): exporter fed with the recorded verl fixtures (tests/fixtures/verl), its GPU sampler
on the recorded H200 trace (looping replay, phases attributed from the trace's own steps), demo endpoints
attached to two runs, two simulated runs for what no recorded run logs (rollout correction, a finished run,
a straggler), alert rules. No panel is exempt but the rollout-correction one for the demo run alone (it logs
none). verify() also fails a series of a run-scoped panel without its run and a per-run copy of a repeated
panel that shows another run."""
from __future__ import annotations

import time

import pytest

from omniwatch.alerting import records
from omniwatch import names
from omniwatch import config
from omniwatch.dashboards import verify as v
from omniwatch.dashboards.catalog import DASHBOARDS
from omniwatch.promapi import PromAPI

from .conftest import VERL_FIXTURES, fixture_path, require_binary
from .dashboards_live_support import DEMO_RUN, ENDPOINT_RUNS, GPU_NODE, REPLAY_GPUS, LiveStack

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def stack():
    fixture_path("flowgrpo_healthy")  # fails loudly if the recorded runs are missing
    s = LiveStack(VERL_FIXTURES, require_binary("prometheus"), step_delay=0.05)
    try:
        s.start()
        s.wait_ready(timeout=240)   # bounded; a loaded 2-core machine (CI) needs more than the 120 s default
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_every_panel_shows_data(stack, d):
    failures = v.verify(stack.prom_url, dashboards=(d,), rate_interval="1m")
    assert not failures, "\n".join(map(str, failures))


# Panels that depend on what the run logs, not on its sources: the demo run (a recorded FlowGRPO run) has no
# rollout correction configured and logs no checkpoint or validation timer; the simulated rollout-drift run
# proves both panels in the all-runs check.
NOT_LOGGED_BY_DEMO_RUN = {"Rejected sequences, window min", "Planned work before the next step"}


def test_a_single_run_selection_still_fills_the_run_panels(stack):
    project, experiment = DEMO_RUN
    failures = v.verify(stack.prom_url, project, experiment, "1m")
    failures = [f for f in failures if not (f.panel in NOT_LOGGED_BY_DEMO_RUN and f.reason == "no series")]
    assert not failures, "\n".join(map(str, failures))


def test_gpu_panels_come_from_the_replayed_sampler(stack):
    """The GPU series are the sampler's (not the DCGM/Ray stand-ins): one per replayed GPU, the
    trace's H200, and phase idle attributed to the demo run from its replayed steps."""
    util = stack.query(f'{names.GPU_UTILIZATION}{{node="{GPU_NODE}"}}')
    assert len(util) == REPLAY_GPUS
    info = stack.query(names.GPU_INFO)
    assert {s["metric"]["name"] for s in info} == {"NVIDIA H200"}
    def phases():
        return {s["metric"]["phase"] for s in stack.query(
            f'{names.GPU_PHASE_IDLE_SECONDS_TOTAL}{{project="{DEMO_RUN[0]}",experiment="{DEMO_RUN[1]}"}}')}
    # replayed steps are attributed once the samples covering them arrived: wait (bounded) for a full step
    deadline = time.monotonic() + 60
    while not {"gen", "reward", "update_actor"} <= phases() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert {"gen", "reward", "update_actor"} <= phases(), phases()
    assert stack.replayed_steps >= 1


def test_selecting_a_run_that_does_not_exist_empties_the_panels(stack):
    failures = v.verify(stack.prom_url, "no-such-project", ".*", "1m", dashboards=DASHBOARDS[:1])
    # every target of a run-scoped panel is empty: the filters really filter (the exporter's own health,
    # "Data arriving", belongs to no run)
    run_targets = sum(len(p.targets) for p in DASHBOARDS[0].panels() if p.scope == "run")
    assert len([f for f in failures if f.reason == "no series"]) >= run_targets


# Panels of families only the vllm_omni: prefix has (the second endpoint set speaks vllm:omni_).
VLLM_OMNI_ONLY = {"Images per second", "DiT execution per denoising step", "DiT execution per request",
                  "Pre- and post-processing", "Failed requests"}


@pytest.mark.parametrize("uid", ["omniwatch-rollout", "omniwatch-transferqueue"])
def test_endpoints_attached_to_two_runs_stay_two_runs_in_every_panel(stack, uid):
    """The demo attaches rollout/reward/TransferQueue endpoints to two runs: every run-scoped target shows
    both runs as their own series (a `sum by (op_type)` would merge them into one), in every name form."""
    d = next(d for d in DASHBOARDS if d.uid == uid)
    want = {f"{p}/{e}" for p, e in ENDPOINT_RUNS}
    checked = 0
    for p in d.panels():
        if p.scope != "run" or p.title.removesuffix(": $experiment") in VLLM_OMNI_ONLY:  # fleet panels: one per run
            continue
        for t in p.targets:
            series = stack.query(v.substitute(t.expr))
            runs = {f"{s['metric'].get('project')}/{s['metric'].get('experiment')}" for s in series}
            assert runs == want, (p.title, t.expr, runs)
            checked += 1
    assert checked >= 10


def test_each_run_is_read_over_its_own_typical_steps(stack):
    """$window (3 typical steps by default) is per run: each run's window is the smallest ladder rung that holds 3
    of its own typical steps, whatever the other runs' steps (issue 26 item 3)."""
    from omniwatch.dashboards import panels as spec
    from omniwatch.config import DEFAULT
    assert v.window_choices() == [str(k) for k in spec.window_steps(DEFAULT)] and v.default_window() == "3"
    typical = {(s["metric"]["project"], s["metric"]["experiment"]): float(s["value"][1])
               for s in stack.query(spec.run_max(spec.sel(names.TYPICAL_STEP)).replace("$project", ".*")
                                    .replace("$experiment", ".*"))}
    spans = {(s["metric"]["project"], s["metric"]["experiment"]): float(s["value"][1])
             for s in stack.query(v.substitute(spec.window_range_seconds()))}
    assert len(typical) >= 3 and set(typical) <= set(spans)
    for run, t in typical.items():
        assert spans[run] == next((r for r in spec.WINDOW_LADDER if 3 * t <= r), spec.WINDOW_LADDER[-1]), (run, t)


def test_verify_reports_errors_instead_of_crashing(stack):
    bad = v.verify("http://127.0.0.1:9", dashboards=DASHBOARDS[:1])
    assert bad and all(f.reason.startswith("error:") for f in bad)


def _range_order(stack, expr: str, label: str) -> list[str]:
    """The ``label`` values of a range query's series, in the order Prometheus returns them (Grafana's stack)."""
    prom = PromAPI(stack.prom_url)
    try:
        now = time.time()
        data = prom.query_range_data(v.substitute(expr, window=v.default_window()), now - 30, now, 5)
    finally:
        prom.close()
    return [s["metric"][label] for s in data["result"]]


def test_stacks_come_in_the_exporters_order(stack):
    """Prometheus returns the stacked series in reading order: the ledger's buckets as ledger.ordered() puts
    them, the step's phases as analytics.PHASE_ORDER (untracked last)."""
    from omniwatch.core import ledger
    from omniwatch.dashboards import panels as spec
    from omniwatch.dashboards.catalog import by_uid
    exp = v.prom_regex_escape(DEMO_RUN[1])
    share = spec.ledger_share().replace("$experiment", exp)
    buckets = _range_order(stack, share, names.L_BUCKET)
    assert len(buckets) >= 5 and buckets == ledger.ordered(buckets), buckets
    from omniwatch.config import DEFAULT
    [phases_target] = next(p for p in by_uid("omniwatch-run-overview", DEFAULT).panels()
                           if p.title == "Step time by phase: $experiment").targets
    phases = _range_order(stack, phases_target.expr.replace("$experiment", exp), names.L_PHASE)
    assert phases == [ph for ph in spec.PHASES if ph in phases] and phases[-1] == names.UNTRACKED_PHASE, phases


def test_the_stall_stages_reach_the_panels_and_the_finished_run_is_marked(stack):
    """The hang escalates to critical (stage, gauge label, and a 'TrainingStalled (critical)' row in the alert
    timeline); the run whose last step was its planned last is finished; every other run is running."""
    from omniwatch.dashboards import panels as spec
    from .dashboards_live_support import FINISHED_RUN, HANG_RUN

    def now(expr: str, experiment: str = ".*") -> dict:
        return {s["metric"]["experiment"]: s for s in stack.query(v.substitute(expr, experiment=experiment))}

    def timeline() -> dict:
        return {s["metric"]["alertname"]: float(s["value"][1])
                for s in stack.query(v.substitute(spec.alert_states_by_run(), experiment=HANG_RUN[1]))}
    staged = {f"{names.ALERT_STALLED} ({sev})" for sev in ("info", "warning", "critical")}
    deadline = time.monotonic() + 90  # critical after 10 typical steps (20 s) + for: 15s
    while not staged <= set(timeline()) and time.monotonic() < deadline:
        time.sleep(1)
    assert staged <= set(timeline()), timeline()
    stages = {e: float(s["value"][1]) for e, s in now(spec.stall_stage()).items()}
    assert stages.pop(HANG_RUN[1]) == spec.STAGE_CRITICAL
    assert stages.pop(FINISHED_RUN[1]) == spec.STAGE_FINISHED
    assert set(stages.values()) == {spec.STAGE_RUNNING}, stages
    gauge = {e: s["metric"]["stage"] for e, s in now(spec.age_steps_by_stage()).items()}
    assert gauge[FINISHED_RUN[1]] == "finished" and gauge[HANG_RUN[1]] == "critical"


def test_the_simulated_faults_reach_their_panels(stack):
    from .dashboards_live_support import SIM_RUNS
    drift, straggler = SIM_RUNS[0][1], SIM_RUNS[1][1]
    rs = {s["metric"]["experiment"]: float(s["value"][1]) for s in stack.query(records.REC_RS_MASKED_MIN)}
    assert rs[drift] > config.DEFAULT.rollout_rejection.seq_masked_fraction
    ratio = {s["metric"]["experiment"]: float(s["value"][1]) for s in stack.query(records.REC_STRAGGLER_MIN)}
    assert ratio[straggler] > config.DEFAULT.straggler.ratio > ratio[DEMO_RUN[1]]
