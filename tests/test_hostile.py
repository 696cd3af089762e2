"""Hostile and careless inputs (issue 14, items 4-6): no 500 for bad input, every one counted in
omniwatch_ingest_errors_total with a reason; a corrupt alerts.sqlite3 is said, not hidden behind 200
"stored"; a state file of any shape does not stop the exporter; symlinks out of the watch root are not
followed; a FIFO is reported once; a client that disconnects mid-upload is one log line; and the file
tail keeps a bounded number of descriptors while keeping its rotation/truncation semantics."""
from __future__ import annotations

import copy
import logging
import os
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from omniwatch import names
from omniwatch.app import create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.settings import Settings
from omniwatch.sources.files import FileSource
from omniwatch.sources.tail import FdPool, FileTail
from relay_support import fixture_bodies

from .conftest import free_port, wait_for

TOKEN = "hostile-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def app_client(tmp_path, state_dir=None):
    store = RunStore()
    app = create_app(store, make_registry(store), Settings(push_token=TOKEN, webhook_token=TOKEN,
                                                           state_dir=state_dir))
    return store, TestClient(app, raise_server_exceptions=False)


def metric(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# --- item 4: no 500 for bad input, each counted -------------------------------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("path,source", [("/api/v1/alertmanager", "webhook"), ("/api/v1/phases", "phases"),
                                         ("/api/v1/agents", "agents"), ("/api/v1/push", "push")])
@pytest.mark.parametrize("body", [DEEP, b'{"a":' * 5000 + b"1" + b"}" * 5000, b"[" * 200_000])
def test_deeply_nested_json_is_a_counted_400_on_every_write_endpoint(tmp_path, path, source, body):
    """Before: the stdlib decoder raised RecursionError: a 500 from the webhook, phases and agents."""
    store, c = app_client(tmp_path)
    with c:
        r = c.post(path, content=body, headers=AUTH)
        assert r.status_code == 400, (r.status_code, r.text[:200])
        assert store.errors[(source, "too_deep")] == 1
        assert metric(c.get("/metrics").text, names.INGEST_ERRORS, source=source, reason="too_deep") == 1


def test_a_webhook_with_a_300_deep_extra_field_is_a_counted_400(tmp_path):
    """Before: accepted by the parser, then a 500 further down (a recursion limit while storing)."""
    store, c = app_client(tmp_path)
    note = copy.deepcopy(fixture_bodies()[0])
    deep: dict = {}
    cur = deep
    for _ in range(300):
        cur["x"] = {}
        cur = cur["x"]
    note["alerts"][0]["extra"] = deep
    with c:
        r = c.post("/api/v1/alertmanager", json=note, headers=AUTH)
        assert r.status_code == 400 and "deeper" in r.text
        assert store.errors[("webhook", "too_deep")] == 1
        assert c.get("/api/v1/alerts").json() == []
        ok = c.post("/api/v1/alertmanager", json=fixture_bodies()[0], headers=AUTH)
        assert ok.status_code == 200 and ok.json()["status"] == "stored"


def test_a_corrupt_alerts_db_is_not_answered_stored(tmp_path):
    """Before: 200 {"status": "stored"} while the notification lived in memory only."""
    state = tmp_path / "state"
    state.mkdir()
    garbage = b"this is not an SQLite database " * 64
    (state / "alerts.sqlite3").write_bytes(garbage)
    store, c = app_client(tmp_path, state_dir=str(state))
    with c:
        r = c.post("/api/v1/alertmanager", json=fixture_bodies()[0], headers=AUTH)
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "stored_in_memory" and body["durable"] is False
        assert "memory" in body["warning"] and "not a database" in body["warning"]
        text = c.get("/metrics").text
        assert metric(text, names.SOURCE_UP, source="relay", target="storage") == 0
        assert "not a database" in c.get("/api/v1/relay/status").json()["storage_error"]
    assert (state / "alerts.sqlite3").read_bytes() == garbage  # left for `sqlite3 .recover`, not overwritten


def test_a_healthy_alerts_db_says_durable_and_up(tmp_path):
    store, c = app_client(tmp_path, state_dir=str(tmp_path / "state"))
    with c:
        r = c.post("/api/v1/alertmanager", json=fixture_bodies()[0], headers=AUTH)
        assert r.json()["status"] == "stored" and r.json()["durable"] is True and "warning" not in r.json()
        assert metric(c.get("/metrics").text, names.SOURCE_UP, source="relay", target="storage") == 1


# --- item 6: symlinks, FIFOs ---------------------------------------------------------------------------------
def _steps(n: int) -> bytes:
    return b"".join(orjson.dumps({"step": s, "data": {"timing_s/step": 5.0}}) + b"\n" for s in range(1, n + 1))


