"""Property-based tests: every input parser and the file tail take arbitrary bytes without raising
anything but their documented error (LineError / PayloadError / fastapi 4xx), and the tail's buffer
never grows beyond ``max_line`` whatever the byte stream and its chunking."""
from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from omniwatch.core.model import RunStore
from omniwatch.core.parse import LineError, ParsedStep, parse_console_line, parse_jsonl_line, parse_record
from omniwatch.relay.payload import Notification, PayloadError, parse as parse_webhook
from omniwatch.sources.tail import FileTail

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                              st.dictionaries(st.text(max_size=10), c, max_size=4)),
                           max_leaves=12)


def _dumps(obj) -> bytes:
    """stdlib json: big integers and infinities included (orjson refuses them; a sender may not)."""
    return json.dumps(obj).encode()


def _check_parsed(p: ParsedStep) -> None:
    assert isinstance(p.step, int) and 0 <= p.step <= 10**12
    for k, v in p.values.items():
        assert isinstance(k, str) and 0 < len(k) <= 256
        assert isinstance(v, float) and math.isfinite(v)
    assert all(isinstance(n, int) and n > 0 for n in p.dropped.values())


@FUZZ
@given(st.binary(max_size=2000))
def test_parse_jsonl_line_random_bytes(raw):
    try:
        _check_parsed(parse_jsonl_line(raw))
    except LineError as e:
        assert e.reason


@FUZZ
@given(st.one_of(json_values, st.fixed_dictionaries({"step": json_values, "data": json_values}),
                 st.fixed_dictionaries({"step": st.integers(-5, 2**64), "data": st.dictionaries(
                     st.text(max_size=300), json_values, max_size=8)})))
def test_parse_record_random_objects(obj):
    """The push body path and JSONL share parse_record: any decoded JSON gives a step or a LineError."""
    try:
        _check_parsed(parse_record(obj))
    except LineError as e:
        assert e.reason
    # the same object through the JSONL path (orjson round trip) behaves the same
    try:
        raw = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return
    try:
        _check_parsed(parse_jsonl_line(raw))
    except LineError:
        pass


@FUZZ
@given(st.one_of(st.binary(max_size=600), st.text(max_size=600).map(lambda s: "step:" + s),
                 st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12)), max_size=6).map(
                     lambda kv: "(TaskRunner pid=1) step:3 - " + " - ".join(f"{k}:{v}" for k, v in kv))))
def test_parse_console_line_random_input(line):
    try:
        _check_parsed(parse_console_line(line))
    except LineError as e:
        assert e.reason


@FUZZ
@given(st.one_of(st.binary(max_size=1500), json_values.map(_dumps),
                 st.fixed_dictionaries({"version": st.sampled_from(["4", "3", 4]), "groupKey": json_values,
                                        "status": st.sampled_from(["firing", "resolved", "x"]),
                                        "alerts": st.lists(st.fixed_dictionaries({
                                            "status": st.sampled_from(["firing", "resolved", "?"]),
                                            "labels": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
                                            "startsAt": json_values}), max_size=3)}).map(_dumps)))
def test_webhook_payload_parser_random_bodies(body):
    try:
        note = parse_webhook(body)
    except PayloadError as e:
        assert e.reason in ("malformed_json", "bad_shape", "bad_version")
        return
    assert isinstance(note, Notification) and note.alerts
    assert len(note.notification_id()) == 32


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=30), st.integers(8, 200))
def test_file_tail_random_streams_and_chunkings(tmp_path_factory, chunks, max_line):
    """Bytes appended in arbitrary chunks: lines come out whole, never longer than max_line, the partial
    buffer never exceeds max_line, and the lines are exactly the complete, non-blank, short-enough lines
    of the stream."""
    path = tmp_path_factory.mktemp("tail") / "f.jsonl"
    path.write_bytes(b"")
    tail = FileTail(str(path), max_line=max_line)
    got = []
    try:
        tail.poll()
        with open(path, "ab", buffering=0) as f:
            for c in chunks:
                f.write(c)
                res = tail.poll()
                assert "truncated" not in res.events and "rotated" not in res.events
                got.extend(res.lines)
                assert len(tail._buf) <= max_line
                assert all(len(line) <= max_line and b"\n" not in line for line in res.lines)
    finally:
        tail.close()
    stream = b"".join(chunks)
    complete = stream.split(b"\n")[:-1]
    assert got == [ln for ln in complete if ln.strip() and len(ln) <= max_line]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=20))
def test_random_lines_through_the_store_never_raise(lines):
    """Whatever parses is ingestible: the model never raises on a parsed step."""
    store = RunStore(max_keys=16)
    for raw in lines:
        for parse in (parse_jsonl_line, parse_console_line):
            try:
                p = parse(raw)
            except LineError:
                continue
            store.ingest("p", "e", p, "fuzz")
    assert all(len(r.keys) <= 16 for r in store.runs.values())


def test_push_endpoint_random_bodies_are_4xx_never_500():
    """The push endpoint in-process: random bodies answer 200/4xx, never 5xx."""
    from fastapi.testclient import TestClient
    from hypothesis import given as g

    from omniwatch.app import create_app
    from omniwatch.core.exposition import make_registry
    from omniwatch.settings import Settings

    store = RunStore()
    app = create_app(store, make_registry(store), Settings(push_token="t0ken-fuzz", max_body_bytes=4096))
    codes = []
    with TestClient(app) as client:
        @settings(max_examples=150, deadline=None)
        @g(st.one_of(st.binary(max_size=5000), json_values.map(_dumps), st.fixed_dictionaries({
            "project": json_values, "experiment": st.text(max_size=140), "step": json_values,
            "data": json_values}).map(_dumps)))
        def one(body):
            r = client.post("/api/v1/push", content=body, headers={"authorization": "Bearer t0ken-fuzz"})
            codes.append(r.status_code)
            assert r.status_code < 500, r.text
        one()
    assert codes and set(codes) <= {200, 400, 413, 422}
