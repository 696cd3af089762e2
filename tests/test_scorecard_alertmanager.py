"""The scorecard's Alertmanager model against a real Alertmanager 0.25 on loopback: alerts/alertmanager.yml with its
times scaled down (tests/scorecard_am_scenarios.py), the scripted scenarios posted to /api/v2/alerts at their times
(all at once, each its own run), a local webhook receiver recording every notification. The model, fed the very
posts at the times they were made, must predict the same notifications (group, status, firing and resolved alerts,
in order) at about the same times."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import yaml

from omniwatch import rules
from omniwatch.scorecard import amsim

from . import scorecard_am_scenarios as sc
from .conftest import free_port, require_tool, stop_process
from omniwatch.yamlio import load as yaml_load

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TIME_TOLERANCE = 0.5  # seconds between a notification's arrival and the model's flush (scenarios keep 0.5 s margins)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


class _Receiver:
    def __init__(self):
        self.got: list[tuple[float, dict]] = []
        lock = threading.Lock()
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with lock:
                    got.append((time.time(), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()


def _config_file(tmp_path, url: str) -> tuple[str, dict]:
    doc = sc.scaled(yaml_load(rules.alertmanager_config_path().read_text()))
    hook = next(r for r in doc["receivers"] if r["name"] == "omniwatch")["webhook_configs"][0]
    hook["url"] = url
    token = tmp_path / "token"
    token.write_text("t\n")
    hook["http_config"]["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc))
    return str(path), doc


def _webhook_summary(body: dict) -> tuple:
    firing = [a["labels"] for a in body["alerts"] if a["status"] == "firing"]
    resolved = [a["labels"] for a in body["alerts"] if a["status"] == "resolved"]
    return sc.summary({"experiment": body["groupLabels"].get("experiment"), "status": body["status"],
                       "firing": firing, "resolved": resolved})


def test_a_real_alertmanager_sends_what_the_model_predicts(tmp_path):
    binary = require_tool("prometheus-alertmanager", "alertmanager")
    with _Receiver() as receiver:
        cfg_path, doc = _config_file(tmp_path, receiver.url)
        port = free_port()
        log = open(tmp_path / "alertmanager.log", "w")
        started = time.time()
        proc = subprocess.Popen([binary, f"--config.file={cfg_path}", f"--storage.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        made: list[tuple[float, sc.Post, float]] = []  # (time posted, post, scenario start)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                for _ in range(100):  # up to ~20 s
                    if proc.poll() is not None:
                        pytest.fail(f"alertmanager exited {proc.returncode}: {(tmp_path / 'alertmanager.log').read_text()}")
                    try:
                        if client.get("/-/ready").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.2)
                else:
                    pytest.fail("alertmanager did not become ready")
                t0 = time.time() + 0.5
                for at, _, post in sorted((p.at, name, p) for name, ps in sc.SCENARIOS.items() for p in ps):
                    time.sleep(max(0.0, t0 + at - time.time()))
                    t = time.time()
                    body = [{"labels": a.labels, "annotations": {"summary": "scenario"}, "startsAt": _iso(a.starts),
                             "endsAt": _iso(a.ends)} for a in sc.model_alerts(post, t0, t)]
                    r = client.post("/api/v2/alerts", json=body)
                    assert r.status_code == 200, r.text
                    made.append((t, post, t0))
                time.sleep(max(0.0, t0 + max(sc.DURATION.values()) + 1.0 - time.time()))
        finally:
            stop_process(proc, 10)
            log.close()
        real = list(receiver.got)
    am = amsim.Alertmanager(amsim.parse_config(doc), started=started)
    for t, post, t_start in made:
        am.post(t, sc.model_alerts(post, t_start, t))
    am.advance(t0 + max(sc.DURATION.values()) + 1.0)

    def within(exp: str, t: float) -> bool:
        return t <= t0 + sc.DURATION[exp]
    model = [(x.t, sc.summary(x)) for x in am.notifications if within(sc.summary(x)[0], x.t)]
    seen = [(t, _webhook_summary(b)) for t, b in real if within(_webhook_summary(b)[0], t)]
    for exp in sc.SCENARIOS:
        m = [(round(t - t0, 2), s) for t, s in model if s[0] == exp]
        r = [(round(t - t0, 2), s) for t, s in seen if s[0] == exp]
        # each predicted notification matched to one received with the same content at about the same time (groups
        # flushed at one instant arrive in any order)
        unmatched = list(r)
        for t, s in m:
            hit = next((x for x in unmatched if x[1] == s and abs(x[0] - t) < TIME_TOLERANCE), None)
            assert hit is not None, f"{exp}: predicted {(t, s)} not received\nreal {r}\nmodel {m}"
            unmatched.remove(hit)
        assert not unmatched, f"{exp}: received, not predicted: {unmatched}\nmodel {m}"
    assert len(model) == 15  # every scenario's notifications (tests/test_scorecard_amsim.py lists them)