def test_symlinks_out_of_the_watch_root_are_not_followed_unless_asked(tmp_path, caplog):
    outside = tmp_path / "home"
    (outside / "private").mkdir(parents=True)
    (outside / "private" / "notes.jsonl").write_bytes(_steps(4))
    (outside / "secret.jsonl").write_bytes(_steps(3))
    root = tmp_path / "verl-logs"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "real.jsonl").write_bytes(_steps(2))
    (root / "proj" / "alias.jsonl").symlink_to(root / "proj" / "real.jsonl")   # inside the root: fine
    (root / "proj" / "evil.jsonl").symlink_to(outside / "secret.jsonl")        # a file out of the root
    (root / "stolen").symlink_to(outside / "private")                         # a project dir out of it
    caplog.set_level(logging.INFO, logger="omniwatch.sources.files")
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl")
    for _ in range(5):
        src.poll_once()
        src._last_scan = 0  # rescan every pass
    assert set(store.runs) == {("proj", "real"), ("proj", "alias")}
    assert store.errors[("jsonl", "symlink_outside_root")] == 2  # once each, not per pass
    refusals = [r for r in caplog.records if "outside the watched directory" in r.getMessage()]
    assert len(refusals) == 2

    followed = RunStore()
    FileSource(followed, [str(root)], "jsonl", follow_symlinks=True).poll_once()
    assert {("proj", "evil"), ("stolen", "notes")} <= set(followed.runs)
    # a glob's root is its directory part: the same refusal applies
    globbed = RunStore()
    FileSource(globbed, [str(root / "proj" / "*.jsonl")], "jsonl").poll_once()
    assert ("proj", "evil") not in globbed.runs and ("proj", "real") in globbed.runs


def test_a_symlink_swapped_after_the_scan_is_refused_at_open(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(_steps(3))
    root = tmp_path / "root"
    (root / "p").mkdir(parents=True)
    f = root / "p" / "e.jsonl"
    f.write_bytes(b"")
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    f.unlink()
    f.symlink_to(outside)  # after the scan accepted the path
    src.poll_once()
    src.poll_once()
    assert ("p", "e") not in store.runs or store.runs[("p", "e")].steps_total == 0
    assert store.errors[("jsonl", "symlink_outside_root")] == 1


def test_a_fifo_is_reported_once_not_every_poll(tmp_path, caplog):
    """Before: a warning every 0.5 s for as long as the FIFO sat in the watch."""
    root = tmp_path / "root" / "proj"
    root.mkdir(parents=True)
    os.mkfifo(root / "pipe.jsonl")
    (root / "ok.jsonl").write_bytes(_steps(2))
    caplog.set_level(logging.INFO, logger="omniwatch.sources.files")
    store = RunStore()
    src = FileSource(store, [str(tmp_path / "root" / "proj" / "pipe.jsonl"), str(root / "ok.jsonl")], "jsonl")
    for _ in range(20):
        src.poll_once()
    lines = [r for r in caplog.records if "pipe.jsonl" in r.getMessage()]
    assert len(lines) == 1 and "not a regular file" in lines[0].getMessage()
    assert store.errors[("jsonl", "not_regular_file")] == 1
    assert store.sources[("jsonl", str(root / "pipe.jsonl"))] == 0
    assert store.runs[("proj", "ok")].steps_total == 2


# --- item 1: the tail's descriptors ------------------------------------------------------------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_pool_of_4_descriptors_follows_200_files(tmp_path):
    root = tmp_path / "root"
    for p in range(10):
        d = root / f"p{p}"
        d.mkdir(parents=True)
        for e in range(20):
            (d / f"e{e}.jsonl").write_bytes(_steps(2))
    store = RunStore(max_runs=500)
    before = _fds()
    src = FileSource(store, [str(root)], "jsonl", max_open=4)
    src.poll_once()
    assert len(store.runs) == 200 and src.open_files() == 4
    assert _fds() - before <= 4
    opened = src.pool.opened_total
    for _ in range(3):
        src.poll_once()
    assert src.pool.opened_total == opened, "unchanged files must not be opened again"
    with open(root / "p0" / "e0.jsonl", "ab") as f:  # long evicted from the pool
        f.write(orjson.dumps({"step": 3, "data": {"timing_s/step": 5.0}}) + b"\n")
    src.poll_once()
    assert store.runs[("p0", "e0")].steps_total == 3 and src.open_files() <= 4
    src.stop()
    assert _fds() <= before  # nothing left open (other tests' objects may be collected meanwhile)


def test_long_idle_files_are_polled_less_and_a_resumed_run_is_seen_within_idle_every_polls(tmp_path):
    from omniwatch.sources.files import IDLE_AFTER_POLLS, IDLE_EVERY
    root = tmp_path / "root" / "p"
    root.mkdir(parents=True)
    for e in range(100):
        (root / f"e{e}.jsonl").write_bytes(_steps(2))
    store = RunStore(max_runs=200)
    src = FileSource(store, [str(tmp_path / "root")], "jsonl")
    for _ in range(IDLE_AFTER_POLLS + 1):
        src.poll_once()
    looked = sum(t.unchanged_polls for t in src.tails.values())
    for _ in range(4 * IDLE_EVERY):
        src.poll_once()
    looked = sum(t.unchanged_polls for t in src.tails.values()) - looked
    assert looked == 100 * 4, "each idle file looked at once every IDLE_EVERY polls"
    with open(root / "e7.jsonl", "ab") as f:
        f.write(orjson.dumps({"step": 3, "data": {"timing_s/step": 5.0}}) + b"\n")
    for n in range(1, IDLE_EVERY + 1):
        src.poll_once()
        if store.runs[("p", "e7")].steps_total == 3:
            break
    assert store.runs[("p", "e7")].steps_total == 3 and n <= IDLE_EVERY
    assert src.tails[str(root / "e7.jsonl")].unchanged_polls == 0


def line(n: int) -> bytes:
    return b'{"step":%d,"data":{"timing_s/step":%d.5}}\n' % (n, n)


def _evicted_tail(tmp_path, content: bytes) -> tuple[FileTail, FdPool, object]:
    pool = FdPool(1)
    p = tmp_path / "run.jsonl"
    p.write_bytes(content)
    t = FileTail(str(p), pool=pool)
    assert t.poll().lines
    other = tmp_path / "other.jsonl"
    other.write_bytes(line(99))
    FileTail(str(other), pool=pool).poll()  # takes the pool's only descriptor
    assert not t.is_open
    return t, pool, p


def test_rotation_of_a_file_whose_descriptor_was_closed_is_drained_from_the_renamed_file(tmp_path):
    t, _pool, p = _evicted_tail(tmp_path, line(1))
    with open(p, "ab") as f:
        f.write(line(2))
    os.rename(p, tmp_path / "run.jsonl.1")
    p.write_bytes(line(3))
    r = t.poll()
    assert "rotated" in r.events and r.lines == [line(2).strip(), line(3).strip()]


def test_truncation_of_a_file_whose_descriptor_was_closed_is_seen(tmp_path):
    t, _pool, p = _evicted_tail(tmp_path, line(1) + line(2))
    with open(p, "wb") as f:
        f.write(line(21) + line(22) + line(23))
    r = t.poll()
    assert "truncated" in r.events and r.lines == [line(n).strip() for n in (21, 22, 23)]


def test_position_survives_a_closed_descriptor(tmp_path):
    t, _pool, p = _evicted_tail(tmp_path, line(1) + line(2)[:5])
    pos = t.position()
    assert pos is not None and pos["offset"] == len(line(1))


# --- item 6: a client that disconnects mid-upload; item 5: a broken state file, on a real process --------------
def _serve(tmp_path, args, env=None):
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    out = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{port}", *args],
                            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    out.close()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(url + "/healthz", timeout=1).status_code == 200, 30, 0.1,
             what=f"omniwatch serve: {log.read_text(errors='replace')[-400:] if log.exists() else ''}")
    return proc, port, url, log


