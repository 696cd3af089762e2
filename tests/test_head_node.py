"""Beside a real run on a head node (issue 27), with the real binaries: a watch path with a typo is said
loudly and watched for, `status` lists what is watched and the runs and bad lines per path, `up` with a
changed configuration restarts exactly what changed, and ports that other processes hold are reported
with the port and the holder's pid instead of a false "stack up"."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from .conftest import fixture_path, free_port, require_binary, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _ow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniwatch", *args], capture_output=True, text=True, timeout=timeout)


def _ports() -> dict:
    return {"--prometheus-port": free_port(), "--alertmanager-port": free_port(), "--exporter-port": free_port(),
            "--grafana-port": free_port()}


def _common(run_dir: Path, ports: dict) -> list[str]:
    return ["--run-dir", str(run_dir)] + [str(x) for kv in ports.items() for x in kv]


def _pid(run_dir: Path, name: str) -> int:
    return json.loads((run_dir / "pids" / f"{name}.json").read_text())["pid"]


def test_a_wrong_watch_path_is_said_watched_for_and_fixed_by_up_with_the_right_one(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    ports, run_dir = _ports(), tmp_path / ".omniwatch"
    common = _common(run_dir, ports)
    exporter = f"http://127.0.0.1:{ports['--exporter-port']}"
    root = tmp_path / "verl-logs"          # the right path
    typo = tmp_path / "verl-log"           # the typo, which verl will never create
    try:
        up = _ow("up", *common, "--profile", "fast", "--watch", str(typo))
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"WARNING: --watch {typo}" in up.stderr and "does not exist" in up.stderr, up.stderr
        assert "MISSING: does not exist yet (watched for)" in up.stdout, up.stdout
        log = (run_dir / "logs" / "exporter.log").read_text()
        assert f"watch path {typo} does not exist" in log, log[-2000:]

        st = _ow("status", *common[:2])
        assert str(typo) in st.stdout.split() and "MISSING: does not exist yet" in st.stdout, st.stdout

        # The run starts: verl writes <root>/<project>/<experiment>.jsonl, two lines of it malformed.
        lines = fixture_path("flowgrpo_healthy").read_text().splitlines()
        (root / "proj").mkdir(parents=True)
        (root / "proj" / "exp.jsonl").write_text("\n".join(lines[:5] + ["{not json", "[1, 2"] + lines[5:6]) + "\n")
        prom_pid, exp_pid = _pid(run_dir, "prometheus"), _pid(run_dir, "exporter")

        fixed = _ow("up", *common, "--profile", "fast", "--watch", str(root))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "restarted with the new configuration: exporter)" in fixed.stdout, fixed.stdout
        assert "WARNING" not in fixed.stderr, fixed.stderr
        assert _pid(run_dir, "exporter") != exp_pid and _pid(run_dir, "prometheus") == prom_pid
        sources = httpx.get(f"{exporter}/api/v1/sources", timeout=5).json()
        assert [s["spec"] for s in sources] == [str(root)], sources

        def counted():
            out = _ow("status", *common[:2]).stdout
            return out if "1 run(s) with steps, 1 file(s)" in out and "2 of 8 lines skipped" in out else None
        st = wait_for(counted, timeout=30, what="status counting the run and its bad lines")
        assert "2 of 8 lines skipped (malformed_json 2)" in st, st
        assert f"{root}/proj/exp.jsonl:6" in st, st
        log = (run_dir / "logs" / "exporter.log").read_text()
        assert f"{root}/proj/exp.jsonl line 6 skipped: malformed_json" in log, log[-2000:]
        assert f"{root}/proj/exp.jsonl line 7 skipped: malformed_json" in log, log[-2000:]

        # the same configuration again: nothing restarts
        again = _ow("up", *common, "--profile", "fast", "--watch", str(root))
        assert again.returncode == 0 and "restarted" not in again.stdout, again.stdout + again.stderr
        assert _pid(run_dir, "prometheus") == prom_pid
    finally:
        _ow("down", *common[:2])


class _Holder:
    """A real listener on a port, answering 200 to every GET (as another stack's /healthz, /-/ready do)."""

    def __init__(self, port: int):
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_ports_held_by_other_processes_are_a_conflict_not_a_stack_up(tmp_path):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    ports, run_dir = _ports(), tmp_path / ".omniwatch"
    held = [_Holder(ports[f]) for f in ("--exporter-port", "--prometheus-port", "--alertmanager-port")]
    try:
        up = _ow("up", *_common(run_dir, ports), "--profile", "fast")
        assert up.returncode == 1, up.stdout + up.stderr
        assert "stack up" not in up.stdout, up.stdout
        for flag, name in (("--exporter-port", "exporter"), ("--prometheus-port", "prometheus"),
                           ("--alertmanager-port", "alertmanager")):
            assert f"port {ports[flag]} ({name}) is already in use by pid {os.getpid()} (" in up.stderr, up.stderr
            assert f"({flag} N, env OMNIWATCH_{name.upper()}_PORT)" in up.stderr, up.stderr
        assert "Traceback" not in up.stderr
        # nothing was started (a conflict is found before the first process)
        assert not list((run_dir / "pids").glob("*.json")), list((run_dir / "pids").iterdir())
        st = _ow("status", "--run-dir", str(run_dir))
        assert st.returncode == 3 and "nothing runs" in st.stdout, st.stdout
    finally:
        for h in held:
            h.close()
        _ow("down", "--run-dir", str(run_dir))


def test_readiness_asks_who_listens_on_the_port(tmp_path):
    """The check `up` applies once a component answers: the listener must be the process it started."""
    from omniwatch import ports
    port = free_port()
    h = _Holder(port)
    try:
        assert ports.in_use("127.0.0.1", port)
        assert ports.owned_by(port, os.getpid()) is True
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert ports.owned_by(port, child.pid) is False  # answering 200, but not the process we started
        finally:
            child.kill()
            child.wait()
        assert f"pid {os.getpid()} (" in ports.describe_holder(port)
    finally:
        h.close()
    assert not ports.in_use("127.0.0.1", port)


def test_slack_from_the_environment_gets_the_alerts_with_runbook_links_to_this_exporter(tmp_path):
    """`make up SLACK_URL=...` (OMNIWATCH_SLACK_URL): an alert sent to the stack's Alertmanager reaches a
    local Slack-compatible receiver through the exporter's relay; its runbook link names the exporter's
    real port, not the 19095 the rules were generated with (item 3 on the native path, item 6)."""
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    from .relay_support import Receiver
    ports, run_dir = _ports(), tmp_path / ".omniwatch"
    common = _common(run_dir, ports)
    slack = Receiver().start()
    env = {**os.environ, "OMNIWATCH_SLACK_URL": f"{slack.url}/services/T000/B000/XXXX"}
    try:
        (tmp_path / "logs").mkdir()
        up = subprocess.run([sys.executable, "-m", "omniwatch", "up", *common, "--profile", "fast", "--watch",
                             str(tmp_path / "logs")], capture_output=True, text=True, timeout=120, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "  notify       slack (slack): ok, 0 delivered, 0 pending, 0 failed" in up.stdout, up.stdout
        assert "T000" not in up.stdout + (run_dir / "config" / "receivers.yml").read_text()  # the URL stays secret
        am = f"http://127.0.0.1:{ports['--alertmanager-port']}"
        alert = [{"labels": {"alertname": "RewardBoundRollout", "severity": "warning", "project": "proj",
                             "experiment": "exp"},
                  "annotations": {"summary": "reward on the critical path",
                                  "runbook_url": "http://127.0.0.1:19095/runbooks#rewardboundrollout"}}]
        assert httpx.post(f"{am}/api/v2/alerts", json=alert, timeout=5).status_code == 200
        wait_for(lambda: slack.accepted, timeout=60, what="the Slack message at the local receiver")
        body = slack.accepted[0]["body"]
        assert slack.accepted[0]["path"] == "/services/T000/B000/XXXX"
        att = body["attachments"][0]
        assert att["title_link"] == f"http://127.0.0.1:{ports['--exporter-port']}/runbooks#rewardboundrollout", att
        assert "RewardBoundRollout" in json.dumps(body) and "proj/exp" in json.dumps(body)
        st = _ow("status", *common[:2])
        assert "slack (slack): ok, 1 delivered" in st.stdout, st.stdout
    finally:
        slack.stop()
        _ow("down", *common[:2])


def test_the_head_node_of_a_cluster_binds_the_exporter_where_agents_register_with_the_token(tmp_path):
    """`omniwatch up --exporter-bind ADDR` (item 11): the exporter listens on ADDR only (here 127.0.0.2, a
    second loopback address standing for the head's cluster IP), Prometheus scrapes it there, a node agent
    on another address (127.0.0.3) registers with the push token and is scraped through the exporter's
    service discovery; an agent without the token is refused."""
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    from omniwatch.promapi import PromAPI
    ports, run_dir = _ports(), tmp_path / ".omniwatch"
    common = _common(run_dir, ports)
    port = ports["--exporter-port"]
    agents = []
    try:
        up = _ow("up", *common, "--profile", "fast", "--exporter-bind", "127.0.0.2")
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"  listening    exporter on 127.0.0.2:{port}: /metrics readable from other hosts;" in up.stdout, \
            up.stdout
        assert f"omniwatch agents start --ray-address auto --exporter http://127.0.0.2:{port}" in up.stdout
        assert f"OMNIWATCH_PUSH_TOKEN_FILE={run_dir.resolve() / 'secrets' / 'push.token'}" in up.stdout
        assert httpx.get(f"http://127.0.0.2:{port}/healthz", timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        token_file = str(run_dir / "secrets" / "push.token")
        for listen, env in (("127.0.0.3:0", {"OMNIWATCH_PUSH_TOKEN_FILE": token_file}), ("127.0.0.4:0", {})):
            e = {k: v for k, v in os.environ.items() if not k.startswith("OMNIWATCH_PUSH_TOKEN")}
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "omniwatch", "agent", "--listen", listen, "--exporter",
                 f"http://127.0.0.2:{port}", "--gpu-mode", "off", "--heartbeat", "1", "--node", listen[:9]],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**e, **env}))
        sd = f"http://127.0.0.2:{port}/api/v1/agents/sd"
        got = wait_for(lambda: [t for g in httpx.get(sd, timeout=5).json() for t in g["targets"]], timeout=60,
                       what="the agent in the exporter's service discovery")
        assert len(got) == 1 and got[0].startswith("127.0.0.3:"), got
        prom = f"http://127.0.0.1:{ports['--prometheus-port']}"

        def scraped():
            with PromAPI(prom, timeout=5) as api:
                return {r["metric"]["job"] for r in api.query('up{job=~"omniwatch|omniwatch-agent"} == 1')} \
                    == {"omniwatch", "omniwatch-agent"}
        wait_for(scraped, timeout=90, what="Prometheus scraping the exporter on 127.0.0.2 and the agent")
        assert [t for g in httpx.get(sd, timeout=5).json() for t in g["targets"]] == got  # no token: refused
    finally:
        for a in agents:
            a.terminate()
            try:
                a.wait(10)
            except subprocess.TimeoutExpired:
                a.kill()
        _ow("down", *common[:2])
