"""Fault injection against real processes on loopback: trainer restart and log rotation seen by a live
``omniwatch serve``, a full disk under the state dir, a source that hangs (FIFO), Prometheus and
Alertmanager restarts on the native stack, and the exporter SIGKILLed mid-run.

Every process is started here and stopped in ``finally``; every wait is bounded."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from omniwatch import names
from omniwatch.simulate import Fault, RunSpec, step_dict
from omniwatch.stack import Stack, StackConfig

from .conftest import free_port, require_binary, skip_optional, wait_for

TOKEN = "faults-webhook-token-0123456789"
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


# --- helpers ---------------------------------------------------------------------------------------------
class Serve:
    """``omniwatch serve`` as a subprocess on a fixed loopback port (so a restart keeps its URL)."""

    def __init__(self, tmp: Path, args: list[str], env: dict | None = None):
        self.port = free_port()
        self.args, self.env = args, {**os.environ, **(env or {})}
        self.log = tmp / f"serve-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, preexec=None) -> "Serve":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "omniwatch", "serve", "--listen", f"127.0.0.1:{self.port}",
                 "--poll-interval", "0.1", *self.args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=preexec)
        wait_for(lambda: self.proc.poll() is None and httpx.get(self.url + "/healthz", timeout=1).status_code == 200,
                 30, 0.05, what=f"omniwatch serve ({self.log.read_text(errors='replace')[-500:] if self.log.exists() else ''})")
        return self

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """{(name, sorted label items): value} of one scrape."""
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            m = _SAMPLE.match(line)
            if m:
                labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2))))
                out[(m.group(1), labels)] = float(m.group(3))
        return out

    def value(self, name: str, **labels) -> float | None:
        want = set(labels.items())
        for (n, lv), v in self.metrics().items():
            if n == name and want <= set(lv):
                return v
        return None

    def threads(self) -> int:
        return int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{self.proc.pid}/status").read_text()).group(1))


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def make(args, env=None, preexec=None) -> Serve:
        s = Serve(tmp_path, args, env).start(preexec)
        started.append(s)
        return s
    yield make
    for s in started:
        s.kill(signal.SIGTERM)


def line(spec: RunSpec, step: int) -> bytes:
    return orjson.dumps({"step": step, "data": step_dict(spec, step)}) + b"\n"


def steps_total(s: Serve, experiment: str) -> float | None:
    return s.value(names.STEPS_TOTAL, experiment=experiment)


# --- trainer restart and rotation on the live path ------------------------------------------------------------
@pytest.mark.integration
def test_trainer_restart_truncating_the_jsonl_is_seen_by_a_live_exporter(tmp_path, serve):
    """verl reopens its file with "wb" on resume: steps 1..10, then the file truncated and steps 8..14
    from the checkpoint. 14 distinct steps, 3 re-runs, one restart; nothing counted twice."""
    f = tmp_path / "proj" / "exp.jsonl"
    f.parent.mkdir()
    f.write_bytes(b"")
    spec = RunSpec(seed=3)
    s = serve(["--watch", str(f)])
    with open(f, "ab", buffering=0) as w:
        for st in range(1, 11):
            w.write(line(spec, st))
    wait_for(lambda: steps_total(s, "exp") == 10, 20, what="10 steps")
    with open(f, "wb", buffering=0) as w:  # the resumed trainer truncates and rewrites
        for st in range(8, 15):
            w.write(line(spec, st))
            time.sleep(0.02)
    wait_for(lambda: steps_total(s, "exp") == 14, 20, what="14 distinct steps")
    assert s.value(names.STEPS_REPLAYED_TOTAL, experiment="exp") == 3
    assert s.value(names.TRAINER_RESTARTS_TOTAL, experiment="exp") >= 1
    assert s.value(names.STEP, experiment="exp") == 14
    reward = sum(step_dict(spec, st)["timing_s/reward"] for st in range(1, 15))
    assert s.value(names.STAGE_SECONDS_TOTAL, experiment="exp", phase="reward") == pytest.approx(reward)


@pytest.mark.integration
def test_log_rotation_loses_no_step(tmp_path, serve):
    """logrotate-style: the file is renamed, the writer still appends a last line to the old inode,
    then a new file continues. Every step arrives once."""
    f = tmp_path / "proj" / "rot.jsonl"
    f.parent.mkdir()
    spec = RunSpec(seed=4)
    old = open(f, "ab", buffering=0)
    s = serve(["--watch", str(f)])
    try:
        for st in range(1, 6):
            old.write(line(spec, st))
        wait_for(lambda: steps_total(s, "rot") == 5, 20, what="5 steps")
        os.rename(f, tmp_path / "proj" / "rot.jsonl.1")
        old.write(line(spec, 6))  # written after the rename, before the reopen
    finally:
        old.close()
    with open(f, "ab", buffering=0) as new:
        for st in range(7, 11):
            new.write(line(spec, st))
    wait_for(lambda: steps_total(s, "rot") == 10, 20, what="10 steps after rotation")
    assert s.value(names.STEP, experiment="rot") == 10
    assert s.value(names.INGEST_ERRORS, source="jsonl", reason="duplicate_step") is None


# --- disk full ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def tiny_fs(path: Path, size_kb: int = 256):
    """A size-limited tmpfs at ``path`` (root only); skips when mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        skip_optional(f"cannot mount a tmpfs here ({r.stderr.decode().strip()[:80]})", "run the test as root (CI does)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(1 << 16):  # bounded: 256 MiB at most
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _note(i: int) -> dict:
    return {"version": "4", "groupKey": f"g{i}", "status": "firing", "receiver": "omniwatch",
            "alerts": [{"status": "firing", "labels": {"alertname": "DiskTest", "i": str(i)}, "annotations": {},
                        "startsAt": "2025-01-01T00:00:00Z", "fingerprint": f"fp{i}"}]}


@pytest.mark.integration
def test_disk_full_under_the_state_dir_keeps_serving_and_says_what_failed(tmp_path, serve):
    state = tmp_path / "state"
    with tiny_fs(state, 512):
        f = tmp_path / "proj" / "disk.jsonl"
        f.parent.mkdir()
        f.write_bytes(b"".join(line(RunSpec(seed=5), st) for st in range(1, 4)))
        s = serve(["--state-dir", str(state), "--watch", str(f)], env={"OMNIWATCH_WEBHOOK_TOKEN": TOKEN})
        hdr = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.post(s.url + "/api/v1/alertmanager", json=_note(0), headers=hdr, timeout=10).status_code == 200
        filler = fill(state)
        codes = [httpx.post(s.url + "/api/v1/alertmanager", json=_note(i), headers=hdr, timeout=10).status_code
                 for i in range(1, 40)]
        # Alertmanager retries on 5xx: the notification is refused, not lost silently
        assert 503 in codes, codes
        assert s.value(names.INGEST_ERRORS, source="webhook", reason="store_failed") >= 1
        assert s.proc.poll() is None
        wait_for(lambda: steps_total(s, "disk") == 3, 20, what="steps still ingested with the disk full")
        assert httpx.get(s.url + "/healthz", timeout=5).status_code == 200
        log = s.log.read_text(errors="replace")
        assert "could not store notification" in log and ("full" in log.lower() or "space" in log.lower()), log[-800:]
        filler.unlink()  # space comes back: storing works again without a restart
        wait_for(lambda: httpx.post(s.url + "/api/v1/alertmanager", json=_note(99), headers=hdr,
                                    timeout=10).status_code == 200, 20, what="webhook stores again")


@pytest.mark.integration
def test_state_dir_full_at_start_falls_back_to_memory_and_reports_it(tmp_path, serve):
    state = tmp_path / "state"
    with tiny_fs(state, 64):
        fill(state)
        s = serve(["--state-dir", str(state)], env={"OMNIWATCH_WEBHOOK_TOKEN": TOKEN})
        r = httpx.post(s.url + "/api/v1/alertmanager", json=_note(1), headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code in (200, 503)
        status = httpx.get(s.url + "/api/v1/relay/status", timeout=5).text
        log = s.log.read_text(errors="replace")
        assert ("memory" in status.lower() or "memory" in log.lower()), (status, log[-600:])
        assert httpx.get(s.url + "/metrics", timeout=5).status_code == 200


# --- a source that hangs --------------------------------------------------------------------------------------
@contextlib.contextmanager
def fifo_watched(tmp_path, serve):
    """A FIFO named as a watched file blocks open() until a writer comes (like a stalled NFS read)."""
    fifo = tmp_path / "proj" / "hang.jsonl"
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    good = tmp_path / "proj" / "good.jsonl"
    good.write_bytes(b"")
    s = serve(["--watch", str(fifo), "--watch", str(good)])
    try:
        yield s, good
    finally:
        with contextlib.suppress(OSError):  # release a blocked open() so the process exits cleanly
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.integration
@pytest.mark.long
def test_a_hanging_source_does_not_hang_scrapes_nor_pile_up_threads(tmp_path, serve):
    with fifo_watched(tmp_path, serve) as (s, _good):
        time.sleep(1.0)
        before = s.threads()
        with httpx.Client(base_url=s.url, timeout=10) as c:
            for _ in range(300):
                assert c.get("/metrics").status_code == 200
        after = s.threads()
        assert after <= before + 2, (before, after)


@pytest.mark.integration
def test_a_hanging_file_does_not_stop_the_files_watched_beside_it(tmp_path, serve):
    """Fails while FileTail opens a FIFO/blocking special file in the one thread that polls every file
    of the source (see the report's proposed diff to sources/tail.py)."""
    with fifo_watched(tmp_path, serve) as (s, good):
        with open(good, "ab", buffering=0) as w:
            for st in range(1, 4):
                w.write(line(RunSpec(seed=6), st))
        wait_for(lambda: steps_total(s, "good") == 3, 20,
                 what="steps of a healthy file watched beside a hanging one")
        up = s.value(names.SOURCE_UP, source="jsonl", target=str(tmp_path / "proj" / "hang.jsonl"))
        assert up == 0, "the hanging file should be reported down"


# --- the exporter SIGKILLed mid-run -------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.long
def test_exporter_sigkill_restart_keeps_counters_monotonic(tmp_path, serve):
    """``omniwatch serve --state-dir D --watch F`` is SIGKILLed while a writer appends, then restarted on
    the same state dir. The log is rotated once before the kill (steps 1..40 now live in a file no
    longer watched), so only the persisted state can carry them across the restart. Scraped every
    50 ms throughout: omniwatch_steps_total and omniwatch_stage_seconds_total never go backwards (a
    reset would make Prometheus' increase() count the re-read file twice), and at the end they equal
    the files' truth: no step lost, none twice. Needs the exporter's state persistence (--state-dir
    snapshot of offsets + run model); fails until it lands."""
    state = tmp_path / "state"
    f = tmp_path / "proj" / "kill.jsonl"
    f.parent.mkdir()
    f.write_bytes(b"")
    spec = RunSpec(seed=8, checkpoint_every=7)
    total = 120
    s = serve(["--state-dir", str(state), "--watch", str(f)])
    stop = threading.Event()
    seen: list[tuple[float, float]] = []

    def writer():
        w = open(f, "ab", buffering=0)
        try:
            for st in range(1, total + 1):
                if stop.is_set():
                    return
                if st == 41:  # logrotate: the old file moves away, a new one continues
                    w.close()
                    os.rename(f, f.with_name("kill.jsonl.1"))
                    w = open(f, "ab", buffering=0)
                w.write(line(spec, st))
                time.sleep(0.05)
        finally:
            w.close()

    def scraper():
        while not stop.is_set():
            try:
                st = s.value(names.STEPS_TOTAL, experiment="kill")
                gen = s.value(names.STAGE_SECONDS_TOTAL, experiment="kill", phase="gen")
                if st is not None:
                    seen.append((st, gen or 0.0))
            except httpx.HTTPError:
                pass  # down between kill and restart
            time.sleep(0.05)

    wt = threading.Thread(target=writer, daemon=True)
    sc = threading.Thread(target=scraper, daemon=True)
    wt.start()
    sc.start()
    try:
        wait_for(lambda: (steps_total(s, "kill") or 0) >= 60, 30, 0.05, what="60 steps before the kill")
        s.kill(signal.SIGKILL)
        time.sleep(0.5)
        s.start()  # same port, same state dir
        wt.join(60)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: steps_total(s, "kill") == total, 30, what="every step after the restart")
        time.sleep(0.3)
    finally:
        stop.set()
        sc.join(10)
    assert steps_total(s, "kill") == total, "steps lost across the exporter restart"
    gen_truth = sum(step_dict(spec, st)["timing_s/gen"] for st in range(1, total + 1))
    assert s.value(names.STAGE_SECONDS_TOTAL, experiment="kill", phase="gen") == pytest.approx(gen_truth)
    assert s.value(names.STEPS_REPLAYED_TOTAL, experiment="kill") == 0  # exported for every run
    drops = [(a, b) for a, b in zip(seen, seen[1:]) if b[0] < a[0] or b[1] < a[1] - 1e-6]
    assert not drops, f"counters went backwards across the restart: {drops[:3]} (of {len(seen)} scrapes)"


# --- Prometheus and Alertmanager restarts on the native stack ------------------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("faultstack")
    root = tmp / "logs" / "faults"
    root.mkdir(parents=True)
    spec = RunSpec(pace=250, seed=9, faults=[Fault("reward_slow", 4, factor=5.0)])
    (root / "rb.jsonl").write_bytes(b"".join(line(spec, st) for st in range(1, 13)))
    cfg = StackConfig(run_dir=tmp / "run", prometheus_port=free_port(), alertmanager_port=free_port(),
                      exporter_port=free_port(), grafana_port=free_port(), profile="fast", watch=[str(root.parent)])
    st = Stack(cfg)
    try:
        st.up()
        yield st
    finally:
        st.down()


def _restart(stack: Stack, name: str, before=None) -> None:
    stack.stop(name)
    if before:
        before()
    argv, env, ready = stack.commands()[name]
    stack.start(name, argv, env)
    stack.wait_ready(name, ready)


def _prom(stack: Stack, query: str, at: float | None = None) -> list:
    params = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    r = httpx.get(stack.cfg.prometheus_url + "/api/v1/query", params=params, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.mark.integration
@pytest.mark.long
def test_prometheus_restart_keeps_history(stack):
    q = f'{names.STEPS_TOTAL}{{experiment="rb"}}'
    wait_for(lambda: _prom(stack, q) and float(_prom(stack, q)[0]["value"][1]) == 12, 60, what="steps in Prometheus")
    time.sleep(3)  # a few scrapes past the value, so t_past is well inside recorded history
    t_past = time.time() - 1
    before = _prom(stack, q, at=t_past)
    assert before and float(before[0]["value"][1]) == 12
    _restart(stack, "prometheus")
    after = _prom(stack, q, at=t_past)  # the TSDB (WAL + blocks) on disk survived the restart
    assert after and after[0]["value"] == before[0]["value"]
    span = _prom(stack, f"count_over_time({q}[10m])")
    assert span and float(span[0]["value"][1]) >= 2


def _history(stack: Stack, alertname: str) -> list:
    r = httpx.get(stack.cfg.exporter_url + "/api/v1/alerts", params={"limit": 1000}, timeout=5)
    return [a for a in r.json() if a["labels"].get("alertname") == alertname and a["status"] == "firing"]


def _duplicates(stack: Stack) -> float:
    text = httpx.get(stack.cfg.exporter_url + "/metrics", timeout=5).text
    m = re.search(r'omniwatch_ingest_errors_total\{[^}]*reason="duplicate_notification"[^}]*\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


@pytest.mark.integration
@pytest.mark.long
def test_alertmanager_restart_resends_and_the_relay_deduplicates(stack):
    """Alertmanager restarted with its notification log lost: Prometheus re-sends the firing alert, the
    same notification reaches the webhook again, and the relay stores it once (history unchanged,
    the duplicate counted)."""
    wait_for(lambda: _history(stack, names.ALERT_REWARD_BOUND), 120, 0.5, what="RewardBoundRollout at the webhook")
    time.sleep(3)  # let the first group flush settle
    rows = len(_history(stack, names.ALERT_REWARD_BOUND))
    dup0 = _duplicates(stack)
    nflog = stack.p("data", "alertmanager")
    _restart(stack, "alertmanager", before=lambda: [p.unlink() for p in nflog.glob("nflog*")])
    # Prometheus re-sends active alerts at least every resend delay (1 m); fast profile group_wait 1 s
    wait_for(lambda: _duplicates(stack) > dup0, 150, 1.0, what="the re-sent notification at the relay")
    assert len(_history(stack, names.ALERT_REWARD_BOUND)) == rows
