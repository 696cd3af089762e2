"""The hang, end to end (issue 31), against a real Ray 2.60 cluster running verl's real single controller inside a
TaskRunner.run call, the real exporter and a real Prometheus with the real rules (tests/hang_scenario.py, once per
module, inside ``unshare -n``): with no trainer config, a clean finish is finished and never pages; a failing job
pages TrainingCrashed with Ray's error; a hang in rank 1's update_actor is named, its stack (the line inside
update_actor) is in ``omniwatch ps`` within two polls of the hang being named and in TrainingStalled's warning.

``make test-ray`` installs Ray, verl and py-spy (.ci/install-ray-tq.sh) and runs these."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_ray_tq, skip_optional

ROOT = Path(__file__).resolve().parent.parent
RAY_REPORT_S = 1.0   # RAY_task_events_report_interval_ms default: how late a worker's task events reach the GCS
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ray]
sys.path.insert(0, str(ROOT / "tests"))


def hang_line() -> int:
    src = (ROOT / "tests" / "hang_trainer.py").read_text().splitlines()
    return next(i for i, x in enumerate(src, 1) if "HANG_LINE" in x)


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    require_ray_tq("ray", "verl", "torch", "tensordict")
    bindir = os.path.dirname(sys.executable)
    if not shutil.which("py-spy", path=os.pathsep.join([bindir, os.environ.get("PATH", "")])):
        if os.environ.get("OMNIWATCH_REQUIRE_RAY"):
            pytest.fail("py-spy is missing (ray[default] brings it; .ci/install-ray-tq.sh installs it)")
        skip_optional("py-spy is not installed (Ray's /task/traceback needs it)", "make test-ray")
    out = tmp_path_factory.mktemp("hang") / "observed.json"
    cmd = (f"ip link set lo up && PATH={bindir}:$PATH exec {sys.executable} "
           f"{ROOT / 'tests' / 'hang_scenario.py'} {out} {os.environ.get('OMNIWATCH_RECORD_HANG', '')}")
    r = subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=960)
    assert out.exists(), f"scenario wrote nothing (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    obs = json.loads(out.read_text())
    assert "error" not in obs, obs["error"] + obs.get("exporter_log", "")[-3000:]
    assert not obs.get("timeouts"), (obs.get("timeouts"), obs.get("exporter_log", "")[-4000:],
                                     {k: v for k, v in obs.items() if k.startswith("trainer_")})
    print(f"hang scenario: finished {obs['finish_finished_after_s']} s after the finish; TrainingCrashed firing "
          f"{obs['fail_alert_after_s']} s after the failed driver exited; hang named "
          f"{obs['hang_named_t'] - obs['hang_last_step_t']:.1f} s after the last step, its stack in ps "
          f"{obs['hang_stack_t'] - obs['hang_named_t']:.2f} s after it was named; TrainingStalled warning "
          f"{obs['hang_warning_t'] - obs['hang_last_step_t']:.1f} s after the last step; phases {obs['steps']}")
    return obs


@pytest.mark.timeout(1100)
def test_a_clean_finish_without_config_is_finished_and_never_pages(seen):
    assert seen["finish_rc"] == 0 and seen["finish_steps"] == 8
    (job,) = seen["finish_job"]
    assert (job["type"], job["status"], job["error"]) == ("DRIVER", "SUCCEEDED", "")
    # 3 typical steps (~2.5 s each) + for: 15s would have paged the info stage; it never fired (a page = firing)
    assert seen["finish_age_at_check_s"] > 60
    assert seen["finish_alerts_ever"] == [], seen["finish_alerts_ever"]


def test_a_failed_job_pages_with_rays_error_not_as_a_stall(seen):
    from hang_trainer import FAIL_TEXT
    assert seen["fail_rc"] not in (0, None)
    a = seen["fail_alert"]
    assert a["labels"]["severity"] == "critical"
    assert FAIL_TEXT in a["annotations"]["description"], a["annotations"]["description"]
    assert "the trainer's Ray job failed (Ray job " in a["annotations"]["description"]
    assert seen["fail_stalled"] == []
    # "at once": the job-table poll (5 s) + one evaluation; no for: (a run too short for the 10 s log-writer scan is
    # matched when its job has ended, by when its lines came: a few polls more)
    assert seen["fail_alert_after_s"] <= 45, seen["fail_alert_after_s"]


def test_the_hung_ranks_stack_line_in_ps_within_two_polls(seen):
    from hang_scenario import INTERVAL
    line = hang_line()
    st = seen["ps_stack"]["jobs"][0]["stack"]
    assert st["ok"] and st["rank"] == 1 and st["method"] == "update_actor", st
    assert re.search(rf"update_actor \((?:tests/)?hang_trainer\.py:{line}\)", st["stack"]), st["stack"]
    # two polls after the holder was named (+ the dump itself, + Ray's report lag)
    assert seen["hang_stack_t"] - seen["hang_named_t"] <= 2 * INTERVAL + RAY_REPORT_S + 2.0, \
        seen["hang_stack_t"] - seen["hang_named_t"]
    assert f"update_actor (tests/hang_trainer.py:{line})" in seen["ps_text"]
    # `omniwatch ps` against Ray directly takes its own dump
    direct = seen["ps_direct"]["jobs"][0]["stack"]
    assert direct and f"update_actor (tests/hang_trainer.py:{line})" in direct["stack"], seen["ps_direct"]
    assert f"update_actor (tests/hang_trainer.py:{line})" in seen["stacks_page"] and "Thread " in seen["stacks_page"]


def test_training_stalled_warning_names_the_holder_and_its_stack_line(seen):
    line = hang_line()
    a = seen["hang_warning"]
    d, rem = a["annotations"]["description"], a["annotations"]["remedy"]
    assert "Ray task events: update_actor: 3/4 ranks done in" in d and "rank 1 on node 127.0.0.1 still running" in d
    assert rem.startswith("Start where the step is held: update_actor: 3/4 ranks done"), rem
    assert f"update_actor (tests/hang_trainer.py:{line})" in rem, rem
    assert "nothing to do yet" not in rem.lower()
    assert seen["token_in_logs"] is False
