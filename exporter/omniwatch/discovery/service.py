"""The discovery loop: one thread, bounded work per round, an immutable snapshot for readers.

HTTP handlers and the collector only read ``Discovery.snapshot`` (swapped atomically), so a slow
Ray, a hung file system or a dead cluster can never hang a scrape of the exporter. The Ray side
runs in a child process (see ``probe.py``); this module manages it with timeouts and backoff.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .. import backoff, proc
from ..periodic import Periodic
from ..settings import env as settings_env
from .config import DiscoveryConfig
from .targets import KINDS, Target, dedupe, read_ray_sd_file, read_rollout_prometheus_file

log = logging.getLogger("omniwatch.discovery")
SD_FILE_NAME = "prom_metrics_service_discovery.json"
HINT_RECHECK_S = 2.0   # how often a machine without a Ray cluster is looked at again (local_cluster_hint)


@dataclass(frozen=True)
class Snapshot:
    targets: tuple[Target, ...] = ()
    status: dict = field(default_factory=dict)  # source -> {"up": bool|None, "why": str}
    project: str | None = None
    experiment: str | None = None
    ts: float = 0.0

    def counts(self) -> dict[str, int]:
        return {k: sum(1 for t in self.targets if t.kind == k) for k in KINDS}


def local_cluster_hint(address: str, env=None, proc_root: str = "/proc") -> str | None:
    """Where a probe could find the Ray cluster at ``address``; None when it cannot find one, so no probe is spawned
    (a probe is a Python process importing ray: ~1.5 s of a core, every backoff step, on a machine without Ray).

    Ray resolves "auto" (ray/_private/services.py ``get_ray_address_from_environment``) from ``RAY_ADDRESS``, then
    the ``ray_current_cluster`` file of its temp dir (ray/_common/utils.py ``get_ray_address_file``: ``$RAY_TMPDIR``,
    else ``$TMPDIR``, else ``/tmp``, + ``/ray``), then the ``--gcs-address`` of any raylet process on the machine
    (``_find_address_from_flag``). A raylet whose GCS is on loopback inside another network namespace is not
    reachable from here (``unshare -n``, a container sharing the PID namespace): not a hint."""
    get = settings_env if env is None else env.get
    if address != "auto":
        return f"address {address}"
    if get("RAY_ADDRESS"):
        return "RAY_ADDRESS"
    tmp = get("RAY_TMPDIR") or get("TMPDIR") or "/tmp"
    current = os.path.join(tmp, "ray", "ray_current_cluster")
    if os.path.exists(current):
        return current
    try:
        mine = os.stat(os.path.join(proc_root, "self", "ns", "net")).st_ino
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return "no /proc to look in"   # cannot tell: probe, as before
    for pid in pids:
        try:
            with open(os.path.join(proc_root, pid, "cmdline"), "rb") as f:
                argv = f.read(1 << 16).split(b"\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != b"raylet":
            continue
        gcs = next((t.split(b"=", 1)[1] for a in argv for t in a.split(b" ") if t.startswith(b"--gcs-address=")), b"")
        if not gcs:
            continue
        if not gcs.startswith((b"127.", b"localhost", b"[::1]")):
            return f"raylet {pid}"
        try:
            if os.stat(os.path.join(proc_root, pid, "ns", "net")).st_ino == mine:
                return f"raylet {pid}"
        except OSError:
            continue
    return None


class RayProbe:
    """Owns the probe child: start, read its JSON lines, restart with backoff when it dies or
    goes quiet. ``state()`` never blocks."""

    def __init__(self, cfg: DiscoveryConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.latest: dict | None = None
        self.hello: dict | None = None
        self.last_line = 0.0
        self.started = 0.0
        self.error: str | None = None
        self.failures = 0
        self.next_start = 0.0

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "omniwatch.discovery.probe", "--address", self.cfg.ray_address,
               "--interval", str(self.cfg.interval), "--timeout", str(self.cfg.timeout)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self.started = self.last_line = time.monotonic()
        self.latest = self.hello = None
        threading.Thread(target=self._read, args=(self.proc,), name="omniwatch-ray-probe-reader", daemon=True).start()

    def _read(self, child: subprocess.Popen) -> None:
        for line in child.stdout:  # type: ignore[union-attr]
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            with self.lock:
                if child is not self.proc:
                    return
                self.last_line = time.monotonic()
                if msg.get("hello"):
                    self.hello = msg
                elif msg.get("ok"):
                    self.latest, self.error, self.failures = msg, None, 0
                else:
                    self.error = str(msg.get("error") or "Ray probe failed")

    def _fail(self, why: str) -> None:
        self.error = why
        self.latest = None
        self.failures += 1
        self.next_start = time.monotonic() + backoff.delay(self.failures, 2.0, 60.0)
        self._kill()

    def _kill(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            if p.stdin:
                p.stdin.close()
        except OSError:
            pass
        proc.stop(p, 5)

    def tick(self) -> None:
        """Called once per discovery round from the discovery thread."""
        now = time.monotonic()
        with self.lock:
            if self.proc is None:
                if now >= self.next_start:
                    if local_cluster_hint(self.cfg.ray_address) is None:
                        # nothing to attach to: said, and looked at again soon (a /proc scan, no probe): a cluster
                        # started after the exporter is attached within HINT_RECHECK_S + a probe's connect
                        self.error = (f"no Ray cluster on this machine at {self.cfg.ray_address!r} (no RAY_ADDRESS, "
                                      "no ray_current_cluster file, no raylet process in this network namespace)")
                        self.latest = None
                        self.next_start = now + HINT_RECHECK_S
                    else:
                        self._spawn()
                return
            rc = self.proc.poll()
            quiet = now - self.last_line
            if rc is not None:
                self._fail(self.error or f"Ray probe exited with status {rc}")
            elif self.hello is None and quiet > self.cfg.connect_timeout:
                self._fail(f"no Ray cluster answered at {self.cfg.ray_address!r} within {self.cfg.connect_timeout:.0f} s")
            elif self.hello is not None and quiet > 3 * self.cfg.interval + 4 * self.cfg.timeout + 5:
                self._fail(f"Ray probe stopped answering for {quiet:.0f} s (cluster gone or hung)")

    def state(self) -> tuple[bool | None, str, dict | None, dict | None]:
        """(up, why, latest round, hello); up None = still connecting."""
        with self.lock:
            if self.latest is not None:
                return True, f"attached to Ray {self.hello.get('gcs') if self.hello else ''}".strip(), self.latest, self.hello
            if self.error:
                return False, self.error, None, None
            return None, f"connecting to Ray at {self.cfg.ray_address!r}", None, self.hello

    def stop(self) -> None:
        with self.lock:
            self._kill()


class Discovery(Periodic):
    """Periodic discovery of TQ, rollout, reward and Ray targets; feeds ``store`` source_up. A failed round is
    logged and the next runs on schedule (periodic.py): discovery keeps running whatever one round hits."""
    thread_name, what, join_timeout = "omniwatch-discovery", "discovery round", 10.0

    def __init__(self, cfg: DiscoveryConfig, store=None):
        super().__init__(cfg.interval)
        self.cfg = cfg
        self.store = store
        self.snapshot = Snapshot()
        self._said: dict[str, str] = {}
        self.probe: RayProbe | None = None
        self.ray_off_reason: str | None = None
        if cfg.ray_address is None:
            self.ray_off_reason = "Ray discovery disabled (--ray-address off)"
        elif importlib.util.find_spec("ray") is None:
            self.ray_off_reason = "ray is not installed (pip install 'omniwatch[ray]'); Ray/TransferQueue discovery is off"
        else:
            self.probe = RayProbe(cfg)
        for bad in cfg.rejected:
            log.warning("ignoring server address %r: not host:port", bad)

    # -- lifecycle ---------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        if self.probe:
            self.probe.stop()
        super().stop()

    def scan_once(self) -> None:
        self.round()

    def next_wait(self, scan_cpu_s: float) -> float:
        connecting = self.probe is not None and self.snapshot.status.get("ray", {}).get("up") is None
        return min(1.0, self.cfg.interval) if connecting else self.cfg.interval

    # -- one round ---------------------------------------------------------------------------------
    def _say(self, source: str, up: bool | None, why: str) -> None:
        """One log line per change of a source's state, not one per round."""
        key = f"{up}:{why}"
        if self._said.get(source) == key:
            return
        self._said[source] = key
        if up is False and source == "ray":
            log.warning("Ray discovery is off: %s (retrying with backoff; every other source keeps working)", why)
        else:
            (log.warning if up is False else log.info)("discovery %s: %s", source, why)

    def _run_labels(self) -> tuple[str | None, str | None]:
        if self.cfg.project or self.cfg.experiment:
            return self.cfg.project, self.cfg.experiment
        if self.store is not None:
            with self.store.lock:
                runs = list(self.store.runs)
            if len(runs) == 1:
                return runs[0]
        return None, None

    def round(self) -> Snapshot:
        cfg, targets, status = self.cfg, [], {}
        ray_up, ray_why, rnd, hello = False, self.ray_off_reason or "", None, None
        if self.probe:
            self.probe.tick()
            ray_up, ray_why, rnd, hello = self.probe.state()
        if cfg.ray_address is not None:
            status["ray"] = {"up": ray_up, "why": ray_why}

        # TransferQueue (through Ray only)
        if rnd:
            tq = rnd.get("tq", {})
            if tq.get("state") == "ok":
                targets.append(Target("tq", tq["endpoint"], "tq-controller", role="controller"))
                units = [u for u in rnd.get("storage", []) if u.get("endpoint")]
                for u in units:
                    targets.append(Target("tq", u["endpoint"], "tq-storage", role="storage", replica=str(u["unit"]),
                                          storage_unit_id=u.get("storage_unit_id", "")))
                status["transferqueue"] = {"up": True, "why": f"controller metrics at {tq['endpoint']}, "
                                                              f"{len(units)} storage unit endpoint(s)"}
            else:
                status["transferqueue"] = {"up": False, "why": tq.get("detail", "unknown")}
        elif cfg.ray_address is not None:
            status["transferqueue"] = {"up": False, "why": "Ray not attached: " + (ray_why or "unknown")}

        # rollout and reward servers: Ray actors first (they name the replica), then verl's file, then flags
        actors = [s for s in (rnd or {}).get("servers", []) if s.get("address")]
        for s in actors:
            targets.append(Target(s["role"], s["address"], "ray-actor", role=s["role"], replica=s["replica"]))
        file_addrs, file_why = read_rollout_prometheus_file(cfg.rollout_prometheus_file)
        for i, a in enumerate(file_addrs or []):
            targets.append(Target("rollout", a, "rollout-file", role="rollout", replica=str(i)))
        for kind, addrs in (("rollout", cfg.rollout), ("reward", cfg.reward)):
            for i, a in enumerate(addrs):
                targets.append(Target(kind, a, "flag", role=kind, replica=str(i)))
        broken = [f"{s['name']}: {s['error']}" for s in (rnd or {}).get("servers", []) if s.get("error")]
        for kind in ("rollout", "reward"):
            n = sum(1 for t in targets if t.kind == kind)
            why = f"{n} server(s)" if n else "none found"
            if kind == "rollout":
                why += f"; {file_why}"
            status[kind] = {"up": None, "why": why + ("; " + "; ".join(broken) if broken else "")}

        # Ray's own metrics agents
        for node in (rnd or {}).get("nodes", []):
            targets.append(Target("ray", node["address"], "ray-nodes"))
        sd_files = [cfg.ray_sd_file] if cfg.ray_sd_file else []
        if hello and hello.get("temp_dir"):
            sd_files.append(os.path.join(hello["temp_dir"], SD_FILE_NAME))
        sd_why = []
        for path in dict.fromkeys(sd_files):
            addrs, why = read_ray_sd_file(path)
            sd_why.append(why)
            for a in addrs or []:
                targets.append(Target("ray", a, "ray-sd-file"))
        status["ray_metrics"] = {"up": None, "why": "; ".join(sd_why) or "no SD file configured"}

        targets = dedupe(targets)
        project, experiment = self._run_labels()
        snap = Snapshot(tuple(targets), status, project, experiment, time.time())
        self.snapshot = snap
        self._publish(snap)
        return snap

    def _publish(self, snap: Snapshot) -> None:
        for source in ("ray", "transferqueue"):
            st = snap.status.get(source)
            if st is None:
                continue
            if not (source == "transferqueue" and snap.status.get("ray", {}).get("up") is None):
                self._say(source, st["up"], st["why"])  # (nothing to say about TQ while Ray connects)
            if self.store is not None:
                # Down means "it was there and is gone" (or an explicitly named cluster does not answer).
                # A legacy run has no TransferQueue and many hosts have no Ray: absent is not down, or
                # OmniwatchSourceDown would fire forever on every such setup.
                target = (self.cfg.ray_address or "off") if source == "ray" else "controller"
                seen = getattr(self, "_ever_up", None)
                if seen is None:
                    seen = self._ever_up = set()
                if st["up"]:
                    seen.add(source)
                explicit = source == "ray" and self.cfg.ray_address not in (None, "auto")
                if st["up"] or source in seen or explicit:
                    self.store.set_source_up(source, target, bool(st["up"]))
                else:
                    self.store.remove_source(source, target)

    def max_num_seqs_series(self, snap: Snapshot | None = None) -> list[tuple[list[str], int]]:
        snap = snap or self.snapshot
        out = []
        for t in snap.targets:
            v = self.cfg.max_num_seqs.get(t.role) if t.kind in ("rollout", "reward") else None
            if v:
                out.append(([snap.project or "", snap.experiment or "", t.role, t.replica], v))
        return out
