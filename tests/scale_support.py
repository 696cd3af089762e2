"""Helpers for the scale/agents tests: a real Prometheus process on loopback (any mode, any flags),
bounded polling, and the repository's rule files with their ``for:`` holds shortened for a fast
test (expressions, labels and annotations unchanged: the rules are read from alerts/, not copied).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import httpx
import yaml

from omniwatch import proc
from omniwatch.proc import free_port, poll
from omniwatch.promapi import PromAPI
from omniwatch.rules import rule_files
from omniwatch.yamlio import load as yaml_load

http = httpx.Client(timeout=5, trust_env=False)
__all__ = ["Prometheus", "cpu_seconds", "fast_rule_files", "free_port", "http", "poll"]


def fast_rule_files(dst: Path, hold: str = "1s") -> list[Path]:
    """alerts/*.rules.yml with every ``for:`` set to ``hold`` (so a 2m hold does not make a test 2 min)."""
    out = []
    for src in rule_files():
        doc = yaml_load(src.read_text())
        for g in doc.get("groups") or []:
            for r in g.get("rules") or []:
                if "for" in r:
                    r["for"] = hold
        p = Path(dst) / src.name
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(p)
    return out


class Prometheus:
    """One real Prometheus on 127.0.0.1:<free port>; ``stop()`` kills exactly the process it started."""

    def __init__(self, config: dict, workdir: Path | None = None, args: tuple[str, ...] = (), binary: str = "prometheus"):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="owprom-")
        self.dir = Path(workdir or self._tmp.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.addr}"
        self.config_path = self.dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.dir / "prometheus.log"
        data = "--storage.agent.path" if "--enable-feature=agent" in args else "--storage.tsdb.path"
        self.cmd = [binary, f"--config.file={self.config_path}", f"{data}={self.dir / 'data'}",
                    f"--web.listen-address={self.addr}", "--log.level=warn", *args]
        self.proc: subprocess.Popen | None = None
        self.api = PromAPI(self.url, timeout=10)

    def start(self, timeout: float = 60) -> "Prometheus":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True)
        ok = poll(lambda: self.proc.poll() is None and http.get(f"{self.url}/-/ready").status_code == 200, timeout, 0.2)
        if not ok:
            tail = self.log_path.read_text()[-2000:]
            self.stop()
            raise RuntimeError(f"prometheus did not become ready: {tail}")
        return self

    def query(self, q: str) -> list[dict]:
        return self.api.query(q)

    def alerts(self, name: str | None = None, state: str | None = None) -> list[dict]:
        return [a for a in self.api.get("/api/v1/alerts")["alerts"]
                if (name is None or a["labels"].get("alertname") == name) and (state is None or a["state"] == state)]

    def metric(self, name: str) -> float | None:
        """A value of Prometheus' own metric (first sample), read from its /metrics."""
        for ln in http.get(f"{self.url}/metrics").text.splitlines():
            if ln.startswith(name + " ") or ln.startswith(name + "{"):
                return float(ln.rsplit(" ", 1)[1])
        return None

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            proc.stop(p, 15)
        if getattr(self, "_log", None):
            self._log.close()
        self.api.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
