"""promtool and a throw-away Prometheus over backfilled blocks.

``TempPrometheus`` is a real Prometheus bound to 127.0.0.1 on a free port, with no scrape targets,
whose ``--storage.tsdb.path`` is the backfilled data directory: the PromQL engine that evaluates the
rules live is the one that evaluates them over the past. It is always stopped (terminate, then kill)
when the ``with`` block ends, error or Ctrl-C included.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .. import proc
from ..proc import free_port
from ..promapi import MAX_POINTS, PromAPI
from ..settings import tool

log = logging.getLogger(__name__)

RETENTION = "100y"  # old blocks must not be deleted: retention counts back from the newest block
MAX_BLOCK_DURATION = "87600h"  # one block for a whole run: promtool re-reads the input per block
READY_TIMEOUT = 60.0


class ToolError(RuntimeError):
    """A promtool/prometheus binary is missing or failed; the message says which and why."""


def binary(name: str) -> str:
    """``name`` on PATH, or the path in ``OMNIWATCH_<NAME>`` (settings.tool: one way everywhere)."""
    path = tool(name)
    if not path:
        raise ToolError(f"{name} not found: install Prometheus ({name} on PATH) or set OMNIWATCH_{name.upper()}")
    return path


def promtool() -> str:
    return binary("promtool")


def prometheus_bin() -> str:
    return binary("prometheus")


def _run(cmd: list[str], what: str, timeout: float = 1800) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolError(f"{what} took longer than {timeout:.0f} s") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        raise ToolError(f"{what} failed (exit {p.returncode}): " + " | ".join(tail))
    return p.stdout


def create_blocks_from_openmetrics(om_file: str, data_dir: str) -> None:
    os.makedirs(data_dir, exist_ok=True)
    _run([promtool(), "tsdb", "create-blocks-from", "openmetrics", "--quiet",
          f"--max-block-duration={MAX_BLOCK_DURATION}", om_file, data_dir],
         "promtool tsdb create-blocks-from openmetrics")


def create_blocks_from_rules(rule_file: str, url: str, start: float, end: float, eval_interval: float,
                             data_dir: str) -> None:
    # Fewer, larger blocks (promtool queries once per block) while each query stays under
    # Prometheus' 11,000 points per series.
    block_hours = max(2, int(MAX_POINTS * eval_interval // 3600))
    _run([promtool(), "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={url}",
          f"--max-block-duration={block_hours}h",
          f"--start={int(start)}", f"--end={int(end) + 1}", f"--eval-interval={int(eval_interval * 1000)}ms",
          f"--output-dir={data_dir}", rule_file], "promtool tsdb create-blocks-from rules")


class TempPrometheus(PromAPI):
    """``with TempPrometheus(data_dir) as prom: prom.query_range(...)``: a Prometheus process of its own
    over ``data_dir`` (the backfilled blocks), queried through the one API client once it is ready."""

    def __init__(self, data_dir: str, lookback: str = "5m"):
        self.data_dir = data_dir
        self.lookback = lookback
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._tmp: str | None = None
        self._client = None

    def start(self) -> "TempPrometheus":
        self._tmp = tempfile.mkdtemp(prefix="omniwatch-prom-")
        cfg = Path(self._tmp) / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs: []\n")
        last_err = ""
        for _ in range(3):  # a free port can be taken between bind(0) and Prometheus' own bind
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            logf = open(Path(self._tmp) / "prometheus.log", "wb")
            self.proc = subprocess.Popen(
                [prometheus_bin(), f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--storage.tsdb.path={self.data_dir}", f"--storage.tsdb.retention.time={RETENTION}",
                 f"--query.lookback-delta={self.lookback}",
                 "--web.enable-lifecycle"],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            logf.close()
            PromAPI.__init__(self, self.url, timeout=120)
            if self._wait_ready():
                return self
            last_err = self._log_tail()
            self._stop_proc()
        raise ToolError(f"temporary Prometheus did not become ready: {last_err}")

    def _log_tail(self) -> str:
        try:
            return " | ".join((Path(self._tmp) / "prometheus.log").read_text().strip().splitlines()[-3:])
        except OSError:
            return ""

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.ready():
                return True
            time.sleep(0.1)
        return False

    def _stop_proc(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is None:
            return
        proc.stop(self.proc, 15)
        self.proc = None

    def stop(self) -> None:
        try:
            self._stop_proc()
        finally:
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def __enter__(self) -> "TempPrometheus":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
