"""Scrape targets and the files a VeRL-Omni run leaves behind that name them.

Everything here is pure (no Ray, no network): parsing the rollout Prometheus config verl writes
(``update_prometheus_config``, job ``rollout``), Ray's service-discovery file, and ``host:port``
lists given on the command line, and rendering targets as Prometheus HTTP-SD JSON. Bad input is
skipped and counted, never raised, because these files are rewritten under our feet.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from dataclasses import dataclass

import yaml

KINDS = ("tq", "rollout", "reward", "ray")
# Prometheus job label per kind: "rollout" and "ray" are the job names verl and Ray already use in
# the configs they write; "transfer_queue" is the job RL-Insight registers TQ under.
JOB_OF_KIND = {"tq": "transfer_queue", "rollout": "rollout", "reward": "reward", "ray": "ray"}
DEFAULT_ROLLOUT_PROM_FILE = "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml"
DEFAULT_RAY_SD_FILE = "/tmp/ray/prom_metrics_service_discovery.json"
RAY_SD_FRESH_SECONDS = 60.0  # Ray rewrites the SD file every 5 s; older means its cluster is gone
MAX_FILE_BYTES = 1 << 20

_HOSTPORT = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9.\-_]+)):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Target:
    kind: str           # tq | rollout | reward | ray
    address: str        # host:port, as Prometheus wants it
    origin: str         # where it was found (ray-actor, rollout-file, flag, ray-nodes, ray-sd-file, tq-controller)
    role: str = ""
    replica: str = ""
    storage_unit_id: str = ""  # TQ storage units: the id the controller's per-unit gauges carry

    def labels(self, project: str | None, experiment: str | None) -> dict[str, str]:
        out = {"job": JOB_OF_KIND[self.kind], "__metrics_path__": "/metrics"}
        if project:
            out["project"] = project
        if experiment:
            out["experiment"] = experiment
        if self.role:
            out["role"] = self.role
        if self.replica:
            out["replica"] = self.replica
        if self.storage_unit_id:
            out["storage_unit_id"] = self.storage_unit_id
        return out


def normalize_address(addr: object) -> str | None:
    """``host:port`` (IPv6 in brackets) or None when ``addr`` is not one; a scheme or /metrics
    suffix is tolerated because people paste URLs."""
    if not isinstance(addr, str):
        return None
    a = addr.strip()
    for pre in ("http://", "https://"):
        if a.startswith(pre):
            a = a[len(pre):]
    a = a.split("/", 1)[0]
    m = _HOSTPORT.match(a)
    if not m or not (0 < int(m["port"]) < 65536):
        return None
    if m["v6"]:
        try:
            ipaddress.IPv6Address(m["v6"])
        except ValueError:
            return None
    return a


def parse_address_list(text: str | list[str] | None) -> tuple[list[str], list[str]]:
    """``"h:p,h:p"`` (or a list of them) -> (addresses, rejected entries)."""
    if not text:
        return [], []
    items = text if isinstance(text, list) else [text]
    good, bad = [], []
    for item in items:
        for part in str(item).split(","):
            if not part.strip():
                continue
            a = normalize_address(part)
            (good if a else bad).append(a or part.strip())
    return good, bad


def _read_small(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _list(v) -> list:
    """A YAML/JSON value that should be a list; anything else reads as empty."""
    return v if isinstance(v, list) else []


def read_rollout_prometheus_file(path: str, job: str = "rollout") -> tuple[list[str] | None, str]:
    """Targets of ``job`` in the Prometheus config verl writes for its rollout servers.

    Returns (addresses, why): addresses is None when the file is missing or unreadable, [] when it
    has no such job; ``why`` says which."""
    text = _read_small(path)
    if text is None:
        return None, f"{path} does not exist (or is unreadable / over 1 MiB)"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return None, f"{path} is not valid YAML: {str(e).splitlines()[0]}"
    out: list[str] = []
    for sc in _list(doc.get("scrape_configs") if isinstance(doc, dict) else None):
        if not isinstance(sc, dict) or sc.get("job_name") != job:
            continue
        for st in _list(sc.get("static_configs")):
            for t in _list(st.get("targets") if isinstance(st, dict) else None):
                a = normalize_address(t)
                if a and a not in out:
                    out.append(a)
    return out, (f"{len(out)} target(s) in job {job!r} of {path}" if out else f"no job {job!r} targets in {path}")


def read_ray_sd_file(path: str, now: float | None = None) -> tuple[list[str] | None, str]:
    """Targets of Ray's own SD file, if it is fresh (Ray rewrites it every 5 s while alive)."""
    try:
        age = (time.time() if now is None else now) - os.path.getmtime(path)
    except OSError:
        return None, f"{path} does not exist"
    if age > RAY_SD_FRESH_SECONDS:
        return None, f"{path} is {age:.0f} s old (its Ray cluster is gone)"
    text = _read_small(path)
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        doc = None
    if not isinstance(doc, list):
        return None, f"{path} is not a JSON list"
    out: list[str] = []
    for group in doc:
        for t in _list(group.get("targets") if isinstance(group, dict) else None):
            a = normalize_address(t)
            if a and a not in out:
                out.append(a)
    return out, f"{len(out)} target(s) in {path}"


def http_sd(targets: list[Target], project: str | None, experiment: str | None, kind: str | None = None) -> list[dict]:
    """Prometheus HTTP-SD body: one group per target (labels differ per replica)."""
    return [{"targets": [t.address], "labels": t.labels(project, experiment)}
            for t in targets if kind is None or t.kind == kind]


def dedupe(targets: list[Target]) -> list[Target]:
    """First occurrence of each (kind, address) wins, so callers list authoritative origins first."""
    seen, out = set(), []
    for t in targets:
        if (t.kind, t.address) not in seen:
            seen.add((t.kind, t.address))
            out.append(t)
    return out
