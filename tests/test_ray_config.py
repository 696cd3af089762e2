"""The Ray settings RayTaskEventsLost's runbook tells users to raise, checked on the Ray wheel the tests run
(docs/runbooks.md#raytaskeventslost): the GCS's task-event cap and the worker-side status-event buffer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_ray_tq

pytestmark = [pytest.mark.ray]


def _config(env: dict[str, str]) -> str:
    code = "import ray._raylet as r; print(r.Config.task_events_max_num_task_in_gcs())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}).stdout.strip()


def test_the_runbooks_ray_settings_exist_with_the_defaults_it_quotes():
    require_ray_tq("ray")
    import ray
    assert ray.__version__ == "2.60.0"
    assert _config({}) == "100000"                                        # the default the runbook quotes
    assert _config({"RAY_task_events_max_num_task_in_gcs": "7"}) == "7"   # and the variable it names is read
    raylet = (Path(ray.__file__).parent / "_raylet.so").read_bytes()
    # the worker-side buffer: the name the task-event recorder's drop warning tells users to raise
    assert b"set a higher value for RAY_task_events_max_num_status_events_buffer_on_worker(" in raylet
