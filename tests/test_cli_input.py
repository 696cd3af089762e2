"""Bad input on the command line (issue 27 item 7): every flag is checked while it is parsed, the error is
one line naming the flag, and nothing destructive happens before (the demo wipes its previous data only
after its flags and ports were checked). Also: `omniwatch alerts` finds the exporter at
OMNIWATCH_EXPORTER_PORT (item 6)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import free_port, stop_process, wait_for
from .test_head_node import _Holder


def _ow(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniwatch", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("argv, words", [
    (["serve", "--listen", "nonsense"], ["omniwatch serve: error: argument --listen", "'nonsense' is not HOST:PORT"]),
    (["serve", "--listen", "127.0.0.1:70000"], ["--listen", "1..65535"]),
    (["serve", "--poll-interval", "0"], ["--poll-interval", "positive"]),
    (["alerts", "--limit", "0"], ["omniwatch alerts: error: argument --limit: 0 is out of range: 1..1000"]),
    (["alerts", "--limit", "x"], ["--limit", "'x' is not an integer"]),
    (["demo", "--steps", "-3"], ["omniwatch demo: error: argument --steps: -3 is out of range: at least 3"]),
    (["up", "--exporter-port", "99999"], ["omniwatch up: error: argument --exporter-port: 99999 is not a port"]),
    (["report", "x.jsonl", "--jobs", "0"], ["--jobs"]),
    (["nonsense-command"], ["omniwatch: error: argument COMMAND: invalid choice: 'nonsense-command'"]),
])
def test_a_bad_flag_is_one_line_naming_it(argv, words):
    _one_line_error(_ow(*argv), *words)


def test_a_bad_setting_in_the_environment_is_one_line():
    r = _ow("status", env={"OMNIWATCH_EXPORTER_PORT": "abc"})
    _one_line_error(r, "omniwatch: bad setting", "port")


def _previous_demo(run_dir: Path) -> list[Path]:
    """What a previous demo left: its run logs, TSDB and alert history (the demo wipes them when it starts)."""
    files = [run_dir / "demo" / "demo-logs" / "omniwatch-demo" / "healthy-control.jsonl",
             run_dir / "demo" / "data" / "prometheus" / "wal" / "00000000",
             run_dir / "demo" / "state" / "alerts.sqlite"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("from the previous demo\n")
    return files


@pytest.mark.parametrize("argv", [["--steps", "-3"], ["--steps", "10", "--onset", "10"], ["--step-seconds", "0"]])
def test_a_rejected_demo_leaves_the_previous_demo_data(tmp_path, argv):
    files = _previous_demo(tmp_path / ".omniwatch")
    r = _ow("demo", "--run-dir", str(tmp_path / ".omniwatch"), *argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(f.read_text() == "from the previous demo\n" for f in files)


def test_a_demo_on_ports_another_process_holds_wipes_nothing(tmp_path):
    files = _previous_demo(tmp_path / ".omniwatch")
    ports = [free_port() for _ in range(4)]
    held = _Holder(ports[2])  # the exporter's port, held by a real listener
    try:
        r = _ow("demo", "--run-dir", str(tmp_path / ".omniwatch"), "--prometheus-port", str(ports[0]),
                "--alertmanager-port", str(ports[1]), "--exporter-port", str(ports[2]), "--grafana-port", str(ports[3]))
    finally:
        held.close()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"port {ports[2]} (exporter) is already in use by pid {os.getpid()}" in r.stderr, r.stderr
    assert all(f.read_text() == "from the previous demo\n" for f in files)


@pytest.mark.integration
def test_alerts_reads_the_exporter_at_the_configured_port(tmp_path):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{port}",
                          "--state-dir", str(tmp_path / "state")], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        import httpx
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, timeout=30,
                 what="the exporter")
        r = _ow("alerts", "--json", env={"OMNIWATCH_EXPORTER_PORT": str(port)})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["alerts"] == []
        other = _ow("alerts", env={"OMNIWATCH_EXPORTER_PORT": str(free_port())})
        assert other.returncode == 1 and "is the stack up?" in other.stderr, other.stderr
    finally:
        stop_process(p.pid)
