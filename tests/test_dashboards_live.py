"""Every panel of every generated dashboard shows data in a real Prometheus (the issue's proof, since
Grafana cannot run here): exporter fed with the recorded verl fixtures (tests/fixtures/verl), its GPU sampler on the recorded
H200 trace (looping replay, phases attributed from the trace's own steps), demo endpoints, alert rules.
No panel is exempt."""
from __future__ import annotations

import time

import pytest

from omniwatch import names
from omniwatch.dashboards import verify as v
from omniwatch.dashboards.catalog import DASHBOARDS

from .conftest import VERL_FIXTURES, fixture_path, require_binary
from .dashboards_live_support import DEMO_RUN, GPU_NODE, REPLAY_GPUS, LiveStack

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def stack():
    fixture_path("flowgrpo_healthy")  # fails loudly if the recorded runs are missing
    s = LiveStack(VERL_FIXTURES, require_binary("prometheus"), step_delay=0.05)
    try:
        s.start()
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_every_panel_shows_data(stack, d):
    failures = v.verify(stack.prom_url, dashboards=(d,), rate_interval="1m")
    assert not failures, "\n".join(map(str, failures))


def test_a_single_run_selection_still_fills_the_run_panels(stack):
    project, experiment = DEMO_RUN
    failures = v.verify(stack.prom_url, project, experiment, "1m")
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
    # every target but the "or vector(0)" alert count is empty: the filters really filter
    assert len(failures) >= v.count_targets(DASHBOARDS[:1]) - 1


def test_verify_reports_errors_instead_of_crashing(stack):
    bad = v.verify("http://127.0.0.1:9", dashboards=DASHBOARDS[:1])
    assert bad and all(f.reason.startswith("error:") for f in bad)
