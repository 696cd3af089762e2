"""Every panel of every generated dashboard shows data in a real Prometheus (the issue's proof, since
Grafana cannot run here): exporter fed with the shared verl fixtures + demo endpoints + alert rules."""
from __future__ import annotations

import pytest

from omniwatch import names
from omniwatch.dashboards import verify as v
from omniwatch.dashboards.catalog import DASHBOARDS

from .conftest import VERL_FIXTURES, require_binary
from .dashboards_live_support import DEMO_RUN, LiveStack

pytestmark = [pytest.mark.integration]

# Panels whose series come only from omniwatch's NVML sampler (needs a GPU, or the GPU area's replay).
NVML_ONLY = (names.GPU_UTILIZATION, names.GPU_MEMORY_USED, names.GPU_POWER, names.GPU_SM_CLOCK,
             names.GPU_BUSY_SECONDS_TOTAL, names.GPU_PHASE_IDLE_SECONDS_TOTAL, names.GPU_PHASE_BUSY_SECONDS_TOTAL,
             names.GPU_IDLE_RATIO)


@pytest.fixture(scope="module")
def stack():
    if not (VERL_FIXTURES / "flowgrpo_healthy.jsonl").exists():
        pytest.skip("shared verl fixtures not present")
    s = LiveStack(VERL_FIXTURES, require_binary("prometheus"), step_delay=0.05)
    try:
        s.start()
        s.wait_ready()
        yield s
    finally:
        s.stop()


def _nvml_only(f: v.Failure) -> bool:
    return any(m in f.query for m in NVML_ONLY) and not any(
        x in f.query for x in ("DCGM_", "ray_node_"))


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_every_panel_shows_data(stack, d):
    failures = v.verify(stack.prom_url, dashboards=(d,), rate_interval="1m")
    real = [f for f in failures if not _nvml_only(f)]
    assert not real, "\n".join(map(str, real))


def test_a_single_run_selection_still_fills_the_run_panels(stack):
    project, experiment = DEMO_RUN
    failures = v.verify(stack.prom_url, project, experiment, "1m")
    real = [f for f in failures if not _nvml_only(f)]
    assert not real, "\n".join(map(str, real))


def test_selecting_a_run_that_does_not_exist_empties_the_panels(stack):
    failures = v.verify(stack.prom_url, "no-such-project", ".*", "1m", dashboards=DASHBOARDS[:1])
    # every target but the "or vector(0)" alert count is empty: the filters really filter
    assert len(failures) >= v.count_targets(DASHBOARDS[:1]) - 1


def test_verify_reports_errors_instead_of_crashing(stack):
    bad = v.verify("http://127.0.0.1:9", dashboards=DASHBOARDS[:1])
    assert bad and all(f.reason.startswith("error:") for f in bad)
