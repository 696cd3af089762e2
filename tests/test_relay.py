"""Relay unit/integration tests through the real FastAPI app (TestClient) and a real loopback
receiver: webhook parsing with Alertmanager 0.25 bodies, auth, limits, history, delivery formats,
retries, durability across app instances, and that no secret leaks anywhere."""
from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import logging

import pytest
from fastapi.testclient import TestClient

from omniwatch import names as n
from omniwatch.config import DEFAULT
from omniwatch import app as app_mod
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.relay import api as relay_api, config as cfg, messages, payload
from omniwatch.relay.deliver import DELIVERY_HEADER
from omniwatch.settings import Settings
from relay_support import Receiver, fixture_bodies, free_port, wait_for

TOKEN = "whk-test-token-0123456789"
SLACK_SECRET = "T000SECRET/B000SECRET/xoxSLACKSECRETVALUE42"
FEISHU_HOOK_SECRET = "feishu-hook-0f0f0f0f-SECRETHOOK"
FEISHU_SIGN_SECRET = "feishuSIGNsecretVALUE99"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def write_config(tmp_path, receivers: list[dict], retry: dict | None = None) -> str:
    import yaml
    p = tmp_path / "receivers.yml"
    p.write_text(yaml.safe_dump({"receivers": receivers,
                                 "retry": retry or {"initial_seconds": 0.05, "max_seconds": 0.2, "timeout_seconds": 2}}))
    return str(p)


def make_app(tmp_path, receivers=(), state_dir=None, retry=None, token=TOKEN, **extra):
    store = RunStore()
    conf = write_config(tmp_path, list(receivers), retry)
    settings = Settings(webhook_token=token, state_dir=state_dir, extra={"relay_config": conf, **extra})
    return create_app(store, make_registry(store), settings)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    # Only this area's router: other areas' modules are tested by their own files.
    monkeypatch.setattr(app_mod, "AREAS", (relay_api,))


@pytest.fixture
def receiver():
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()


def firing():
    return copy.deepcopy(fixture_bodies()[0])


def resolved():
    return copy.deepcopy(fixture_bodies()[1])


def rl_body(i: int, status: str = "firing") -> dict:
    """A notification shaped like omniwatch's own rules produce (run labels, step, remedy)."""
    b = firing()
    b["status"] = status
    b["groupKey"] = '{}:{alertname="RewardBoundRollout", experiment="exp%d"}' % i
    a = b["alerts"][0]
    a["status"] = status
    a["fingerprint"] = f"{i:016x}"
    a["labels"] = {"alertname": n.ALERT_REWARD_BOUND, "project": "flowgrpo", "experiment": f"exp{i}", "severity": "warning"}
    a["annotations"] = {"summary": "Rollout is reward-bound.", "description": "reward holds 62% of the generation window (median of last 3 steps).",
                        "step": str(100 + i), "remedy": "Move the reward model to its own pool (reward.reward_model.enable_resource_pool=True).",
                        "runbook_url": DEFAULT.runbook_url(n.ALERT_REWARD_BOUND)}
    if status == "resolved":
        a["endsAt"] = "2026-11-29T10:00:00Z"
    return b


# -- parsing -------------------------------------------------------------------------------------
def test_parse_real_fixture_bodies():
    f, r = fixture_bodies()
    nf, nr = payload.parse(json.dumps(f).encode()), payload.parse(json.dumps(r).encode())
    assert (nf.status, nr.status) == ("firing", "resolved")
    assert payload.go_time(nf.alerts[0].endsAt) is None
    assert payload.go_time(nr.alerts[0].endsAt) == "2026-11-29T09:14:51Z"
    assert nf.notification_id() != nr.notification_id()
    assert nf.notification_id() == payload.parse(json.dumps(f).encode()).notification_id()


