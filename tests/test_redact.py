"""Secrets never leave, in any path (issue 14, item 2): the one redaction module (omniwatch.redact),
property-tested, and every path through it — passthrough keys, run labels from paths, push, the webhook
store (the SQLite file itself), the history API, forwarded messages (webhook, Slack, Feishu), logs and
the state file. Ordinary verl keys (every key of the recorded fixtures) survive."""
from __future__ import annotations

import json
import logging
import os
import re
import string
import subprocess
import sys
import time

import orjson
import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from prometheus_client import generate_latest

from omniwatch import app as app_mod, push
from omniwatch.relay import api as relay_api
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_console_line
from omniwatch.redact import (REDACTED, RedactingFilter, is_secret_key, is_secret_name, looks_like_credential,
                              redact, redact_tree)
from omniwatch.settings import Settings
from omniwatch.sources.files import FileSource
from omniwatch.core.state import Checkpointer

from .conftest import FIXTURES
from relay_support import Receiver

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALNUM = string.ascii_letters + string.digits

# One of each credential shape the issue names (all fake).
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"           # hf_ + 34
GHP = "ghp_" + "a1B2c3D4" * 4 + "e5F6"                      # ghp_ + 36
GH_PAT = "github_pat_" + "11ABCDEFG0" * 5 + "_xyz"
OPENAI = "sk-proj-" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp"
SLACK_TOKEN = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
SLACK_URL = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
FEISHU_URL = "https://open.feishu.cn/open-apis/bot/v2/hook/0f0f0f0f-1111-2222-3333-444455556666"
LARK_URL = "https://open.larksuite.com/open-apis/bot/v2/hook/a1b2c3d4-0000-1111-2222-333344445555"
WANDB = "0123456789abcdef0123456789abcdef01234567"     # no shape: only its name tells
PLAIN = "plainSecretValue77"                             # no shape either

SHAPED = [HF, GHP, GH_PAT, OPENAI, SLACK_TOKEN, AWS_ID, JWT, SLACK_URL, FEISHU_URL, LARK_URL]
# (text, secrets that must be gone): the forms the issue lists
FORMS = [
    (f"WANDB_API_KEY={WANDB}", [WANDB]),
    (f'HF_TOKEN="{PLAIN}"', [PLAIN]),
    (f"HF_TOKEN='{PLAIN}'", [PLAIN]),
    (json.dumps({"WANDB_API_KEY": WANDB}), [WANDB]),
    (repr({"wandb_api_key": PLAIN}), [PLAIN]),
    (f"wandb_api_key: {WANDB}", [WANDB]),
    (f"aws_secret_access_key = {AWS_SECRET}", [AWS_SECRET]),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\nAWS_ACCESS_KEY_ID={AWS_ID}", [AWS_SECRET, AWS_ID]),
    (f"Authorization: Bearer {JWT}", [JWT]),
    (f"authorization: bearer {PLAIN}", [PLAIN]),
    (f"curl -H 'Authorization: Basic {PLAIN}'", [PLAIN]),
    (f"export hf_token={PLAIN}; python train.py", [PLAIN]),
    (f"db_password: {PLAIN}", [PLAIN]),
    (f"https://x.example/cb?access_token={PLAIN}&page=2", [PLAIN]),
    (f"postgres://trainer:{PLAIN}@db.internal:5432/runs", [PLAIN]),
    (f"clientSecret={PLAIN}", [PLAIN]),
    (f"notify {SLACK_URL} and {FEISHU_URL}", [SLACK_URL.rsplit('/', 1)[1], FEISHU_URL.rsplit('/', 1)[1]]),
]


def fixture_keys() -> set[str]:
    keys = set()
    for p in sorted((FIXTURES / "verl").glob("*.jsonl")):
        for line in p.read_bytes().splitlines():
            if line.strip():
                keys |= set(orjson.loads(line)["data"])
    for p in sorted((FIXTURES / "verl").glob("*.console.log")):
        for line in p.read_text().splitlines():
            try:
                keys |= set(parse_console_line(line).values)
            except Exception:
                pass
    return keys


VERL_KEYS_NAMED_IN_THE_ISSUE = ["actor/grad_norm", "critic/rewards/mean", "timing_s/gen", "val-core/ocr/reward/mean@1",
                                "perf/total_num_images", "perf/total_num_tokens", "timing_per_token_ms/gen",
                                "response_length/mean", "prompt_length/clip_ratio", "actor/entropy",
                                "global_seqlen/balanced_max", "training/global_step", "critic/score/mean"]


