"""Security review as tests: loopback defaults, token checks on every write endpoint (constant time),
body limits, no default Grafana password, Prometheus admin/lifecycle APIs off, and secrets never
turning into labels, API output, log lines or relayed messages."""
from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import re
from pathlib import Path

import httpx
import yaml
from fastapi.testclient import TestClient

from conftest import require_binary
from omniwatch import web
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line
from omniwatch.httpguard import BackgroundServer
from omniwatch.server import add_exporter_args, parse_listen
from omniwatch.settings import DEFAULT_HOST, Settings
from omniwatch.simulate import RunSpec, step_dict
from omniwatch.stack import Stack, StackConfig
from relay_support import Receiver

REPO = Path(__file__).resolve().parents[1]
PUSH_TOKEN = "push-S3cr3t-0123456789abcdef"
HOOK_TOKEN = "hook-S3cr3t-fedcba9876543210"
HF_SECRET = "hf_" + "Zq7" * 12  # shaped like a Hugging Face token
SECRET_KEY_RE = re.compile(r"(?i)(token|_key\b|api[_-]?key|password|passwd|secret)")


def _app(tmp_path, **kw):
    store = RunStore()
    settings = Settings(push_token=PUSH_TOKEN, webhook_token=HOOK_TOKEN, state_dir=str(tmp_path / "state"), **kw)
    return store, create_app(store, make_registry(store), settings)


