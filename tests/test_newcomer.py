"""A newcomer's first hour, end to end with the real binaries: `omniwatch demo`, `omniwatch down`, then
`omniwatch up --watch <empty dir>` in the same run directory. The real stack must show no demo series and
no alert but Watchdog (the demo keeps its own run dir and state; the exporter does not export runs no
current source produces); `up` and `status` say where the dashboards are, in lines that fit 80 columns."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from omniwatch.promapi import PromAPI

from .conftest import free_port, require_binary, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _ow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniwatch", *args], capture_output=True, text=True, timeout=timeout)


def _query(prom: str, q: str) -> list:
    with PromAPI(prom, timeout=5) as api:
        return api.query(q)


def _fits(line: str) -> bool:
    """80 columns, or a path alone on its line (longer than a terminal, but never broken in two)."""
    return len(line) <= 80 or (len(line.split()) == 1 and "/" in line)


def test_demo_then_real_stack_shows_nothing_of_the_demo(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    ports = {"--prometheus-port": free_port(), "--alertmanager-port": free_port(), "--exporter-port": free_port(),
             "--grafana-port": free_port()}
    common = ["--run-dir", str(tmp_path / ".omniwatch")] + [str(x) for kv in ports.items() for x in kv]
    prom = f"http://127.0.0.1:{ports['--prometheus-port']}"
    try:
        demo = _ow("demo", *common, "--steps", "10", "--step-seconds", "1", "--onset", "4", "--timeout", "45",
                   timeout=240)
        assert (tmp_path / ".omniwatch" / "demo" / "state").is_dir(), demo.stdout[-2000:] + demo.stderr[-2000:]
        # the demo's stack was up and saw its runs
        assert "Simulating" in demo.stdout, demo.stdout[-2000:] + demo.stderr[-2000:]
        state = tmp_path / ".omniwatch" / "demo" / "state" / "exporter-state.json"
        assert b"omniwatch-demo" in state.read_bytes(), "the demo's exporter checkpointed no runs"
        # the demo's Ray state-API stand-in stopped with the demo (issue 35 item 16): the address the exporter
        # polls answers no more while the other stand-ins stay up for a look, and no straggler streak (what
        # RankStraggler thresholds) is exported once the next poll fails; the exporter had asked it (the control)
        run = tmp_path / ".omniwatch" / "demo"
        argv = json.loads((run / "pids" / "exporter.json").read_text())["argv"]
        ray = argv[argv.index("--ray-tasks") + 1]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{ray}/api/version", timeout=3)
        assert not (run / "pids" / "raystate.json").exists()  # stopped, its pid file gone
        exporter = f"http://127.0.0.1:{ports['--exporter-port']}/metrics"
        endpoints = json.loads((run / "pids" / "endpoints.json").read_text())
        assert os.path.exists(f"/proc/{endpoints['pid']}"), "the other stand-ins stay up after the demo"

        def no_streak():
            text = httpx.get(exporter, timeout=5).text
            calls = [ln for ln in text.splitlines() if ln.startswith("omniwatch_ray_state_api_calls_total ")]
            return calls and float(calls[0].split()[1]) > 0 and "omniwatch_ray_straggler_dispatches{" not in text
        wait_for(no_streak, timeout=20, what="no straggler streak once the demo's Ray is gone")
        down = _ow("down", *common[:2])
        assert "(demo)" in down.stdout, down.stdout

        empty = tmp_path / "real-logs"
        empty.mkdir()
        up = _ow("up", *common, "--profile", "fast", "--watch", str(empty))
        assert up.returncode == 0, up.stdout + up.stderr
        lines = up.stdout.splitlines()
        assert all(_fits(line) for line in lines), up.stdout
        assert any(line.strip().startswith("dashboards") for line in lines), up.stdout
        # Prometheus scraped the new exporter a few times and evaluated the rules well past
        # TrainingStalled's 3 typical (1 s) steps + for: 15s, had the demo's stalled runs come back.
        wait_for(lambda: _query(prom, 'count_over_time(up{job="omniwatch"}[1m]) >= 5'), timeout=60,
                 what="5 scrapes of the exporter")
        time.sleep(20)
        assert _query(prom, "omniwatch_runs") and float(_query(prom, "omniwatch_runs")[0]["value"][1]) == 0
        assert not _query(prom, '{project="omniwatch-demo"}'), "demo series in the real stack"
        firing = {a["metric"]["alertname"] for a in _query(prom, 'ALERTS{alertstate="firing"}')}
        assert firing == {"Watchdog"}, firing

        st = _ow("status", *common[:2])
        assert st.returncode == 0, st.stdout + st.stderr
        assert all(_fits(line) for line in st.stdout.splitlines()), st.stdout
        assert "(demo)" not in st.stdout and "dashboards" in st.stdout
    finally:
        _ow("down", *common[:2])