# --- the module ---------------------------------------------------------------------------------------------
def test_every_key_of_the_recorded_verl_fixtures_survives():
    keys = fixture_keys()
    assert len(keys) > 50
    flagged = sorted(k for k in keys | set(VERL_KEYS_NAMED_IN_THE_ISSUE) if is_secret_key(k))
    assert not flagged, f"ordinary verl keys taken for secrets: {flagged}"
    for k in keys:
        assert redact(k) == k


@pytest.mark.parametrize("secret", SHAPED)
def test_each_credential_shape_is_recognised_and_redacted(secret):
    assert looks_like_credential(secret)
    out = redact(f"see {secret} here")
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize("text,secrets", FORMS)
def test_each_assignment_form_is_redacted(text, secrets):
    out = redact(text)
    for s in secrets:
        assert s not in out, out


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf_token", "env/hf_token", "config/trainer/hf_token", "env/WANDB_API_KEY",
                                  "wandb_api_key", "OPENAI_API_KEY", "aws_secret_access_key", "AWS_ACCESS_KEY_ID",
                                  "db_password", "apiKey", "accessToken", "GITHUB_TOKEN", "secrets/x", "Authorization",
                                  "slack_webhook_url", "ssh_key", "client_secret"])
def test_secret_names_in_any_case(name):
    assert is_secret_name(name) and is_secret_name(name.upper()) and is_secret_name(name.lower())


@pytest.mark.parametrize("key", [HF, GHP, OPENAI, "env/" + HF, "x/" + SLACK_TOKEN])
def test_credential_shaped_key_names_are_secret_keys(key):
    assert is_secret_key(key)


# --- properties -----------------------------------------------------------------------------------------------
def _tok(prefix: str, n: int):
    return st.text(alphabet=ALNUM, min_size=n, max_size=n + 8).map(lambda s: prefix + s)


shaped = st.one_of(_tok("hf_", 34), _tok("ghp_", 36), _tok("gho_", 36), _tok("sk-", 40), _tok("sk-proj-", 40),
                   st.text(alphabet=string.ascii_uppercase + string.digits, min_size=16, max_size=16).map(lambda s: "AKIA" + s),
                   st.tuples(_tok("eyJ", 10), _tok("eyJ", 10), st.text(alphabet=ALNUM, min_size=8, max_size=20)).map(".".join),
                   _tok("https://hooks.slack.com/services/T", 20),
                   _tok("https://open.feishu.cn/open-apis/bot/v2/hook/", 24))
secret_names = st.sampled_from(["HF_TOKEN", "hf_token", "WANDB_API_KEY", "wandb_api_key", "OPENAI_API_KEY",
                                "aws_secret_access_key", "GITHUB_TOKEN", "db_password", "api_key", "accessToken",
                                "client_secret", "MY_SERVICE_PASSWORD", "auth_token"]).flatmap(
    lambda n: st.sampled_from([n, n.lower(), n.upper()]))
values = st.text(alphabet=ALNUM + "/+=-", min_size=8, max_size=40).filter(lambda v: v[0].isalnum())
filler = st.text(alphabet=string.ascii_lowercase + string.digits + " ./", max_size=40)


@PROPS
@given(filler, shaped, filler)
def test_property_no_shaped_credential_survives_whatever_surrounds_it(before, secret, after):
    assume(secret not in before + after)
    out = redact(f"{before} {secret} {after}")
    assert secret not in out


@PROPS
@given(filler, secret_names, st.sampled_from(["=", ": ", " = ", ":", "=\t"]), st.sampled_from(["", '"', "'"]),
       values, filler, st.booleans())
def test_property_no_assigned_secret_survives_in_any_form(before, name, sep, quote, value, after, json_name):
    assume(value not in before and value not in after)
    n = f'"{name}"' if json_name else name
    out = redact(f"{before} {n}{sep}{quote}{value}{quote} {after}")
    assert value not in out, out


@PROPS
@given(st.text(max_size=200))
def test_property_redaction_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once


@PROPS
@given(filler)
def test_property_text_without_secrets_is_left_alone(text):
    assert redact(text) == text


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet=ALNUM + " ", max_size=12))
json_tree = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=3),
                                                         st.dictionaries(st.text(alphabet=string.ascii_lowercase, max_size=6), c, max_size=3)),
                         max_leaves=10)


@PROPS
@given(json_tree, st.one_of(shaped, values), secret_names, st.integers(0, 5), st.booleans())
def test_property_redact_tree_leaves_no_secret_anywhere_in_a_json_tree(tree, secret, name, where, embed):
    """A secret planted at a random depth — as the value of a secret-named field, or inside any string
    when it has a credential shape — is gone from the serialized tree."""
    assume(secret not in json.dumps(tree))
    if not looks_like_credential(secret):
        embed = False  # an unshaped value is only recognisable by its field's name
    node, path = tree, []
    for _ in range(where):
        if isinstance(node, dict) and node:
            k = sorted(node)[0]
            path.append(k)
            node = node[k]
        else:
            break
    planted = {name: secret} if not embed else {"note": f"value was {secret} yesterday"}
    if isinstance(node, dict):
        node.update(planted)
    else:
        tree = {"x": tree, **planted}
    assert secret not in json.dumps(redact_tree(tree))