@pytest.mark.integration
def test_a_client_that_disconnects_mid_upload_is_one_log_line(tmp_path):
    """Before: a 65-line traceback per disconnect."""
    proc, port, url, log = _serve(tmp_path, [], env={"OMNIWATCH_PUSH_TOKEN": TOKEN})
    try:
        before = log.read_text()
        for path in ("/api/v1/push", "/api/v1/phases"):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: 50000\r\n\r\n".encode() + b'{"project": "p"' + b" " * 1000)
            time.sleep(0.3)
            s.close()
        wait_for(lambda: (metric(httpx.get(url + "/metrics", timeout=5).text, names.INGEST_ERRORS, source="http",
                                 reason="client_disconnected") or 0) >= 2, 10, 0.2, what="disconnects counted")
        new = log.read_text()[len(before):]
        assert "Traceback" not in new, new[-2000:]
        assert len([x for x in new.splitlines() if x.strip()]) <= 2, new
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
@pytest.mark.parametrize("content", [b"[]", b'{"version": 1, "model": []}'])
def test_the_exporter_starts_on_a_state_file_of_the_wrong_shape(tmp_path, content):
    """Before: AttributeError at start, the file left in place: a supervisor restarts into the same crash."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "exporter-state.json").write_bytes(content)
    root = tmp_path / "root" / "proj"
    root.mkdir(parents=True)
    (root / "exp.jsonl").write_bytes(_steps(3))
    proc, port, url, log = _serve(tmp_path, ["--state-dir", str(state), "--watch", str(tmp_path / "root"),
                                             "--poll-interval", "0.1"])
    try:
        wait_for(lambda: metric(httpx.get(url + "/metrics", timeout=5).text, names.STEPS_TOTAL, experiment="exp") == 3,
                 20, 0.2, what="a clean start ingesting the watched file")
        text = httpx.get(url + "/metrics", timeout=5).text
        assert metric(text, names.INGEST_ERRORS, source="state", reason="corrupt_state") == 1
        assert (state / "exporter-state.corrupt").read_bytes() == content
        lines = [x for x in log.read_text().splitlines() if "exporter-state" in x]
        assert len(lines) == 1 and "moved to" in lines[0], lines
    finally:
        proc.terminate()
        proc.wait(10)
