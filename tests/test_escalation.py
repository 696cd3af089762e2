"""Escalations on time (issue 31 item 4): a severity escalation (warning -> critical) reaches the receiver within
60 s of Prometheus firing it, and a standing alert is not sent again meanwhile.

Live: the real exporter (``omniwatch serve``, a JSONL run of 4 s steps that stops), a real Prometheus evaluating
the real rule files, a real Alertmanager with ``alerts/alertmanager.yml``'s routes as they ship (group_wait 10 s,
the escalating alerts' group_interval 30 s, repeat_interval 4 h), the exporter's relay and a loopback receiver
speaking Slack. Only Prometheus' scrape and evaluation intervals are 1 s instead of 15 s: they decide *when*
Prometheus fires (the start of the measured interval), not what happens after. Prometheus sends an alert to
Alertmanager at the evaluation that turns it firing, at any interval, so the measured time from firing to the
receiver is Alertmanager's grouping (the real settings) + the relay. The firing time is taken as the earliest it
can be (Prometheus' ``activeAt`` + the rule's ``for:``), so the figure is an upper bound.

The stall is timed so the critical stage fires 12 s after the warning, i.e. after the warning's group was first
flushed (group_wait 10 s): the critical joins an existing group, the case that waited for the 5-minute
group_interval before (Slack got a critical fired at +99 s at +378 s)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from omniwatch import rules

from .conftest import REPO, budget, free_port, require_tool, stop_process
from .relay_support import Receiver
from omniwatch.yamlio import load as yaml_load

# the run's typical step: info at 3 T = 21 s, warning at 7 T = 49 s, critical at 10 T = 70 s. The critical comes 3 T
# = 21 s after the warning: more than the warning's group_wait (10 s) + its delivery on a loaded machine (2.5 s seen
# in CI), so the warning's group has flushed when the critical joins it, the case this test is for (at 4 s steps
# the 12 s gap left CI's loaded run 0.5 s short of it)
STEP_S = 7.0
RULES = [yaml_load(p.read_text()) for p in sorted((REPO / "alerts").glob("*.rules.yml"))]
AM = yaml_load(rules.alertmanager_config_path().read_text())


def dur(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def _matches(matchers: list[str], labels: dict) -> bool:
    for m in matchers:
        k, op, v = re.fullmatch(r'\s*(\w+)\s*(=~|!=|=)\s*"(.*)"\s*', m).groups()
        got = labels.get(k, "")
        ok = re.fullmatch(v, got) is not None if op == "=~" else (got == v) == (op == "=")
        if not ok:
            return False
    return True


def route_for(labels: dict) -> dict:
    """The first child route of alertmanager.yml matching ``labels`` (its settings over the root's)."""
    root = AM["route"]
    for i, r in enumerate(root.get("routes", [])):
        if _matches(r.get("matchers", []), labels):
            return {**{k: root[k] for k in ("group_wait", "group_interval", "repeat_interval")}, **r, "index": i}
    return {**root, "index": None}


def test_every_escalating_alert_is_grouped_for_escalations_on_time():
    """Every alert with more than one severity in the rule files: its warning and critical stages share one route
    (one group per run: one thread, one resolved message) that flushes within 30 s, and repeats no more often
    than the default (4 h)."""
    sev: dict[str, set[str]] = {}
    for doc in RULES:
        for g in doc["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    sev.setdefault(r["alert"], set()).add(r["labels"]["severity"])
    escalating = {a: s for a, s in sev.items() if len(s) > 1}
    assert {"TrainingStalled", "TransferQueueBacklog"} <= set(escalating)
    for alert, severities in escalating.items():
        paged = [route_for({"alertname": alert, "severity": s}) for s in sorted(severities - {"info"})]
        assert all(r["index"] == paged[0]["index"] for r in paged), f"{alert}: its warning and critical stages must share a route"
        assert dur(paged[0]["group_interval"]) <= 30, (alert, paged[0])
        assert dur(paged[0]["repeat_interval"]) >= dur(AM["route"]["repeat_interval"]), (alert, paged[0])
    assert dur(AM["route"]["repeat_interval"]) >= 4 * 3600  # standing alerts never re-sent more often than the 4 h of before


def _start(args, log, env=None):
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.timing
def test_a_critical_escalation_reaches_the_receiver_within_60_s(tmp_path):
    prom_bin, am_bin = require_tool("prometheus"), require_tool("prometheus-alertmanager", "alertmanager")
    recv = Receiver().start()
    procs = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        exp_port, prom_port, am_port = free_port(), free_port(), free_port()
        token = tmp_path / "webhook.token"
        token.write_text("escalation-test-token\n")
        (tmp_path / "receivers.yml").write_text("receivers:\n  - {name: slack, type: slack, url_env: TEST_SLACK_URL}\n"
                                                "retry: {initial_seconds: 0.2, max_seconds: 1}\n")
        root = tmp_path / "logs-root"
        (root / "proj").mkdir(parents=True)
        env = {**__import__("os").environ, "OMNIWATCH_WEBHOOK_TOKEN_FILE": str(token), "TEST_SLACK_URL": recv.url + "/slack",
               "OMNIWATCH_RELAY_CONFIG": str(tmp_path / "receivers.yml")}
        procs.append(_start([sys.executable, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{exp_port}",
                             "--watch", str(root), "--state-dir", str(tmp_path / "state"), "--poll-interval", "0.2"],
                            open(logs / "exporter.log", "wb"), env))
        am_cfg = dict(AM)
        hook = am_cfg["receivers"][0]["webhook_configs"][0]
        hook["url"] = f"http://127.0.0.1:{exp_port}/api/v1/alertmanager"
        hook["http_config"]["authorization"]["credentials_file"] = str(token)
        (tmp_path / "am.yml").write_text(yaml.safe_dump(am_cfg))
        procs.append(_start([am_bin, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                            open(logs / "am.log", "wb")))
        (tmp_path / "prom.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in rules.rule_files()],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "omniwatch", "static_configs": [{"targets": [f"127.0.0.1:{exp_port}"]}]}]}))
        procs.append(_start([prom_bin, f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], open(logs / "prom.log", "wb")))
        prom = f"http://127.0.0.1:{prom_port}"

        def ready(url):
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        deadline = time.monotonic() + 60
        while not (ready(f"http://127.0.0.1:{exp_port}/healthz") and ready(prom + "/-/ready")
                   and ready(f"http://127.0.0.1:{am_port}/-/ready")):
            assert time.monotonic() < deadline, "stack did not start: " + "".join(p.read_text()[-800:] for p in logs.iterdir())
            time.sleep(0.2)
        # five 4 s steps, written at once (the typical step is the median timer, not the arrivals), then nothing
        lines = [json.dumps({"step": s, "data": {"timing_s/step": STEP_S, "timing_s/gen": 2.5,
                                                 "timing_s/update_actor": 1.5}}) for s in range(1, 6)]
        # the trainer keeps its log open while it hangs (a live writer): a file written at once and closed would be a
        # copied log, judged as history (issue 35 item 8)
        writer = open(root / "proj" / "stall.jsonl", "w")
        procs_files = [writer]
        writer.write("\n".join(lines) + "\n")
        writer.flush()

        fired: dict[str, float] = {}   # severity -> earliest firing time (activeAt + for)
        got: dict[str, float] = {}     # severity -> arrival at the receiver
        bodies: dict[str, dict] = {}
        deadline = time.monotonic() + 220
        while "critical" not in got and time.monotonic() < deadline:
            for a in httpx.get(prom + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]:
                if a["labels"].get("alertname") == "TrainingStalled" and a["state"] == "firing":
                    sev = a["labels"]["severity"]
                    if sev not in fired:
                        active = dt_parse(a["activeAt"])
                        fired[sev] = active + 15.0   # the rule's for: 15s
            with recv.lock:
                for r in recv.accepted:
                    title = r["body"].get("text", "")
                    for sev in ("critical", "warning", "info"):
                        if title.startswith(f"[{sev.upper()}") and "TrainingStalled" in title and sev not in got:
                            got[sev], bodies[sev] = r["t"], r["body"]
            time.sleep(0.25)
        assert "critical" in fired and "critical" in got, (fired, got, [r["body"].get("text") for r in recv.accepted])
        latency = got["critical"] - fired["critical"]
        print(f"critical: fired {fired['critical']:.1f}, at the receiver {got['critical']:.1f}: {latency:.1f} s; "
              f"warning fired {fired.get('warning', 0):.1f}, received {got.get('warning', 0):.1f}")
        assert latency <= budget(60), latency
        # the case that waited for group_interval before: the critical joined a group already flushed
        assert got["warning"] < fired["critical"], (got, fired)
        att = bodies["critical"]["attachments"]
        assert [a["color"] for a in att] == ["danger"] and att[0]["title"] == "TrainingStalled (critical)"
        # nothing is sent again while the alerts stand: one more flush period, no new message
        def stall_messages():
            return [r["body"].get("text") for r in recv.accepted if "TrainingStalled" in r["body"].get("text", "")]
        n = len(stall_messages())
        time.sleep(dur(route_for({"alertname": "TrainingStalled", "severity": "critical"})["group_interval"]) + 3)
        assert len(stall_messages()) == n, stall_messages()[n:]
        print("messages:", [r["body"].get("text") for r in recv.accepted])
    finally:
        for f in locals().get("procs_files", []):
            f.close()
        for p in procs:
            stop_process(p, 10)
        recv.stop()


def dt_parse(text: str) -> float:
    import datetime as dt
    text = re.sub(r"(\.\d{6})\d*", r"\1", text.replace("Z", "+00:00"))
    return dt.datetime.fromisoformat(text).timestamp()