verl_segments = st.sampled_from(["actor", "critic", "timing_s", "timing_per_token_ms", "timing_per_image_ms", "perf",
                                 "training", "val-core", "val-aux", "response_length", "prompt_length", "rewards",
                                 "mean", "max", "min", "std", "grad_norm", "pg_clipfrac", "gen", "reward",
                                 "update_actor", "total_num_tokens", "total_num_images", "mfu", "throughput",
                                 "global_step", "ocr", "reward/mean@1", "zero_std_ratio", "agent_loop", "num_preempted"])


@PROPS
@given(st.lists(verl_segments, min_size=1, max_size=5))
def test_property_verl_shaped_keys_are_never_taken_for_secrets(segments):
    key = "/".join(segments)
    assert not is_secret_key(key) and redact(key) == key


# --- every path ---------------------------------------------------------------------------------------------------
PUSH, HOOK = "push-token-redact-0123456789", "hook-token-redact-0123456789"
KEYS_WITH_SECRETS = {f"env/{HF}": 1.0, "env/hf_token": 2.0, "config/trainer/logger/hf_token": 3.0, GHP: 4.0,
                     OPENAI: 5.0, "env/WANDB_API_KEY": 6.0, "Wandb_Api_Key": 7.0}
ALL_SECRETS = SHAPED + [WANDB, PLAIN, AWS_SECRET]


def _leaks(text: str) -> list[str]:
    names = ["hf_token", "wandb_api_key"]
    return [s for s in ALL_SECRETS if s in text] + [n for n in names if n in text.lower()]


def test_secret_keys_and_token_named_dirs_never_reach_metrics_state_or_logs(tmp_path, caplog):
    """JSONL keys shaped or named like credentials, and a project directory named like a token (push
    refuses that name; the file path must not turn it into a label either)."""
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "root"
    good, bad = root / "proj" / "exp.jsonl", root / HF / "exp.jsonl"
    for f in (good, bad):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"".join(orjson.dumps({"step": s, "data": {"timing_s/step": 10.0, **KEYS_WITH_SECRETS}}) + b"\n"
                               for s in (1, 2, 3)))
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl")
    cp = Checkpointer(store, [src], str(tmp_path / "state"))
    src.poll_once()
    src.poll_once()
    assert cp.save()
    metrics = generate_latest(make_registry(store)).decode()
    state = (tmp_path / "state" / "exporter-state.json").read_text()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for where, text in (("metrics", metrics), ("state", state), ("logs", logs)):
        assert not _leaks(text), (where, _leaks(text))
    assert store.runs[("proj", "exp")].steps_total == 3 and len(store.runs) == 1
    assert store.errors[("jsonl", "secret_key")] == 3 * len(KEYS_WITH_SECRETS)
    assert store.errors[("jsonl", "credential_in_project")] == 1  # once, not per poll
    assert "credential" in logs


@pytest.fixture
def relay_app(tmp_path, monkeypatch):
    monkeypatch.setattr(app_mod, "AREAS", (push, relay_api))
    rcv = Receiver().start()
    receivers = []
    for kind in ("slack", "feishu", "webhook"):
        monkeypatch.setenv(f"OMNIWATCH_RD_{kind.upper()}", f"{rcv.url}/{kind}")
        receivers.append({"name": kind, "type": kind, "url_env": f"OMNIWATCH_RD_{kind.upper()}"})
    conf = tmp_path / "relay.yml"
    conf.write_text(yaml.safe_dump({"receivers": receivers, "retry": {"initial_seconds": 0.05, "max_seconds": 0.2}}))
    store = RunStore()
    settings_ = Settings(push_token=PUSH, webhook_token=HOOK, state_dir=str(tmp_path / "state"),
                         extra={"relay_config": str(conf)})
    try:
        yield create_app(store, make_registry(store), settings_), rcv, store
    finally:
        rcv.stop()


def _note_with_secrets() -> dict:
    desc = " ".join(t for t, _ in FORMS) + " " + " ".join(SHAPED)
    labels = {"alertname": "RewardBoundRollout", "project": "p", "experiment": "e", "WANDB_API_KEY": WANDB,
              "hf_token": PLAIN}
    return {"version": "4", "groupKey": '{}:{alertname="RewardBoundRollout", WANDB_API_KEY="%s"}' % WANDB,
            "status": "firing", "receiver": "omniwatch", "commonLabels": labels,
            "commonAnnotations": {"description": desc}, "externalURL": f"http://am.local/?token={PLAIN}",
            "alerts": [{"status": "firing", "startsAt": "2025-01-01T00:00:00Z", "labels": labels,
                        "annotations": {"summary": f"Authorization: Bearer {JWT}", "description": desc,
                                        "remedy": json.dumps({"HF_TOKEN": PLAIN})},
                        "generatorURL": SLACK_URL}]}