def _routes(routes):
    """Every route with a path, through included routers (FastAPI >= 0.16x wraps them lazily)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes)
        elif hasattr(r, "path"):
            yield r


def _auth(token):
    return {"authorization": f"Bearer {token}"}


# --- where things listen -------------------------------------------------------------------------------
def test_defaults_bind_loopback_only(tmp_path):
    import argparse
    assert DEFAULT_HOST == "127.0.0.1" and Settings().host == "127.0.0.1"
    p = argparse.ArgumentParser()
    add_exporter_args(p)
    assert parse_listen(p.parse_args([]).listen)[0] == "127.0.0.1"
    assert parse_listen("19095")[0] == "127.0.0.1" and parse_listen(":19095")[0] == "127.0.0.1"
    cfg = StackConfig(run_dir=tmp_path / "run")
    assert cfg.host == "127.0.0.1"


def test_native_stack_commands_listen_on_loopback_and_keep_admin_apis_off(tmp_path):
    st = Stack(StackConfig(run_dir=tmp_path / "run"))
    st.write_configs()
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    cmds = st.commands()
    prom = cmds["prometheus"][0]
    am = cmds["alertmanager"][0]
    exp = cmds["exporter"][0]
    assert "--web.listen-address=127.0.0.1:19090" in prom
    assert not any(a.startswith(("--web.enable-lifecycle", "--web.enable-admin-api", "--web.enable-remote-write-receiver"))
                   for a in prom)
    assert "--web.listen-address=127.0.0.1:19093" in am
    assert "--cluster.listen-address=" in am  # no gossip port on 0.0.0.0:9094
    assert exp[exp.index("--listen") + 1] == "127.0.0.1:19095"
    # tokens go to the exporter through *_FILE env, never argv
    assert not any("token" in a.lower() and "=" in a and not a.startswith("--") for a in exp)
    assert all(k.endswith("_FILE") for k in cmds["exporter"][1])
    for name in ("push", "webhook"):
        f = st.p("secrets", f"{name}.token")
        assert f.stat().st_mode & 0o077 == 0, f"{f} readable by others"
    prom_cfg = yaml.safe_load(st.p("config", "prometheus.yml").read_text())
    targets = [t for sc in prom_cfg["scrape_configs"] for c in sc.get("static_configs", []) for t in c["targets"]]
    assert targets and all(t.startswith("127.0.0.1:") for t in targets)


def test_compose_publishes_ports_on_loopback_only_and_needs_a_grafana_password():
    comp = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, svc in comp["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        cmd = " ".join(svc.get("command", []) if isinstance(svc.get("command"), list) else [svc.get("command") or ""])
        assert "--web.enable-lifecycle" not in cmd and "--web.enable-admin-api" not in cmd
    env = comp["services"]["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${OMNIWATCH_GRAFANA_ADMIN_PASSWORD:?")
    assert str(env.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).endswith("false}") or env.get("GF_AUTH_ANONYMOUS_ENABLED") == "false"
    exporter_env = comp["services"]["exporter"].get("environment", {})
    assert all(v.startswith("${") for k, v in exporter_env.items() if "TOKEN" in k and not k.endswith("_FILE")), \
        "no literal token in compose"
    assert all(v.startswith("/run/secrets/") for k, v in exporter_env.items() if k.endswith("TOKEN_FILE")), \
        "tokens come from compose secrets"


def test_native_stack_refuses_grafana_without_an_admin_password(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "grafana-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("OMNIWATCH_GRAFANA_ADMIN_PASSWORD", raising=False)
    st = Stack(StackConfig(run_dir=tmp_path / "run"))
    st.write_configs()
    assert st._grafana_command() is None
    monkeypatch.setenv("OMNIWATCH_GRAFANA_ADMIN_PASSWORD", "correct horse battery")
    argv, env, _ready = st._grafana_command()
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "correct horse battery"
    assert env["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert not any("correct horse" in a for a in argv), "password must not be on argv"


# --- tokens --------------------------------------------------------------------------------------------
def test_require_token_compares_in_constant_time_by_inspection():
    tree = ast.parse(inspect.getsource(web.require_token))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert any(isinstance(c.func, ast.Attribute) and c.func.attr == "compare_digest" for c in calls)
    # no ==/!= between the presented and the expected token
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names_ = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not ({"token", "expected"} <= names_), "token compared with == / !="


def test_every_write_endpoint_goes_through_require_token():
    """Every POST/PUT/PATCH/DELETE route's handler calls require_token (source inspection), and the
    package has no other secret comparison than hmac.compare_digest."""
    _store, app = _app(Path("/nonexistent-unused"))
    writes = [r for r in _routes(app.routes) if getattr(r, "methods", None) and r.methods & {"POST", "PUT", "PATCH", "DELETE"}]
    assert {r.path for r in writes} >= {"/api/v1/push", "/api/v1/alertmanager"}
    for r in writes:
        src = inspect.getsource(r.endpoint)
        assert "require_token(" in src, f"{r.path} does not check a token"  # or a _require_token( wrapper
    pkg = REPO / "exporter" / "omniwatch"
    for f in pkg.rglob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in node.ops):
                ids = {n.id.lower() for n in ast.walk(node) if isinstance(n, ast.Name)}
                attrs = {n.attr.lower() for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                assert not any(x.endswith("token") for x in ids | attrs), f"{f.name}:{node.lineno} compares a token with =="


def test_write_endpoints_refuse_without_or_with_a_wrong_token(tmp_path):
    _store, app = _app(tmp_path)
    body = json.dumps({"project": "p", "experiment": "e", "step": 1, "data": {"x": 1}})
    with TestClient(app) as c:
        writes = [r for r in _routes(app.routes) if getattr(r, "methods", None) and "POST" in r.methods]
        for r in writes:
            assert c.post(r.path, content=body).status_code == 401, r.path
            assert c.post(r.path, content=body, headers=_auth("wrong")).status_code == 401, r.path
            assert c.post(r.path, content=body, headers={"authorization": f"Basic {PUSH_TOKEN}"}).status_code == 401
        # the push token does not open the webhook and vice versa
        assert c.post("/api/v1/alertmanager", content=body, headers=_auth(PUSH_TOKEN)).status_code == 401
        assert c.post("/api/v1/push", content=body, headers=_auth(HOOK_TOKEN)).status_code == 401
        assert c.post("/api/v1/push", content=body, headers=_auth(PUSH_TOKEN)).status_code == 200
    # no token configured: the endpoint is disabled (403), whatever is presented
    store = RunStore()
    off = create_app(store, make_registry(store), Settings(state_dir=str(tmp_path / "s2")))
    with TestClient(off) as c:
        assert c.post("/api/v1/push", content=body, headers=_auth("")).status_code == 403
        assert c.post("/api/v1/push", content=body, headers=_auth("anything")).status_code == 403
        assert c.post("/api/v1/alertmanager", content=body, headers=_auth("anything")).status_code == 403


def test_request_bodies_are_limited_with_and_without_content_length(tmp_path):
    _store, app = _app(tmp_path, max_body_bytes=2048)
    srv = BackgroundServer(app).start()
    big = b'{"project":"p","experiment":"e","step":1,"data":{"k":"' + b"x" * 10_000 + b'"}}'

    def chunks():
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for path in ("/api/v1/push", "/api/v1/alertmanager"):
                tok = PUSH_TOKEN if path.endswith("push") else HOOK_TOKEN
                assert c.post(path, content=big, headers=_auth(tok)).status_code == 413
                assert c.post(path, content=chunks(), headers=_auth(tok)).status_code == 413  # chunked, no length
            assert c.get("/healthz").status_code == 200  # still serving
    finally:
        srv.stop()


# --- secrets never exported, echoed or relayed -------------------------------------------------------------
def _metrics(client) -> str:
    return client.get("/metrics").text


def test_tokens_never_appear_in_any_get_endpoint_or_log(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    _store, app = _app(tmp_path)
    with TestClient(app) as c:
        c.post("/api/v1/push", content=b"{}", headers=_auth("wrong-" + PUSH_TOKEN))
        c.post("/api/v1/alertmanager", content=b"not json", headers=_auth(HOOK_TOKEN))
        gets = [r.path for r in _routes(app.routes) if getattr(r, "methods", None) and "GET" in r.methods and "{" not in r.path]
        assert "/api/v1/alerts" in gets and "/metrics" in gets
        for path in gets:
            text = c.get(path).text
            assert PUSH_TOKEN not in text and HOOK_TOKEN not in text, path
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert PUSH_TOKEN not in logged and HOOK_TOKEN not in logged


def test_service_discovery_and_history_do_not_leak_tokens(tmp_path):
    _store, app = _app(tmp_path)
    note = {"version": "4", "groupKey": "g", "status": "firing", "receiver": "omniwatch",
            "alerts": [{"status": "firing", "labels": {"alertname": "X"}, "annotations": {}, "startsAt": "2025-01-01T00:00:00Z"}]}
    with TestClient(app) as c:
        assert c.post("/api/v1/alertmanager", json=note, headers=_auth(HOOK_TOKEN)).status_code == 200
        for path in ("/api/v1/sd", "/api/v1/alerts", "/api/v1/relay/status", "/api/v1/discovery"):
            r = c.get(path)
            assert PUSH_TOKEN not in r.text and HOOK_TOKEN not in r.text and "Bearer" not in r.text, path


SECRET_STEP_KEYS = {"HF_TOKEN": 1.0, "env/HF_TOKEN": 3.0, "env/WANDB_API_KEY": 7.0, "OPENAI_API_KEY": 2.0,
                    "config/db_password": 5.0, "secrets/aws_secret_access_key": 4.0}


def _secret_step(step: int) -> dict:
    d = step_dict(RunSpec(seed=1), step)
    d.update(SECRET_STEP_KEYS)
    return d


def test_secret_named_keys_are_not_exported_from_jsonl(tmp_path):
    """A verl dict carrying keys whose *name* says secret (HF_TOKEN, env/WANDB_API_KEY, ...) must not
    become series or labels. Fails until model/parse drop such keys (see the proposed diff)."""
    store = RunStore()
    for s in (1, 2, 3):
        line = json.dumps({"step": s, "data": _secret_step(s)})
        store.ingest("p", "e", parse_jsonl_line(line), "jsonl")
    from prometheus_client import generate_latest
    text = generate_latest(make_registry(store)).decode()
    leaked = [k for k in SECRET_STEP_KEYS if k in text or k.replace("/", "_") in text]
    assert not leaked, f"secret-named keys exported: {leaked}"
    assert store.runs[("p", "e")].steps_total == 3  # the rest of the step is kept


def test_secret_named_keys_are_not_exported_from_push(tmp_path):
    _store, app = _app(tmp_path)
    with TestClient(app) as c:
        r = c.post("/api/v1/push", json={"project": "p", "experiment": "e", "step": 1, "data": _secret_step(1)},
                   headers=_auth(PUSH_TOKEN))
        assert r.status_code == 200 and r.json()["accepted"] == 1
        text = _metrics(c)
    leaked = [k for k in SECRET_STEP_KEYS if k in text or k.replace("/", "_") in text]
    assert not leaked, f"secret-named keys exported: {leaked}"


def test_token_looking_run_labels_are_refused(tmp_path):
    """A project/experiment value shaped like a credential (hf_..., ghp_..., sk-..., xoxb-...) is refused
    with a 400 rather than becoming a label on every series of the run."""
    _store, app = _app(tmp_path)
    with TestClient(app) as c:
        for bad in (f"run-{HF_SECRET}", "ghp_" + "a1B2" * 9, "sk-" + "Ab3" * 16, "xoxb-1234567890-abcdefABCDEF"):
            r = c.post("/api/v1/push", json={"project": "p", "experiment": bad, "step": 1, "data": {"x": 1.0}},
                       headers=_auth(PUSH_TOKEN))
            assert r.status_code == 400, (bad, r.status_code)
            assert bad not in r.text
        text = _metrics(c)
    assert HF_SECRET not in text and "ghp_" not in text


def test_secret_in_webhook_annotation_is_not_forwarded_to_slack(tmp_path, monkeypatch):
    """An annotation that carries a secret (a template that printed an env var, say) must not reach Slack
    nor the alert history verbatim. Fails until the relay redacts credential-shaped strings."""
    rcv = Receiver().start()
    try:
        monkeypatch.setenv("OMNIWATCH_SEC_SLACK", rcv.url + "/slack")
        conf = tmp_path / "relay.yml"
        conf.write_text(yaml.safe_dump({"receivers": [{"name": "slack", "type": "slack", "url_env": "OMNIWATCH_SEC_SLACK"}],
                                        "retry": {"initial_seconds": 0.1, "max_seconds": 0.5}}))
        store = RunStore()
        settings = Settings(webhook_token=HOOK_TOKEN, state_dir=str(tmp_path / "state"), extra={"relay_config": str(conf)})
        app = create_app(store, make_registry(store), settings)
        note = {"version": "4", "groupKey": "{}:{alertname=\"RewardBoundRollout\"}", "status": "firing",
                "receiver": "omniwatch", "commonLabels": {"alertname": "RewardBoundRollout"},
                "alerts": [{"status": "firing", "startsAt": "2025-01-01T00:00:00Z",
                            "labels": {"alertname": "RewardBoundRollout", "project": "p", "experiment": "e"},
                            "annotations": {"summary": "reward bound",
                                            "description": f"env dump: HF_TOKEN={HF_SECRET} WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"}}]}
        with TestClient(app) as c:
            assert c.post("/api/v1/alertmanager", json=note, headers=_auth(HOOK_TOKEN)).status_code == 200
            got = rcv.wait_accepted(1, timeout=20)
            history = c.get("/api/v1/alerts").text
        sent = json.dumps(got[0]["body"])
        assert "RewardBoundRollout" in sent
        assert HF_SECRET not in sent, "secret forwarded to Slack"
        assert "0123456789abcdef0123456789abcdef01234567" not in sent
        assert HF_SECRET not in history, "secret served by /api/v1/alerts"
    finally:
        rcv.stop()


def test_secret_step_keys_never_reach_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    _store, app = _app(tmp_path)
    with TestClient(app) as c:
        c.post("/api/v1/push", json={"project": "p", "experiment": "e", "step": 1,
                                     "data": {**_secret_step(1), "env/HF_TOKEN_STR": HF_SECRET}}, headers=_auth(PUSH_TOKEN))
    assert HF_SECRET not in "\n".join(r.getMessage() for r in caplog.records)


def test_prometheus_rejects_lifecycle_and_admin_calls(tmp_path):
    """Behaviour, not only argv: a real Prometheus started the way the stack starts it answers 403/404
    to /-/quit, /-/reload and the TSDB admin API."""
    from conftest import free_port, require_binary, stop_process, wait_for
    import subprocess
    prom = require_binary("prometheus")
    port = free_port()
    cfg = tmp_path / "p.yml"
    cfg.write_text("global: {scrape_interval: 15s}\n")
    proc = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(url + "/-/ready", timeout=1).status_code == 200, 30, what="prometheus")
        assert httpx.post(url + "/-/quit", timeout=5).status_code == 403
        assert httpx.post(url + "/-/reload", timeout=5).status_code == 403
        snap = httpx.post(url + "/api/v1/admin/tsdb/snapshot", timeout=5)
        assert snap.status_code != 200 and "admin APIs disabled" in snap.text
        assert httpx.get(url + "/-/ready", timeout=5).status_code == 200
    finally:
        stop_process(proc, 15)
