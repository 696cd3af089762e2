"""The trainer-side client: exact phase spans for omniwatch's GPU idle attribution.

    import omniwatch.client as ow
    with ow.phase("gen", project="qwen_image", experiment="ocr_lora"):
        batch = rollout(...)

On exit the span (start, end in unix seconds) is queued and a daemon thread POSTs it to
``$OMNIWATCH_URL/api/v1/phases`` (default ``http://127.0.0.1:19095``) with the bearer token from
``$OMNIWATCH_PUSH_TOKEN`` (or ``_FILE``). Nothing here can slow or break training: the queue is bounded
(spans are dropped, and counted in ``dropped``, when the exporter is unreachable), sends time out after
2 s, and errors are logged at debug level only. Sending uses the standard library only. Spans must be timed on the trainer host's clock, like NVML's sample timestamps.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request
from contextlib import contextmanager

log = logging.getLogger(__name__)
DEFAULT_URL = "http://127.0.0.1:19095"
MAX_QUEUE = 1000
BATCH = 100


def _token() -> str | None:
    from .settings import read_secret
    return read_secret("OMNIWATCH_PUSH_TOKEN")


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 2.0):
        from .settings import env
        self.url = (url or env("OMNIWATCH_URL") or DEFAULT_URL).rstrip("/") + "/api/v1/phases"
        self.token = token if token is not None else _token()
        self.timeout = timeout
        self.q: queue.Queue = queue.Queue(MAX_QUEUE)
        self.sent = self.dropped = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def send(self, project: str, experiment: str, phase: str, start: float, end: float, gpus=None) -> None:
        span = {"project": project, "experiment": experiment, "phase": phase, "start": start, "end": end}
        if gpus:
            span["gpus"] = [str(g) for g in gpus]
        try:
            self.q.put_nowait(span)
        except queue.Full:
            self.dropped += 1
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="omniwatch-client", daemon=True)
                self._thread.start()

    @contextmanager
    def phase(self, name: str, *, project: str, experiment: str, gpus=None):
        start = time.time()
        try:
            yield
        finally:
            self.send(project, experiment, name, start, time.time(), gpus)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until queued spans are sent or dropped (for tests and the end of training)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.q.unfinished_tasks == 0:
                return True
            time.sleep(0.02)
        return False

    def _loop(self) -> None:
        while True:
            try:
                first = self.q.get(timeout=5.0)
            except queue.Empty:
                return  # idle: the thread ends; send() starts a new one when needed
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(self.q.get_nowait())
                except queue.Empty:
                    break
            ok = self._post(batch)
            if ok:
                self.sent += len(batch)
            else:
                self.dropped += len(batch)
            for _ in batch:
                self.q.task_done()

    def _post(self, spans: list[dict]) -> bool:
        req = urllib.request.Request(self.url, data=json.dumps({"spans": spans}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return 200 <= r.status < 300
        except Exception as e:  # the exporter being down must never reach the trainer
            log.debug("omniwatch phase push failed: %s", type(e).__name__)
            return False


_default: Client | None = None


def default_client() -> Client:
    global _default
    if _default is None:
        _default = Client()
    return _default


def phase(name: str, *, project: str, experiment: str, gpus=None):
    """``with phase("gen", project=..., experiment=...):`` — times the block and pushes the span."""
    return default_client().phase(name, project=project, experiment=experiment, gpus=gpus)