def test_secrets_in_alerts_are_not_stored_served_forwarded_or_logged(relay_app, tmp_path, caplog):
    """Before: a WANDB_API_KEY label, HF_TOKEN="..." (quoted), JSON {"WANDB_API_KEY": ...}, lower-case
    wandb_api_key: ..., aws_secret_access_key = ..., Authorization: Bearer <jwt> and Slack webhook URLs
    were stored, served by GET /api/v1/alerts and forwarded."""
    caplog.set_level(logging.DEBUG)
    app, rcv, store = relay_app
    with TestClient(app) as c:
        r = c.post("/api/v1/alertmanager", json=_note_with_secrets(), headers={"Authorization": f"Bearer {HOOK}"})
        assert r.status_code == 200 and r.json()["status"] == "stored"
        got = rcv.wait_accepted(3, timeout=20)
        history = c.get("/api/v1/alerts").text
        status = c.get("/api/v1/relay/status").text
    sent = json.dumps([g["body"] for g in got])
    raw_db = b"".join(p.read_bytes() for p in (tmp_path / "state").glob("alerts.sqlite3*")).decode("utf-8", "replace")
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert "RewardBoundRollout" in sent and "RewardBoundRollout" in history
    for where, text in (("forwarded", sent), ("history", history), ("sqlite file", raw_db), ("status", status),
                        ("logs", logs)):
        leaked = [s for s in ALL_SECRETS if s in text]
        assert not leaked, (where, leaked)


def test_push_refuses_credential_labels_and_drops_credential_keys_in_any_case(relay_app):
    app, _rcv, store = relay_app
    with TestClient(app) as c:
        r = c.post("/api/v1/push", json={"project": "p", "experiment": "e", "step": 1,
                                          "data": {"timing_s/step": 1.0, **KEYS_WITH_SECRETS}},
                   headers={"Authorization": f"Bearer {PUSH}"})
        assert r.status_code == 200 and r.json()["skipped"] == {"values_secret_key": len(KEYS_WITH_SECRETS)}
        for label in (HF, f"run-{GHP}", OPENAI):
            r = c.post("/api/v1/push", json={"project": label, "experiment": "e", "step": 1, "data": {}},
                       headers={"Authorization": f"Bearer {PUSH}"})
            assert r.status_code == 400 and label not in r.text
        text = c.get("/metrics").text
    assert not _leaks(text)


def test_the_log_filter_redacts_messages_arguments_and_tracebacks():
    rec = logging.LogRecord("omniwatch.x", logging.ERROR, __file__, 1, "sending to %s with %s", (SLACK_URL, f"hf_token={PLAIN}"), None)
    try:
        raise RuntimeError(f"boom {HF}")
    except RuntimeError:
        import sys
        rec.exc_info = sys.exc_info()
    RedactingFilter().filter(rec)
    out = logging.Formatter().format(rec)
    assert SLACK_URL.rsplit("/", 1)[1] not in out and PLAIN not in out and HF not in out
    assert "boom" in out and "RuntimeError" in out


def test_serve_installs_the_log_filter_on_every_handler(tmp_path):
    """The real process: a token-named watch directory and an env-dump push never print a secret."""
    import httpx

    from .conftest import free_port, wait_for
    root = tmp_path / "logs"
    (root / HF).mkdir(parents=True)
    (root / HF / "exp.jsonl").write_bytes(b'{"step": 1, "data": {"x": 1.0}}\n')
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "omniwatch", "--log-level", "DEBUG", "serve", "--listen",
                                 f"127.0.0.1:{port}", "--watch", str(root), "--watch", str(root / f"{GHP}.jsonl")],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMNIWATCH_PUSH_TOKEN": PUSH})
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, 30, 0.1)
        httpx.post(f"http://127.0.0.1:{port}/api/v1/push", content=b'{"project": "p", "experiment": "' + HF.encode() + b'"}',
                   headers={"Authorization": f"Bearer {PUSH}"}, timeout=5)
        time.sleep(2.5)  # a rescan
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.terminate()
        proc.wait(10)
    logs = log_path.read_text()
    assert "credential" in logs, logs[-600:]
    assert not _leaks(logs) and not _leaks(text), (_leaks(logs), _leaks(text))
    assert re.search(r"verl-?logs|logs", logs)
