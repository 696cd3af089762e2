"""The HTTP push endpoint: bearer token, size limit, bad bodies, batching."""
import pytest
from fastapi.testclient import TestClient

from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.settings import Settings

TOKEN = "s3cret-push-token"


@pytest.fixture
def client_store():
    store = RunStore()
    app = create_app(store, make_registry(store), Settings(push_token=TOKEN, max_body_bytes=64 * 1024))
    with TestClient(app) as c:
        yield c, store


AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"project": "p", "experiment": "e", "step": 1, "data": {"timing_s/step": 10.0, "timing_s/gen": 4.0}}


def test_push_accepts_a_step_and_it_is_exported(client_store):
    c, store = client_store
    r = c.post("/api/v1/push", json=BODY, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"accepted": 1, "skipped": {}}
    text = c.get("/metrics").text
    assert 'omniwatch_step{experiment="e",project="p"} 1.0' in text
    assert TOKEN not in text


@pytest.mark.parametrize("headers,status", [({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                                            ({"Authorization": f"Basic {TOKEN}"}, 401)])
def test_wrong_or_missing_token_is_refused(client_store, headers, status):
    c, store = client_store
    assert c.post("/api/v1/push", json=BODY, headers=headers).status_code == status
    assert not store.runs


def test_push_is_disabled_without_a_configured_token():
    store = RunStore()
    with TestClient(create_app(store, make_registry(store), Settings(push_token=None))) as c:
        r = c.post("/api/v1/push", json=BODY, headers=AUTH)
    assert r.status_code == 403 and "OMNIWATCH_PUSH_TOKEN" in r.json()["detail"]


def test_oversize_body_is_413_with_or_without_content_length(client_store):
    c, store = client_store
    big = b'{"project":"p","experiment":"e","step":1,"data":{"k":"' + b"x" * 100_000 + b'"}}'
    assert c.post("/api/v1/push", content=big, headers=AUTH).status_code == 413

    def chunks():
        for _ in range(100):
            yield b"x" * 1000
    assert c.post("/api/v1/push", content=chunks(), headers=AUTH).status_code == 413
    assert not store.runs


@pytest.mark.parametrize("body,status,reason", [
    (b"not json", 400, "malformed_json"),
    (b"[1,2]", 400, "not_object"),
    (b'{"project": "p", "experiment": "e\\n", "step": 1, "data": {}}', 400, "bad_experiment"),
    (b'{"project": 3, "experiment": "e", "step": 1, "data": {}}', 400, "bad_project"),
    (b'{"project": "p", "experiment": "e", "step": "x", "data": {}}', 422, "bad_step"),
    (b'{"project": "p", "experiment": "e", "steps": {"a": 1}}', 400, "bad_steps"),
])
def test_bad_bodies_get_a_clear_4xx_and_are_counted(client_store, body, status, reason):
    c, store = client_store
    r = c.post("/api/v1/push", content=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert store.errors[("push", reason)] == 1


def test_a_batch_with_a_bad_step_is_refused_whole_and_nothing_is_applied(client_store):
    """Issue 14 item 3: the batch is validated whole before any step is applied."""
    c, store = client_store
    body = {"project": "p", "experiment": "e", "steps": [
        {"step": 1, "data": {"timing_s/step": 3.0, "note": "text"}}, {"step": "bad"}, {"step": 2, "data": {"x": 1}}]}
    r = c.post("/api/v1/push", json=body, headers=AUTH)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail["accepted"] == 0 and detail["errors"] == [{"index": 1, "reason": "bad_step"}]
    assert ("p", "e") not in store.runs and store.errors[("push", "bad_step")] == 1


def test_value_skips_inside_good_steps_are_reported_and_the_steps_applied(client_store):
    c, store = client_store
    body = {"project": "p", "experiment": "e", "steps": [
        {"step": 1, "data": {"timing_s/step": 3.0, "note": "text"}}, {"step": 2, "data": {"x": 1}}]}
    r = c.post("/api/v1/push", json=body, headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"accepted": 2, "skipped": {"values_non_numeric": 1}}
    assert store.runs[("p", "e")].steps_total == 2


@pytest.mark.parametrize("step,reason", [('"\u00b2"', "bad_step"), ('"\u0663"', "bad_step"),
                                         ('"' + "9" * 5000 + '"', "bad_step"),
                                         ("9" * 5000, "number_out_of_range"),
                                         ("-" + "9" * 400, "number_out_of_range")])
def test_unicode_digits_and_huge_numbers_as_a_step_are_4xx_and_counted(client_store, step, reason):
    """Before: "²".isdigit() is True and int("²") raised: a 500 (and int() of 5,000 digits raises too)."""
    c, store = client_store
    body = ('{"project":"p","experiment":"e","step":%s,"data":{"timing_s/step":1.0}}' % step).encode()
    r = c.post("/api/v1/push", content=body, headers=AUTH)
    assert 400 <= r.status_code < 500, r.text
    assert store.errors[("push", reason)] == 1
    assert ("p", "e") not in store.runs


def test_a_refused_batch_then_its_corrected_retry_is_not_a_restart(client_store):
    """Before: [1, 2, "²"] applied 1 and 2, answered 500, and the retry [1, 2, 3] went back from 2 to 1:
    a trainer restart and two replayed steps that never happened."""
    c, store = client_store

    def body(*steps):
        return {"project": "p", "experiment": "e",
                "steps": [{"step": s, "data": {"timing_s/step": 10.0, "timing_s/gen": 4.0}} for s in steps]}
    r = c.post("/api/v1/push", json=body(1, 2, "\u00b2"), headers=AUTH)
    assert r.status_code == 422 and ("p", "e") not in store.runs
    assert c.post("/api/v1/push", json=body(1, 2, 3), headers=AUTH).json()["accepted"] == 3
    run = store.runs[("p", "e")]
    assert (run.steps_total, run.restarts_total, run.replayed_total) == (3, 0, 0)