def test_unknown_fields_from_newer_alertmanager_are_accepted_and_kept(tmp_path):
    b = firing()
    b["notification_reason"] = "first notification"          # 0.32
    b["routeLabels"] = {"team": "rl"}                          # 0.34
    b["alerts"][0]["somethingNew"] = {"x": 1}
    with TestClient(make_app(tmp_path)) as c:
        r = c.post("/api/v1/alertmanager", json=b, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "stored"
        body = next(c.app.state.relay.db.recent())[1]
        assert body["routeLabels"] == {"team": "rl"} and body["notification_reason"] == "first notification"
        assert body["alerts"][0]["somethingNew"] == {"x": 1}
        assert c.get("/api/v1/alerts").json()[0]["fingerprint"] == "81b7646371bb53b2"


@pytest.mark.parametrize("body,reason,needle", [
    (b"{not json", "malformed_json", "not valid JSON"),
    (b"\xff\xfe", "malformed_json", "not valid JSON"),
    (b"[1,2]", "bad_shape", "JSON object"),
    (b'{"version":"4","groupKey":"g","status":"firing"}', "bad_shape", "alerts"),
    (b'{"version":"4","groupKey":"g","status":"firing","alerts":[]}', "bad_shape", "alerts"),
    (b'{"version":"3","groupKey":"g","status":"firing","alerts":[{"status":"firing","labels":{},"startsAt":"x"}]}',
     "bad_version", "version"),
    (b'{"version":"4","groupKey":"g","status":"burning","alerts":[{"status":"firing","labels":{},"startsAt":"x"}]}',
     "bad_shape", "status"),
    (b'{"version":"4","groupKey":"g","status":"firing","alerts":[{"status":"firing","labels":{"a":1},"startsAt":"x"}]}',
     "bad_shape", "labels"),
])
def test_malformed_bodies_are_400_and_counted(tmp_path, body, reason, needle):
    app = make_app(tmp_path)
    with TestClient(app) as c:
        r = c.post("/api/v1/alertmanager", content=body, headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 400
        assert needle in r.json()["detail"]
        assert app.state.store.errors[("webhook", reason)] == 1
        assert c.get("/api/v1/alerts").json() == []


def test_token_required(tmp_path):
    with TestClient(make_app(tmp_path)) as c:
        assert c.post("/api/v1/alertmanager", json=firing()).status_code == 401
        assert c.post("/api/v1/alertmanager", json=firing(), headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.post("/api/v1/alertmanager", json=firing(), headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        assert c.app.state.store.errors[("webhook", "unauthorized")] == 3
    with TestClient(make_app(tmp_path, token=None)) as c:
        r = c.post("/api/v1/alertmanager", json=firing(), headers=AUTH)
        assert r.status_code == 403 and "OMNIWATCH_WEBHOOK_TOKEN" in r.json()["detail"]


def test_ten_megabyte_body_is_413(tmp_path):
    big = b'{"version":"4","pad":"' + b"x" * (10 * 1024 * 1024) + b'"}'
    with TestClient(make_app(tmp_path)) as c:
        r = c.post("/api/v1/alertmanager", content=big, headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 413

        def chunks():  # no Content-Length: the middleware counts the streamed bytes
            for i in range(0, len(big), 1 << 20):
                yield big[i:i + (1 << 20)]
        r = c.post("/api/v1/alertmanager", content=chunks(), headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 413
        assert c.get("/api/v1/alerts").json() == []


# -- history -------------------------------------------------------------------------------------
def test_alert_history_shape_order_limit_and_status(tmp_path):
    with TestClient(make_app(tmp_path)) as c:
        for i in range(3):
            assert c.post("/api/v1/alertmanager", json=rl_body(i), headers=AUTH).status_code == 200
        assert c.post("/api/v1/alertmanager", json=rl_body(0, "resolved"), headers=AUTH).status_code == 200
        rows = c.get("/api/v1/alerts").json()
        assert [r["labels"]["experiment"] for r in rows] == ["exp0", "exp1", "exp2", "exp0"]  # newest last
        assert set(rows[0]) == {"receivedAt", "status", "labels", "annotations", "startsAt", "endsAt",
                                "fingerprint", "groupKey", "receiver"}
        assert rows[0]["endsAt"] is None and rows[-1]["endsAt"] == "2026-11-29T10:00:00Z"
        assert rows[0]["annotations"]["step"] == "100" and rows[0]["receiver"] == "webhook"
        assert rows[0]["receivedAt"] <= rows[-1]["receivedAt"]
        assert [r["labels"]["experiment"] for r in c.get("/api/v1/alerts?limit=2").json()] == ["exp2", "exp0"]
        res = c.get("/api/v1/alerts?status=resolved").json()
        assert len(res) == 1 and res[0]["status"] == "resolved"
        assert len(c.get("/api/v1/alerts?status=firing").json()) == 3
        for bad in ("limit=0", "limit=1001", "limit=abc", "status=burning"):
            assert c.get(f"/api/v1/alerts?{bad}").status_code == 422


def test_history_is_bounded(tmp_path):
    with TestClient(make_app(tmp_path, relay_keep=5)) as c:
        for i in range(8):
            assert c.post("/api/v1/alertmanager", json=rl_body(i), headers=AUTH).status_code == 200
        rows = c.get("/api/v1/alerts?limit=1000").json()
        assert [r["labels"]["experiment"] for r in rows] == [f"exp{i}" for i in range(3, 8)]


# -- delivery ------------------------------------------------------------------------------------
def test_duplicate_resend_is_stored_once_and_forwarded_once(tmp_path, monkeypatch, receiver):
    monkeypatch.setenv("OMNIWATCH_TEST_HOOK", receiver.url + "/hook")
    app = make_app(tmp_path, [{"name": "generic", "type": "webhook", "url_env": "OMNIWATCH_TEST_HOOK"}])
    with TestClient(app) as c:
        assert c.post("/api/v1/alertmanager", json=rl_body(1), headers=AUTH).json()["status"] == "stored"
        b = rl_body(1)
        b["notification_reason"] = "repeat interval elapsed"  # unknown field: not part of the identity
        assert c.post("/api/v1/alertmanager", json=b, headers=AUTH).json()["status"] == "duplicate"
        got = receiver.wait_accepted(1)
        wait_for(lambda: c.get("/api/v1/relay/status").json()["receivers"][0]["delivered"] == 1)
        st = c.get("/api/v1/relay/status").json()
        assert st["notifications"] == 1 and st["duplicates"] == 1
        assert app.state.store.errors[("webhook", "duplicate_notification")] == 1
        assert app.state.store.notifications["firing"] == 2
        assert len(c.get("/api/v1/alerts").json()) == 1
    assert len(receiver.requests) == 1
    req = got[0]
    assert req["path"] == "/hook" and req["headers"][DELIVERY_HEADER.lower()] == req["body"]["deliveryId"]
    body = req["body"]
    assert body["version"] == messages.RELAY_FORMAT_VERSION and body["status"] == "firing"
    assert body["alerts"][0]["run"] == "flowgrpo/exp1" and body["alerts"][0]["step"] == "101"
    assert body["notification"]["groupKey"] == rl_body(1)["groupKey"]


def test_slack_and_feishu_formats(tmp_path, monkeypatch, receiver):
    monkeypatch.setenv("OMNIWATCH_SLACK_URL", receiver.url + "/slack")
    monkeypatch.setenv("OMNIWATCH_FEISHU_URL", receiver.url + "/feishu")
    monkeypatch.setenv("OMNIWATCH_FEISHU_POST_URL", receiver.url + "/feishu-post")
    monkeypatch.setenv("OMNIWATCH_FEISHU_SECRET", FEISHU_SIGN_SECRET)
    monkeypatch.setenv("OMNIWATCH_GRAFANA_URL", "http://grafana.local:3000")  # Settings.grafana_url
    app = make_app(tmp_path, [
        {"name": "slack", "type": "slack", "url_env": "OMNIWATCH_SLACK_URL", "channel": "#rl-alerts"},
        {"name": "feishu", "type": "feishu", "url_env": "OMNIWATCH_FEISHU_URL", "secret_env": "OMNIWATCH_FEISHU_SECRET"},
        {"name": "feishu-post", "type": "feishu", "format": "post", "url_env": "OMNIWATCH_FEISHU_POST_URL"},
    ])
    with TestClient(app) as c:
        assert c.post("/api/v1/alertmanager", json=rl_body(7), headers=AUTH).status_code == 200
        receiver.wait_accepted(3)
    by = {r["path"]: r for r in receiver.accepted}
    slack = by["/slack"]["body"]
    assert slack["channel"] == "#rl-alerts" and "[WARNING] RewardBoundRollout" in slack["text"]
    att = slack["attachments"][0]
    assert att["color"] == "warning" and {"title": "Run", "value": "flowgrpo/exp7", "short": True} in att["fields"]
    assert "62%" in att["text"] and "Remedy: Move the reward model" in att["text"]
    assert "|Runbook>" in att["text"] and "http://grafana.local:3000/dashboards?query=omniwatch&var-project=flowgrpo" in att["text"]

    card = by["/feishu"]["body"]
    assert card["msg_type"] == "interactive" and card["card"]["header"]["template"] == "orange"
    md = card["card"]["elements"][0]["text"]["content"]
    assert "run flowgrpo/exp7 · step 107" in md and "Remedy:" in md
    buttons = [a["text"]["content"] for a in card["card"]["elements"][1]["actions"]]
    assert buttons == ["Runbook", "Dashboard"]
    expect = base64.b64encode(hmac.new(f"{card['timestamp']}\n{FEISHU_SIGN_SECRET}".encode(), b"", hashlib.sha256).digest()).decode()
    assert card["sign"] == expect

    post = by["/feishu-post"]["body"]
    assert post["msg_type"] == "post" and "sign" not in post
    flat = json.dumps(post["content"]["post"]["zh_cn"]["content"])
    assert "step 107" in flat and DEFAULT.runbook_url(n.ALERT_REWARD_BOUND) in flat


def test_retry_until_up_then_exactly_once_and_permanent_failure(tmp_path, monkeypatch, receiver):
    monkeypatch.setenv("OMNIWATCH_TEST_HOOK", receiver.url + "/hook")
    receiver.codes = [503, 503, 429, 200, 400]  # 3 retries, ok, then a permanent 400 for the second
    app = make_app(tmp_path, [{"name": "generic", "type": "webhook", "url_env": "OMNIWATCH_TEST_HOOK"}])
    with TestClient(app) as c:
        c.post("/api/v1/alertmanager", json=rl_body(1), headers=AUTH)
        c.post("/api/v1/alertmanager", json=rl_body(2), headers=AUTH)
        wait_for(lambda: (lambda s: s["delivered"] == 1 and s["failed"] == 1)(
            c.get("/api/v1/relay/status").json()["receivers"][0]), what="delivery results")
        st = c.get("/api/v1/relay/status").json()["receivers"][0]
        assert st["pending"] == 0 and st["deliveries_since_start"] == {"ok": 1, "retry": 3, "failed": 1}
        assert st["last_error"].startswith("HTTP 400")
        text = c.get("/metrics").text
        assert f'{n.RELAY_DELIVERIES_TOTAL}{{receiver="generic",result="retry"}} 3.0' in text
        assert f'{n.RELAY_PENDING}{{receiver="generic"}} 0.0' in text
    # the same delivery id was retried: one id for the 4 attempts of the first notification
    ids = [r["headers"][DELIVERY_HEADER.lower()] for r in receiver.requests]
    assert len(set(ids[:4])) == 1 and ids[4] != ids[0]
    assert [r["body"]["alerts"][0]["run"] for r in receiver.accepted] == ["flowgrpo/exp1"]


def test_pending_outbox_survives_a_new_app_on_the_same_state_dir(tmp_path, monkeypatch):
    state = tmp_path / "state"
    port = free_port()
    monkeypatch.setenv("OMNIWATCH_TEST_HOOK", f"http://127.0.0.1:{port}/hook")
    rcv = [{"name": "generic", "type": "webhook", "url_env": "OMNIWATCH_TEST_HOOK"}]
    with TestClient(make_app(tmp_path, rcv, state_dir=str(state))) as c:   # receiver down: connection refused
        for i in range(3):
            c.post("/api/v1/alertmanager", json=rl_body(i), headers=AUTH)
        wait_for(lambda: c.get("/api/v1/relay/status").json()["receivers"][0]["last_error"], what="a failed attempt")
        assert c.get("/metrics").text.count(f'{n.RELAY_PENDING}{{receiver="generic"}} 3.0') == 1
    assert (state / "alerts.sqlite3").exists()
    r = Receiver(port=port).start()
    try:
        with TestClient(make_app(tmp_path, rcv, state_dir=str(state))) as c:
            assert len(c.get("/api/v1/alerts").json()) == 3
            assert c.post("/api/v1/alertmanager", json=rl_body(0), headers=AUTH).json()["status"] == "duplicate"
            got = r.wait_accepted(3)
            wait_for(lambda: c.get("/api/v1/relay/status").json()["receivers"][0]["delivered"] == 3)
        assert [g["body"]["alerts"][0]["run"] for g in got] == [f"flowgrpo/exp{i}" for i in range(3)]  # in order
        assert len(r.requests) == 3
    finally:
        r.stop()


# -- configuration and secrets ---------------------------------------------------------------------
def test_bad_config_disables_receivers_but_not_the_exporter(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIWATCH_NOT_A_URL", "ftp://x")
    app = make_app(tmp_path, [
        {"name": "a", "type": "slack", "url_env": "OMNIWATCH_UNSET_ENV"},
        {"name": "b", "type": "slack", "url": "https://hooks.slack.com/services/T/B/literal"},
        {"name": "c", "type": "pager", "url_env": "OMNIWATCH_NOT_A_URL"},
        {"name": "d", "type": "webhook", "url_env": "OMNIWATCH_NOT_A_URL"},
        "junk",
    ])
    with TestClient(app) as c:
        st = {r["name"]: r for r in c.get("/api/v1/relay/status").json()["receivers"]}
        assert "OMNIWATCH_UNSET_ENV" in st["a"]["config_error"]
        assert "url_env" in st["b"]["config_error"] and "literal" not in json.dumps(st)
        assert "type must be" in st["c"]["config_error"]
        assert "not an http(s) URL" in st["d"]["config_error"] and "ftp://x" not in json.dumps(st)
        assert not any(r["enabled"] for r in st.values())
        assert c.post("/api/v1/alertmanager", json=firing(), headers=AUTH).status_code == 200
    bad = tmp_path / "bad.yml"
    bad.write_text("receivers: [unclosed")
    conf = cfg.load(str(bad))
    assert conf.error and conf.receivers == []
    assert cfg.load(str(tmp_path / "missing.yml")).error.startswith("FileNotFoundError")


def test_no_secret_in_api_metrics_or_logs(tmp_path, monkeypatch, caplog, receiver):
    receiver.default = 503  # every attempt fails: URLs reach httpx's request log, paths come back in error bodies
    monkeypatch.setenv("OMNIWATCH_SLACK_URL", f"{receiver.url}/services/{SLACK_SECRET}")
    monkeypatch.setenv("OMNIWATCH_FEISHU_URL", f"{receiver.url}/open-apis/bot/v2/hook/{FEISHU_HOOK_SECRET}")
    monkeypatch.setenv("OMNIWATCH_FEISHU_SECRET", FEISHU_SIGN_SECRET)
    monkeypatch.setenv("OMNIWATCH_DOWN_URL", f"http://127.0.0.1:{free_port()}/down/{SLACK_SECRET}")
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="httpx")  # a CLI run in-process earlier on this worker quiets httpx (cli.py)
    app = make_app(tmp_path, [
        {"name": "slack", "type": "slack", "url_env": "OMNIWATCH_SLACK_URL"},
        {"name": "feishu", "type": "feishu", "url_env": "OMNIWATCH_FEISHU_URL", "secret_env": "OMNIWATCH_FEISHU_SECRET"},
        {"name": "down", "type": "webhook", "url_env": "OMNIWATCH_DOWN_URL"},   # connection refused
        {"name": "broken", "type": "feishu", "url_env": "OMNIWATCH_SLACK_URL", "format": "nope"},
    ])
    with TestClient(app) as c:
        assert c.post("/api/v1/alertmanager", json=rl_body(1), headers=AUTH).status_code == 200
        c.post("/api/v1/alertmanager", json=rl_body(2), headers={"Authorization": "Bearer " + SLACK_SECRET})
        wait_for(lambda: all(r["deliveries_since_start"]["retry"] >= 2 for r in
                             c.get("/api/v1/relay/status").json()["receivers"] if r["enabled"]), what="retries")
        outputs = [c.get("/api/v1/alerts").text, c.get("/api/v1/relay/status").text, c.get("/metrics").text]
        st = {r["name"]: r for r in c.get("/api/v1/relay/status").json()["receivers"]}
    assert st["slack"]["last_error"].startswith("HTTP 503") and "<redacted>" in st["slack"]["last_error"]
    assert "ConnectError" in st["down"]["last_error"] and "format must be" in st["broken"]["config_error"]
    outputs.append(caplog.text)
    assert any(r.name == "httpx" and "<redacted>" in r.getMessage() for r in caplog.records)  # the URL was logged, scrubbed
    assert any("attempt" in r.getMessage() for r in caplog.records if r.name.startswith("omniwatch.relay"))
    for secret in (SLACK_SECRET, FEISHU_HOOK_SECRET, FEISHU_SIGN_SECRET, TOKEN, "xoxSLACKSECRETVALUE42"):
        for out in outputs:
            assert secret not in out


# -- messages ------------------------------------------------------------------------------------
def _sev_body(status: str, *severities: str) -> dict:
    b = rl_body(4, status)
    a = b["alerts"][0]
    b["alerts"] = []
    for i, sev in enumerate(severities):
        x = copy.deepcopy(a)
        x["labels"] = dict(a["labels"], alertname=n.ALERT_STALLED, severity=sev)
        x["fingerprint"] = f"{i:016x}"
        b["alerts"].append(x)
    return b


def test_every_message_says_its_severity_in_text_and_colour():
    """info / warning / critical in the title, each alert's line, Slack's colour, Feishu's header and the generic
    webhook's fields; a resolved message is green and says what it was; no severity label: plain firing, red."""
    want = {"info": ("#439FE0", "blue"), "warning": ("warning", "orange"), "critical": ("danger", "red")}
    seen_colours = set()
    for sev, (slack_colour, feishu) in want.items():
        m = messages.build(_sev_body("firing", sev))
        assert m.title == f"[{sev.upper()}] TrainingStalled — flowgrpo/exp4" and m.severity == sev
        assert messages.text(m).startswith(f"TrainingStalled ({sev}) — run flowgrpo/exp4")
        att = messages.render_slack(m)["attachments"][0]
        assert att["color"] == slack_colour and att["title"] == f"TrainingStalled ({sev})"
        assert messages.render_feishu(m)["card"]["header"]["template"] == feishu
        assert messages.render_feishu(m, "post")["content"]["post"]["zh_cn"]["title"].startswith(f"[{sev.upper()}]")
        hook = messages.render_webhook(m, {}, "d")
        assert hook["severity"] == sev and hook["alerts"][0]["severity"] == sev
        seen_colours.add((slack_colour, feishu))
    assert len(seen_colours) == 3   # three urgencies, three colours
    r = messages.build(_sev_body("resolved", "critical"))
    assert r.title == "[RESOLVED, was critical] TrainingStalled — flowgrpo/exp4"
    assert messages.text(r).startswith("TrainingStalled (resolved; was critical) — run flowgrpo/exp4")
    assert messages.render_slack(r)["attachments"][0]["color"] == "good"
    assert messages.render_feishu(r)["card"]["header"]["template"] == "green"
    assert messages.render_webhook(r, {}, "d")["status"] == "resolved"
    # a group with several firing: the most urgent one colours and titles the message
    mixed = messages.build(_sev_body("firing", "info", "critical"))
    assert mixed.title.startswith("[CRITICAL, 2 firing] ") and messages.render_feishu(mixed)["card"]["header"]["template"] == "red"
    # attachments costliest first, ties by severity (issue 32): the critical before the info notice
    assert [a["color"] for a in messages.render_slack(mixed)["attachments"]] == ["danger", "#439FE0"]
    # an alert of another stack without a severity label: firing, red (never shown as calm)
    b = _sev_body("firing", "page-me")
    m = messages.build(b)
    assert m.title.startswith("[FIRING] ") and messages.render_slack(m)["attachments"][0]["color"] == "danger"


def test_message_text_for_rl_engineers():
    m = messages.build(rl_body(3), "https://grafana.example/")
    t = messages.text(m)
    assert m.title == "[WARNING] RewardBoundRollout — flowgrpo/exp3"
    assert "run flowgrpo/exp3 · step 103" in t and "62%" in t and "Remedy:" in t
    v = m.alerts[0]
    assert v.dashboard_url.startswith("https://grafana.example/dashboards?") and v.runbook_url.endswith("#rewardboundrollout")
    b = rl_body(3)
    b["alerts"][0]["annotations"]["dashboard_url"] = "/d/omniwatch-run?var-experiment=exp3"
    assert messages.build(b, "https://grafana.example").alerts[0].dashboard_url == "https://grafana.example/d/omniwatch-run?var-experiment=exp3"
    r = messages.build(rl_body(3, "resolved"))
    assert r.title.startswith("[RESOLVED, was warning]") and r.alerts[0].dashboard_url is None
    many = rl_body(1)
    many["alerts"] = [copy.deepcopy(many["alerts"][0]) for _ in range(messages.MAX_ALERTS_SHOWN + 4)]
    mm = messages.build(many)
    assert mm.more == 4 and "4 more alerts" in messages.text(mm)
    assert "4 more" in json.dumps(messages.render_slack(mm))


def test_corrupt_or_unwritable_state_falls_back_to_memory(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "alerts.sqlite3").write_bytes(b"this is not a sqlite database" * 100)
    with TestClient(make_app(tmp_path, state_dir=str(state))) as c:
        st = c.get("/api/v1/relay/status").json()
        assert st["storage"] == "memory" and "DatabaseError" in st["storage_error"]
        assert c.post("/api/v1/alertmanager", json=firing(), headers=AUTH).status_code == 200
        assert len(c.get("/api/v1/alerts").json()) == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with TestClient(make_app(tmp_path, state_dir=str(blocker / "sub"))) as c:
        assert c.get("/api/v1/relay/status").json()["storage"] == "memory"


def test_example_receivers_file_loads(monkeypatch):
    from pathlib import Path
    example = Path(__file__).resolve().parent.parent / "alerts" / "receivers.example.yml"
    for var, val in {"OMNIWATCH_SLACK_URL": "https://hooks.slack.com/services/T/B/x",
                     "OMNIWATCH_FEISHU_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/x",
                     "OMNIWATCH_FEISHU_SECRET": "s", "OMNIWATCH_ONCALL_URL": "https://oncall.example/hook",
                     "OMNIWATCH_ONCALL_AUTH": "Bearer x"}.items():
        monkeypatch.setenv(var, val)
    conf = cfg.load(str(example))
    assert conf.error is None
    assert [(r.name, r.type, r.enabled) for r in conf.receivers] == [
        ("rl-slack", "slack", True), ("rl-feishu", "feishu", True), ("oncall-bridge", "webhook", True)]
    assert conf.receivers[1].match == {"severity": "critical"} and conf.receivers[2].headers == {"Authorization": "Bearer x"}
    assert conf.retry.max_seconds == 300
    monkeypatch.delenv("OMNIWATCH_FEISHU_SECRET")
    assert "OMNIWATCH_FEISHU_SECRET" in cfg.load(str(example)).receivers[1].error


def test_a_notification_puts_the_costliest_alert_first_with_its_action():
    """Issue 32 item 1: a digest of several alerts ranks them by the GPU time each costs now (the figure the
    description states), ties by severity; each shows its one-line action before the full remedy."""
    from omniwatch.relay.messages import build, text

    def alert(name, sev, desc, action=""):
        ann = {"summary": name, "description": desc, "remedy": f"full remedy of {name}"}
        if action:
            ann["action"] = action
        return {"status": "firing", "labels": {"alertname": name, "severity": sev, "project": "p", "experiment": "e"},
                "annotations": ann}
    body = {"status": "firing", "alerts": [
        alert("RankStraggler", "warning", "p/e: rank 1 finished last."),
        alert("TrainingStalled", "info", "p/e: no step for 2m."),
        alert("RewardBoundRollout", "warning", "p/e: reward held 55%. At the current rate reward on the critical path "
                                               "costs about 1,317 GPU-hours per day.", "Give scoring its own GPUs"),
        alert("StepTimeRegression", "warning", "p/e: 1.2x. At the current rate the growth costs about 4 GPU-hours per "
                                               "day.")]}
    msg = build(body)
    assert [v.name for v in msg.alerts] == ["RewardBoundRollout", "StepTimeRegression", "RankStraggler",
                                            "TrainingStalled"]
    assert msg.alerts[0].cost_per_day == 1317 and msg.title.startswith("[WARNING, 4 firing] RewardBoundRollout, StepTime")
    t = text(msg)
    assert "Do: Give scoring its own GPUs\nRemedy: full remedy of RewardBoundRollout" in t
