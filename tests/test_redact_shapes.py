"""Issue 25 item 7: credential shapes that passed redaction (WeCom and MS Teams webhooks, Google ``AIza…``
keys, PEM private keys, GitLab ``glpat-``, npm ``npm_``, Stripe ``sk_live_``, Azure SAS ``sig=``,
URL-encoded Slack hooks) and a ``password: …`` phrase that kept 3 of its 4 words. Each is redacted on
every path an alert takes: stored (the SQLite file itself), served by ``GET /api/v1/alerts``, forwarded
to Slack/Feishu/webhook receivers, and logged. All values are fake."""
from __future__ import annotations

import json
import logging
import string
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import assume, given, strategies as st

from omniwatch.redact import REDACTED, looks_like_credential, redact, redact_tree

from .test_redact import HOOK, PROPS, relay_app  # noqa: F401  (relay_app is a fixture)

ALNUM = string.ascii_letters + string.digits
SLACK_URL = "https://hooks.slack.com/services/T0FAKE000/B0FAKE000/FAKEfakeFAKEfakeFAKEfake"
WECOM = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a91f6-7aaa-4bc4-97a0-0ec2fakefake"
TEAMS = ("https://contoso.webhook.office.com/webhookb2/11111111-2222-3333-4444-555555555555@66666666-7777-8888-9999-"
         "000000000000/IncomingWebhook/0123456789abcdef0123456789abcdef/aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
TEAMS_FLOW = ("https://prod-42.westeurope.logic.azure.com:443/workflows/0123456789abcdef0123456789abcdef/triggers/"
              "manual/paths/invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig=FAKEsigFAKEsigFAKE12")
GOOGLE = "AIzaSyFAKE" + "0123456789abcdefghijklmnopq"   # AIza + 35
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDFAKEFAKEFAKE"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n{PEM_BODY[::-1]}\n-----END PRIVATE KEY-----"
PEM_RSA_IN_JSON = json.dumps({"key": f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n"})[1:-1]  # escaped \n, cut
GITLAB = "glpat-FAKEfake0123456789xy"
NPM = "npm_" + "FAKEfake0123456789FAKEfake0123456789"
STRIPE = "sk_live_" + "FAKEfake0123456789FAKEfake"
SAS_SIG = "FAKEsig0123456789abcdEFGH%2Bxyz%3D"
SAS_URL = f"https://acct.blob.core.windows.net/ckpt/model.pt?sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-12-31&sig={SAS_SIG}"
SLACK_ENCODED = quote(SLACK_URL, safe="")
SLACK_TWICE = quote(SLACK_ENCODED, safe="")
PHRASE_WORDS = ["correct", "horsefly", "batterypack", "staplegun"]
PHRASE = "password: " + " ".join(PHRASE_WORDS)

# (the text as it appears, the parts that must be gone)
NEW_SHAPES = [
    (WECOM, [WECOM.rsplit("=", 1)[1]]),
    (TEAMS, ["0123456789abcdef0123456789abcdef", "11111111-2222-3333-4444-555555555555"]),
    (TEAMS_FLOW, ["FAKEsigFAKEsigFAKE12", "0123456789abcdef0123456789abcdef"]),
    (GOOGLE, [GOOGLE]),
    (PEM, [PEM_BODY, PEM_BODY[::-1]]),
    (PEM_RSA_IN_JSON, [PEM_BODY]),
    (GITLAB, [GITLAB]),
    (NPM, [NPM]),
    (STRIPE, [STRIPE]),
    (SAS_URL, [SAS_SIG, "FAKEsig0123456789abcdEFGH"]),
    (SLACK_ENCODED, ["FAKEfakeFAKEfakeFAKEfake"]),
    (SLACK_TWICE, ["FAKEfakeFAKEfakeFAKEfake"]),
    (PHRASE, PHRASE_WORDS),
]
IDS = ["wecom", "teams", "teams_workflow", "google", "pem", "pem_in_json_cut", "gitlab", "npm", "stripe", "azure_sas",
       "slack_urlencoded", "slack_urlencoded_twice", "password_phrase"]


@pytest.mark.parametrize("text,gone", NEW_SHAPES, ids=IDS)
def test_each_new_shape_is_redacted_in_a_sentence(text, gone):
    out = redact(f"deliver to {text} then stop")
    for g in gone:
        assert g not in out, out
    assert REDACTED in out and out.startswith("deliver to ")
    if text not in (PEM_RSA_IN_JSON, PHRASE):  # a cut key and a passphrase run to the end of the phrase
        assert out.endswith(" then stop"), out


def test_controls_that_look_close_stay():
    """Ordinary text near the new shapes is left alone: a percent in prose, a URL without a signature, a
    token name followed by prose, a bare AIza word, a PEM public key."""
    for text in ("50%25 of steps, 100% done", "https://example.com/a%20b?x=1&y=2", "see AIza here",
                 "HF_TOKEN is unset, so the run is anonymous", "signature sig=short",
                 "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----",
                 "password rotation is weekly"):
        assert redact(text) == text, text
    # after a token the next words are the sentence, not the token
    assert redact("HF_TOKEN=abcdef123 python train.py") == f"HF_TOKEN={REDACTED} python train.py"


# --- properties ---------------------------------------------------------------------------------------------------
def _body(n: int, alphabet: str = ALNUM):
    return st.text(alphabet=alphabet, min_size=n, max_size=n + 10)


new_shaped = st.one_of(
    _body(35, ALNUM + "_-").map(lambda s: "AIza" + s),
    _body(20, ALNUM + "_-").map(lambda s: "glpat-" + s),
    _body(36).map(lambda s: "npm_" + s),
    st.tuples(st.sampled_from(["sk_live_", "rk_live_", "sk_test_"]), _body(24)).map("".join),
    _body(36, "0123456789abcdef-").map(lambda s: "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=" + s),
    _body(32, "0123456789abcdef").map(lambda s: f"https://x.webhook.office.com/webhookb2/a@b/IncomingWebhook/{s}/c"),
    st.tuples(_body(40, ALNUM + "+/"), _body(40, ALNUM + "+/")).map(
        lambda t: f"-----BEGIN EC PRIVATE KEY-----\n{t[0]}\n{t[1]}\n-----END EC PRIVATE KEY-----"),
    _body(24).map(lambda s: f"https://hooks.slack.com/services/T000/B000/{s}"),
)
filler = st.text(alphabet=string.ascii_lowercase + string.digits + " ./", max_size=40)


def _secret_part(secret: str) -> str:
    """The part of ``secret`` that must never be seen (the random body)."""
    if secret.startswith("-----BEGIN"):
        return secret.split("\n")[1]
    if "/IncomingWebhook/" in secret:
        return secret.split("/")[-2]
    return secret.rsplit("/", 1)[-1].rsplit("=", 1)[-1].rsplit("_", 1)[-1].rsplit("-", 1)[-1] \
        if secret.startswith("https://") else secret


@PROPS
@given(filler, new_shaped, st.integers(0, 2), filler)
def test_property_new_shapes_never_survive_plain_or_url_encoded(before, secret, encodings, after):
    """Each new shape with a random body, surrounded by random text, plain or URL-encoded once or twice
    (a webhook URL passed as a query parameter), is gone."""
    part = _secret_part(secret)
    assume(len(part) >= 8 and part not in before + after)
    text = secret
    for _ in range(encodings):
        text = quote(text, safe="")
    out = redact(f"{before} {text} {after}")
    assert part not in out and quote(part, safe="") not in out, (text, out)
    assert looks_like_credential(secret)


@PROPS
@given(filler, st.sampled_from(["password", "db_password", "PASSPHRASE", "smtp_passwd", "wifi pwd"]),
       st.sampled_from([": ", "=", " = ", ":\t"]),
       st.lists(st.text(alphabet=string.ascii_letters + string.digits + "!#$%*+-./?@^_~", min_size=3, max_size=12)
                .filter(lambda w: w[0].isalnum()), min_size=1, max_size=6))
def test_property_no_word_of_a_password_phrase_survives(before, name, sep, words):
    assume(all(w not in before + name for w in words))
    out = redact(f"{before} {name}{sep}{' '.join(words)}")
    left = [w for w in words if w in out]
    assert not left, (out, left)


@PROPS
@given(st.text(alphabet=string.printable, max_size=120))
def test_property_redaction_stays_idempotent_with_percent_escapes(text):
    once = redact(text)
    assert redact(once) == once


# --- every path: stored, served, forwarded, logged ----------------------------------------------------------------
def _note() -> dict:
    desc = " ; ".join(t for t, _ in NEW_SHAPES)
    labels = {"alertname": "RewardBoundRollout", "project": "p", "experiment": "e", "notify": SLACK_ENCODED}
    return {"version": "4", "groupKey": '{}:{alertname="RewardBoundRollout", hook="%s"}' % WECOM,
            "status": "firing", "receiver": "omniwatch", "commonLabels": labels,
            "commonAnnotations": {"description": desc}, "externalURL": f"http://am.local/?u={SLACK_ENCODED}",
            "alerts": [{"status": "firing", "startsAt": "2025-01-01T00:00:00Z", "labels": labels,
                        "annotations": {"summary": f"push failed: {TEAMS}", "description": desc, "remedy": PHRASE},
                        "generatorURL": SAS_URL}]}


def test_new_shapes_in_alerts_are_not_stored_served_forwarded_or_logged(relay_app, tmp_path, caplog):  # noqa: F811
    """Before: every one of these was stored in alerts.sqlite3, served by GET /api/v1/alerts and forwarded."""
    caplog.set_level(logging.DEBUG)
    app, rcv, _store = relay_app
    with TestClient(app) as c:
        r = c.post("/api/v1/alertmanager", json=_note(), headers={"Authorization": f"Bearer {HOOK}"})
        assert r.status_code == 200 and r.json()["status"] == "stored"
        got = rcv.wait_accepted(3, timeout=20)
        history = c.get("/api/v1/alerts").text
    sent = json.dumps([g["body"] for g in got])
    raw_db = b"".join(p.read_bytes() for p in (tmp_path / "state").glob("alerts.sqlite3*")).decode("utf-8", "replace")
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert "RewardBoundRollout" in sent and "RewardBoundRollout" in history and REDACTED in sent
    secrets = {g for _, gone in NEW_SHAPES for g in gone}
    for where, text in (("forwarded", sent), ("history", history), ("sqlite file", raw_db), ("logs", logs)):
        leaked = sorted(s for s in secrets if s in text or json.dumps(s)[1:-1] in text)
        assert not leaked, (where, leaked)


def test_redact_tree_takes_new_shapes_out_of_any_field():
    tree = {"a": [{"b": f"x {GOOGLE} y"}, SAS_URL], "c": {"d": SLACK_TWICE}}
    out = json.dumps(redact_tree(tree))
    for s in (GOOGLE, SAS_SIG, "FAKEfakeFAKEfakeFAKEfake"):
        assert s not in out
