"""``omniwatch up | down | status``: the native stack — Prometheus, Alertmanager and the exporter
(and Grafana when a binary is on PATH) as local processes with generated configs, data, logs and pid
files in one run directory, bound to 127.0.0.1, stopped exactly by what their pid files name.

Docker compose is the Makefile's choice when an engine answers; this module never needs Docker.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from . import cliargs
from . import extras, headnode, names, notify, paths, ports, proc, upkeep, watching
from .config import runbook_rewrite
from .rules import alertmanager_config_path, rule_files
from .settings import (DEFAULT_ALERTMANAGER_PORT, DEFAULT_EXPORTER_PORT, DEFAULT_GRAFANA_PORT, DEFAULT_HOST,
                       DEFAULT_PROMETHEUS_PORT, DEFAULT_RUN_DIR, Settings, env, process_env, tool)
from .discovery import scrape_configs

log = logging.getLogger(__name__)

DEMO_SUBDIR = "demo"  # `omniwatch demo` keeps its own stack (configs, TSDB, state, logs) in <run dir>/demo
INSTALL_HINT = ("install it: `sudo apt-get install -y prometheus prometheus-alertmanager` (Debian/Ubuntu), "
                "or put the official release binaries on PATH")

# Evaluation profiles. "fast" is for the demo and tests: 1 s scrape/eval, Alertmanager sends at once.
PROFILES = {
    "default": {"scrape_interval": "15s", "evaluation_interval": "15s",
                "group_wait": None, "group_interval": None, "repeat_interval": None},
    "fast": {"scrape_interval": "1s", "evaluation_interval": "1s",
             "group_wait": "1s", "group_interval": "2s", "repeat_interval": "5m"},
}


class StackError(RuntimeError):
    pass


# component -> (StackConfig port field, its flag, its environment variable): what a conflict message names
PORT_OF = {"exporter": ("exporter_port", "--exporter-port", "OMNIWATCH_EXPORTER_PORT"),
           "prometheus": ("prometheus_port", "--prometheus-port", "OMNIWATCH_PROMETHEUS_PORT"),
           "alertmanager": ("alertmanager_port", "--alertmanager-port", "OMNIWATCH_ALERTMANAGER_PORT"),
           "grafana": ("grafana_port", "--grafana-port", "OMNIWATCH_GRAFANA_PORT")}


def find_binary(*names: str) -> str | None:
    """One way to find a binary: ``OMNIWATCH_<NAME>`` or PATH (settings.tool)."""
    return tool(*names)


@dataclass
class StackConfig:
    run_dir: Path = Path(DEFAULT_RUN_DIR)
    host: str = DEFAULT_HOST
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    alertmanager_port: int = DEFAULT_ALERTMANAGER_PORT
    exporter_port: int = DEFAULT_EXPORTER_PORT
    grafana_port: int = DEFAULT_GRAFANA_PORT
    profile: str = "default"
    watch: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    exporter_args: list[str] = field(default_factory=list)   # extra `omniwatch serve` flags
    exporter_env: dict = field(default_factory=dict)         # extra environment (relay config, ...)
    extra_scrape_configs: list[dict] = field(default_factory=list)
    retention: str = "30d"
    exporter_bind: str | None = None  # the exporter's listen address when not `host` (a cluster's head node)

    @property
    def exporter_host(self) -> str:
        """Where Prometheus, Alertmanager and `up` reach the exporter: its bind address, or `host` when it
        binds every interface."""
        return self.exporter_bind if self.exporter_bind and self.exporter_bind not in ("0.0.0.0", "::") \
            else self.host

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.host}:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{self.host}:{self.alertmanager_port}"

    @property
    def exporter_url(self) -> str:
        return f"http://{self.exporter_host}:{self.exporter_port}"

    @property
    def grafana_url(self) -> str:
        return f"http://{self.host}:{self.grafana_port}"


class Stack:
    COMPONENTS = ("exporter", "alertmanager", "prometheus", "grafana")

    def __init__(self, cfg: StackConfig):
        self.cfg = cfg
        self.run_dir = cfg.run_dir.resolve()
        self.restarted: list[str] = []  # components the last up() restarted (their configuration changed)

    # -- layout ------------------------------------------------------------------------------------
    def p(self, *parts: str) -> Path:
        return self.run_dir.joinpath(*parts)

    def _secret(self, name: str) -> Path:
        path = self.p("secrets", f"{name}.token")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path.parent, 0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        return path

    # -- configs ------------------------------------------------------------------------------------
    def prometheus_config(self) -> dict:
        prof = PROFILES[self.cfg.profile]
        rules = [str(p) for p in self.rule_paths()]
        scrape = [
            {"job_name": "omniwatch", "static_configs": [{"targets": [f"{self.cfg.exporter_host}:{self.cfg.exporter_port}"]}]},
            {"job_name": "prometheus", "static_configs": [{"targets": [f"{self.cfg.host}:{self.cfg.prometheus_port}"]}]},
            {"job_name": "alertmanager", "static_configs": [{"targets": [f"{self.cfg.host}:{self.cfg.alertmanager_port}"]}]},
        ] + self._discovered_jobs() + list(self.cfg.extra_scrape_configs)
        return {
            "global": {"scrape_interval": prof["scrape_interval"], "evaluation_interval": prof["evaluation_interval"],
                       "scrape_timeout": prof["scrape_interval"] if prof["scrape_interval"] != "15s" else "10s"},
            "rule_files": rules,
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{self.cfg.host}:{self.cfg.alertmanager_port}"]}]}]},
            "scrape_configs": scrape,
        }

    def _runbooks(self) -> tuple[str, str] | None:
        return runbook_rewrite(self.cfg.exporter_bind or self.cfg.host, self.cfg.exporter_port)

    def rule_paths(self) -> list[Path]:
        """The rule files Prometheus loads: alerts/ itself, or -- with the exporter on another port than the one the
        rules' runbook links were generated for -- their copies under ``<run dir>/config/rules/`` with this exporter's
        links (issue 35 item 14: every runbook_url Prometheus, Alertmanager, Grafana and ``omniwatch alerts``
        showed pointed at 127.0.0.1:19095). Written by ``write_configs``."""
        src = rule_files()
        if self._runbooks() is None:
            return src
        return [self.p("config", "rules", f.name) for f in src]

    def _write_rules(self) -> None:
        rw = self._runbooks()
        out = self.p("config", "rules")
        if rw is None:
            shutil.rmtree(out, ignore_errors=True)
            return
        old, new = rw
        out.mkdir(parents=True, exist_ok=True)
        keep = set()
        for f in rule_files():
            text = f.read_text().replace(f"runbook_url: {old}#", f"runbook_url: {new}#")
            (out / f.name).write_text(text)
            keep.add(f.name)
        for f in out.glob("*.rules.yml"):
            if f.name not in keep:
                f.unlink()

    def _discovered_jobs(self) -> list[dict]:
        """Endpoints found by Ray discovery (TransferQueue, vLLM-Omni, reward servers, Ray nodes) come
        through the exporter's HTTP service discovery: no Prometheus restart when they change."""
        exporter = f"{self.cfg.exporter_host}:{self.cfg.exporter_port}"
        # per-node agents (omniwatch agents start) register with the exporter and come through here
        jobs = [{"job_name": "omniwatch-agent", "http_sd_configs": [
            {"url": f"http://{exporter}/api/v1/agents/sd", "refresh_interval": "10s"}]}]
        return jobs + scrape_configs(exporter, refresh_interval="10s")

    def alertmanager_config(self) -> dict:
        src = alertmanager_config_path()
        if not src.is_file():
            raise StackError(f"Alertmanager config {src} is missing")
        cfg = yaml.safe_load(src.read_text())
        token_file = str(self._secret("webhook"))
        found = False
        for rcv in cfg.get("receivers", []):
            if rcv.get("name") == "omniwatch":
                for wh in rcv.get("webhook_configs", []):
                    wh["url"] = f"{self.cfg.exporter_url}/api/v1/alertmanager"
                    wh.setdefault("http_config", {}).setdefault("authorization", {})
                    wh["http_config"]["authorization"] = {"type": "Bearer", "credentials_file": token_file}
                    found = True
        if not found:
            raise StackError(f"{src}: no receiver named 'omniwatch' with a webhook_config")
        prof = PROFILES[self.cfg.profile]
        route = cfg.setdefault("route", {})
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if prof[key]:
                route[key] = prof[key]
                for child in route.get("routes", []) or []:
                    if key in child and key != "repeat_interval":
                        child[key] = prof[key]
        return cfg

    def write_configs(self) -> None:
        for d in ("config", "logs", "pids", "data/prometheus", "data/alertmanager", "state"):
            self.p(d).mkdir(parents=True, exist_ok=True)
        self._write_rules()
        self.p("config", "prometheus.yml").write_text(yaml.safe_dump(self.prometheus_config(), sort_keys=False))
        self.p("config", "alertmanager.yml").write_text(yaml.safe_dump(self.alertmanager_config(), sort_keys=False))
        self.p("stack.json").write_text(json.dumps({k: str(v) if isinstance(v, Path) else v
                                                     for k, v in asdict(self.cfg).items()}, indent=2))

    # -- commands per component ------------------------------------------------------------------------
    def commands(self) -> dict[str, tuple[list[str], dict, str]]:
        """name -> (argv, extra env, readiness URL)."""
        c = self.cfg
        prom = find_binary("prometheus")
        am = find_binary("alertmanager", "prometheus-alertmanager")
        if not prom:
            raise StackError(f"prometheus not found on PATH; {INSTALL_HINT}")
        if not am:
            raise StackError(f"alertmanager (or prometheus-alertmanager) not found on PATH; {INSTALL_HINT}")
        bind = c.exporter_bind or c.host
        exporter = [sys.executable, "-m", "omniwatch", "serve", "--listen",
                    f"{'[' + bind + ']' if ':' in bind else bind}:{c.exporter_port}",
                    "--state-dir", str(self.p("state"))]
        for w in c.watch:
            exporter += ["--watch", os.path.abspath(w)]
        for w in c.console:
            exporter += ["--console", os.path.abspath(w)]
        exporter += c.exporter_args
        env = {"OMNIWATCH_WEBHOOK_TOKEN_FILE": str(self._secret("webhook")),
               "OMNIWATCH_PUSH_TOKEN_FILE": str(self._secret("push")), **c.exporter_env}
        cmds = {
            "exporter": (exporter, env, f"{c.exporter_url}/healthz"),
            "alertmanager": ([am, f"--config.file={self.p('config', 'alertmanager.yml')}",
                              f"--storage.path={self.p('data', 'alertmanager')}",
                              f"--web.listen-address={c.host}:{c.alertmanager_port}",
                              f"--web.external-url={c.alertmanager_url}",
                              "--cluster.listen-address="],  # no gossip port on 0.0.0.0:9094
                             {}, f"{c.alertmanager_url}/-/ready"),
            "prometheus": ([prom, f"--config.file={self.p('config', 'prometheus.yml')}",
                            f"--storage.tsdb.path={self.p('data', 'prometheus')}",
                            f"--storage.tsdb.retention.time={c.retention}",
                            f"--web.listen-address={c.host}:{c.prometheus_port}",
                            f"--web.external-url={c.prometheus_url}"],
                           {}, f"{c.prometheus_url}/-/ready"),
        }
        grafana = self._grafana_command()
        if grafana:
            cmds["grafana"] = grafana
        return cmds

    def _grafana_command(self):
        """Grafana only when a binary is on PATH (Debian has no package); provisioning as in compose."""
        binary = find_binary("grafana", "grafana-server")
        prov = paths.dashboards_dir() / "provisioning"
        if not binary or not prov.is_dir():
            return None
        settings = Settings()
        password = settings.grafana_admin_password.get_secret_value() if settings.grafana_admin_password else None
        if not password:
            log.warning("Grafana found but OMNIWATCH_GRAFANA_ADMIN_PASSWORD is not set: not starting it "
                        "(omniwatch never starts Grafana with a default admin password)")
            return None
        gdir = self.p("grafana")
        (gdir / "provisioning").mkdir(parents=True, exist_ok=True)
        self._render_grafana_provisioning(prov, gdir / "provisioning")
        argv = [binary] + (["server"] if Path(binary).name == "grafana" else []) + [
            f"--homepath={env('GF_PATHS_HOME', '/usr/share/grafana')}"]
        genv = {"GF_SERVER_HTTP_ADDR": self.cfg.host, "GF_SERVER_HTTP_PORT": str(self.cfg.grafana_port),
               "GF_PATHS_DATA": str(gdir / "data"), "GF_PATHS_LOGS": str(self.p("logs")),
               "GF_PATHS_PROVISIONING": str(gdir / "provisioning"),
               "GF_SECURITY_ADMIN_PASSWORD": password,
               "GF_AUTH_ANONYMOUS_ENABLED": "true" if settings.grafana_anonymous else "false",
               "OMNIWATCH_PROMETHEUS_URL": self.cfg.prometheus_url,
               "OMNIWATCH_DASHBOARDS_DIR": str(paths.dashboards_dir())}
        return argv, genv, f"{self.cfg.grafana_url}/api/health"

    def _render_grafana_provisioning(self, src: Path, dst: Path) -> None:
        # The provisioning files use $OMNIWATCH_PROMETHEUS_URL / $OMNIWATCH_DASHBOARDS_DIR, which Grafana
        # interpolates from its environment, so the same files serve compose and the native stack.
        for f in src.rglob("*.yml"):
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)

    # -- process control -------------------------------------------------------------------------------
    def _pidfile(self, name: str) -> Path:
        return self.p("pids", f"{name}.json")

    def _read_pid(self, name: str) -> dict | None:
        try:
            return json.loads(self._pidfile(name).read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(info: dict | None) -> bool:
        """Alive *and* still the process we started (pid reuse): compare the cmdline."""
        if not info:
            return False
        try:
            raw = Path(f"/proc/{info['pid']}/cmdline").read_bytes()
            state = Path(f"/proc/{info['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state == "Z":
            return False
        if not raw:  # just spawned: the kernel shows an empty cmdline until exec completes
            return time.time() - info.get("started", 0) < 10
        return raw.split(b"\0")[0].decode(errors="replace") == info["argv"][0]

    def fingerprint(self, argv: list[str], env: dict) -> str:
        """What a component runs with: its argv, its extra environment and the config files its argv names
        (hashed: the environment may name secrets' files). A running component whose fingerprint differs
        from the one ``up`` would start is restarted."""
        h = hashlib.sha256(json.dumps([argv, sorted(env.items())]).encode())
        files = [a.split("=", 1)[1] for a in argv if a.startswith("--config.file=")]
        files += [v for k, v in env.items() if k == notify.RELAY_CONFIG_ENV]  # the receivers file
        for f in files:
            try:
                h.update(Path(f).read_bytes())
            except OSError:
                pass
        return h.hexdigest()[:16]

    def start(self, name: str, argv: list[str], env: dict) -> int:
        info = self._read_pid(name)
        if self._alive(info):
            return info["pid"]
        for d in ("logs", "pids"):
            self.p(d).mkdir(parents=True, exist_ok=True)
        logf = open(self.p("logs", f"{name}.log"), "ab")
        child = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=process_env(env), cwd=str(self.run_dir), start_new_session=True)
        logf.close()
        self._pidfile(name).write_text(json.dumps({"pid": child.pid, "argv": argv, "started": time.time(),
                                                   "fingerprint": self.fingerprint(argv, env)}))
        return child.pid

    def wait_ready(self, name: str, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self._alive(self._read_pid(name)):
                tail = self.p("logs", f"{name}.log").read_text(errors="replace")[-1500:]
                raise StackError(f"{name} exited during start; last log lines:\n{tail}")
            try:
                r = httpx.get(url, timeout=2.0)
                if r.status_code == 200:
                    self._check_ours(name)
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            time.sleep(0.2)
        raise StackError(f"{name} not ready at {url} after {timeout:.0f}s ({last}); see {self.p('logs', name + '.log')}")

    def _port(self, name: str) -> int:
        return getattr(self.cfg, PORT_OF[name][0])

    def _conflict(self, name: str, port: int) -> StackError:
        _, flag, var = PORT_OF[name]
        return StackError(f"port {port} ({name}) is already in use by {ports.describe_holder(port)}: stop it, or "
                          f"start this stack on another port ({flag} N, env {var})")

    def _check_ours(self, name: str) -> None:
        """The process answering on ``name``'s port is the one this stack started (not another stack's)."""
        info = self._read_pid(name)
        port = self._port(name) if name in PORT_OF else None
        if port is None or not info:
            return
        if ports.owned_by(port, info["pid"]) is False:
            raise self._conflict(name, port)

    def check_ports(self, names=("exporter", "alertmanager", "prometheus")) -> None:
        """Every port this start needs, checked before anything starts (or is wiped): a port that another
        process holds is a StackError naming the port and its holder, and nothing starts."""
        conflicts = [self._conflict(name, self._port(name)) for name in names
                     if name in PORT_OF and not self._alive(self._read_pid(name))
                     and ports.in_use(self.cfg.exporter_bind or self.cfg.host if name == "exporter"
                                      else self.cfg.host, self._port(name))]
        if conflicts:
            raise StackError("\n".join(str(c) for c in conflicts))

    def changed(self, cmds: dict) -> list[str]:
        """Running components whose configuration differs from what ``up`` would start now."""
        out = []
        for name, (argv, env, _) in cmds.items():
            info = self._read_pid(name)
            if self._alive(info) and info.get("fingerprint") != self.fingerprint(argv, env):
                out.append(name)
        return out

    def up(self) -> dict[str, str]:
        self.write_configs()
        cmds = self.commands()
        self.restarted = self.changed(cmds)
        for name in self.restarted:
            self.stop(name)
        self.check_ports(cmds)
        started = {}
        for name in ("exporter", "alertmanager", "prometheus", "grafana"):
            if name not in cmds:
                continue
            argv, env, ready = cmds[name]
            self.start(name, argv, env)
            self.wait_ready(name, ready)
            started[name] = ready.split("/-/")[0].removesuffix("/healthz").removesuffix("/api/health")
        return started

    def stop(self, name: str, timeout: float = 15.0) -> bool:
        info = self._read_pid(name)
        if not info:
            return False
        if self._alive(info):
            proc.stop(info["pid"], timeout, group=True, alive=lambda: self._alive(info))
        self._pidfile(name).unlink(missing_ok=True)
        return True

    def down(self) -> list[str]:
        stopped = []
        for name in ("grafana", "prometheus", "alertmanager", "exporter", "endpoints", "raystate", "receiver"):
            if self.stop(name):
                stopped.append(name)
        return stopped

    def status(self) -> list[dict]:
        out = []
        cfg = self._saved_config()
        urls = {"exporter": f"http://{cfg.host}:{cfg.exporter_port}", "prometheus": cfg.prometheus_url,
                "alertmanager": cfg.alertmanager_url, "grafana": cfg.grafana_url}
        for name in ("exporter", "prometheus", "alertmanager", "grafana", "endpoints", "raystate", "receiver"):
            info = self._read_pid(name)
            if info is None:
                continue
            alive = self._alive(info)
            out.append({"component": name, "pid": info["pid"], "running": alive, "url": urls.get(name, "")})
        return out

    def running(self) -> bool:
        return any(self._alive(self._read_pid(name)) for name in self.COMPONENTS + ("endpoints", "raystate", "receiver"))

    def dashboards_hint(self) -> str:
        """Where the dashboards are when this stack started no Grafana: the one line that gets one."""
        if find_binary("grafana", "grafana-server"):
            return "set OMNIWATCH_GRAFANA_ADMIN_PASSWORD and run omniwatch up again"
        if find_binary("docker") and (env("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
            return "make up (docker compose starts Grafana with them)"
        return f"no Grafana here; import into yours: {_short(paths.dashboards_dir())}/*.json"

    def _saved_config(self) -> StackConfig:
        try:
            raw = json.loads(self.p("stack.json").read_text())
            raw["run_dir"] = Path(raw["run_dir"])
            return StackConfig(**raw)
        except (OSError, ValueError, TypeError):
            return self.cfg


# -- CLI ---------------------------------------------------------------------------------------------
def _cfg_from_args(args) -> StackConfig:
    """down and status: the run dir (they read the pid files and stack.json); up: _kept_cfg."""
    return StackConfig(run_dir=Path(args.run_dir))


def demo_stack(stack: Stack) -> Stack:
    """The demo's stack: same ports, its own run directory under this one."""
    return Stack(StackConfig(**{**asdict(stack.cfg), "run_dir": stack.run_dir / DEMO_SUBDIR}))


def _short(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _row(name: str, value: str) -> str:
    """``name  value`` in 80 columns; a value that would not fit goes whole on the next line (a path is
    never broken in two)."""
    line = f"  {name:<12} {value}"
    return line if len(line) <= 80 else f"  {name}\n    {value}"


def alerts_command(cfg: StackConfig) -> str:
    """The command that lists this stack's alerts (Debian's Alertmanager serves an API but no web page)."""
    return "omniwatch alerts" + ("" if cfg.exporter_port == DEFAULT_EXPORTER_PORT else f" --url {cfg.exporter_url}")


def _print_urls(stack: Stack, started: dict) -> None:
    print("omniwatch stack up" + (f" (restarted with the new configuration: {', '.join(stack.restarted)})"
                                  if stack.restarted else ""))
    print(_row("run dir", _short(stack.run_dir)))
    for name, url in started.items():
        print(_row(name, url))
    for name, value in watching.rows(watching.fetch(stack.cfg.exporter_url) or []) + extras.hints():
        print(_row(name, value))
    for name, value in notify.rows(stack.cfg.exporter_url):
        print(_row(name, value))
        if ("DISABLED" in value and "not in the relay config" not in value) or "unusable" in value:
            # a receiver configured but unusable is never only a line inside a normal banner
            print(f"WARNING: alerts will not reach this receiver: {value}", file=sys.stderr)
    for name, value in headnode.rows(stack.cfg.exporter_bind, stack.cfg.exporter_port,
                                     stack.p("secrets", "push.token")):
        print(_row(name, value))
    if "grafana" not in started:
        print(_row("dashboards", stack.dashboards_hint()))
    print(_row("alerts", alerts_command(stack.cfg)))
    print(_row("push token", _short(stack.p("secrets", "push.token"))))
    print(_row("stop with", "omniwatch down   (or make down)"))


def _kept_cfg(args) -> tuple[StackConfig, dict, list[str], list[str]]:
    """This `up`'s configuration: what it was given on top of what the last `up` of the run dir kept (upkeep.py);
    with the changed lines and the names of the settings kept."""
    run_dir = Path(args.run_dir)
    kept = upkeep.load(run_dir)
    now = upkeep.given(args)
    merged = upkeep.merge(kept, now, reset=getattr(args, "reset", False))
    changed, kept_names = upkeep.changes(kept, merged, now) if kept else ([], [])
    v = lambda key: upkeep.value(merged, key)  # noqa: E731
    cfg = StackConfig(run_dir=run_dir, **{k: v(k) for k in upkeep.PORTS}, profile=v("profile"),
                      watch=v("watch"), console=v("console"),
                      exporter_args=[x for d in v("checkpoint_root") for x in ("--checkpoint-root", d)]
                      + [x for d in v("trainer_config") for x in ("--trainer-config", d)],
                      exporter_bind=v("exporter_bind"))
    notify_cfg = merged.get("notify") or {}
    cfg.exporter_env.update(upkeep.notify_env(run_dir, notify_cfg))
    cfg.exporter_env.update(notify.exporter_env(notify_cfg.get("receivers"), run_dir / "config",
                                                lookup=lambda var: upkeep.kept_value(run_dir, var),
                                                names=notify_cfg.get("env", [])))
    upkeep.save(run_dir, merged)
    return cfg, merged, changed, kept_names


def cmd_up(args) -> int:
    cfg, _, changed, kept_names = _kept_cfg(args)
    stack = Stack(cfg)
    demo = demo_stack(stack)
    if demo.running():
        print("stopping the demo stack first (it uses the same ports): " + ", ".join(demo.down()))
    for line in changed:
        print(_row("changed", line))
    if kept_names:
        print(_row("kept", "from the last up: " + ", ".join(kept_names) + " (--reset forgets)"))
    for line in watching.warnings(stack.cfg.watch, stack.cfg.console):
        print(line, file=sys.stderr)
    try:
        started = stack.up()
    except StackError as e:
        print(f"omniwatch up: {e}", file=sys.stderr)
        return 1
    _print_urls(stack, started)
    return 0


def cmd_down(args) -> int:
    stack = Stack(_cfg_from_args(args))
    stopped = stack.down() + [f"{name} (demo)" for name in demo_stack(stack).down()]
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def stale_runs(exporter_url: str) -> int | None:
    """``omniwatch_stale_runs`` from the exporter's /metrics (None when it does not answer)."""
    try:
        r = httpx.get(exporter_url.rstrip("/") + "/metrics", timeout=2.0)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    for line in r.text.splitlines():
        if line.startswith(names.STALE_RUNS + " "):
            try:
                return int(float(line.split()[1]))
            except (IndexError, ValueError):
                return None
    return None


def cmd_status(args) -> int:
    stack = Stack(_cfg_from_args(args))
    rows = [(r, "") for r in stack.status()] + [(r, " (demo)") for r in demo_stack(stack).status()]
    if not rows:
        print(f"nothing runs from {stack.run_dir}")
        for name, value in extras.hints():
            print(_row(name, value))
        return 3
    for r, tag in rows:
        state = "running" if r["running"] else "DEAD   "
        print(_row(r["component"] + tag, f"{state} pid {r['pid']:<8} {r['url']}".rstrip()))
    exporter = [r for r, tag in rows if r["component"] == "exporter" and r["running"] and not tag]
    if exporter:
        sources = watching.fetch(exporter[0]["url"])
        for name, value in watching.rows(sources or []):
            print(_row(name, value))
        if sources == []:
            print(_row("watching", "nothing (push only): omniwatch up --watch <VERL_FILE_LOGGER_ROOT>"))
        for name, value in notify.rows(exporter[0]["url"]):
            print(_row(name, value))
    for name, value in extras.hints():
        print(_row(name, value))
    if not any(r["component"] == "grafana" and r["running"] for r, _ in rows):
        print(_row("dashboards", stack.dashboards_hint()))
    for r, tag in rows:  # history, not news: runs first seen long after their last line (issue 22)
        if r["component"] == "exporter" and r["running"] and (stale := stale_runs(r["url"])) is not None:
            print(_row("stale runs" + tag, f"{stale} (first seen as history: reported at info, never escalated)"))
    return 0 if all(r["running"] for r, _ in rows) else 1


def add_stack_args(p, ports: bool = True, keep: bool = False) -> None:
    """Stack flags; their defaults are the settings (OMNIWATCH_RUN_DIR, OMNIWATCH_*_PORT, a settings file).
    ``keep`` (`up`): a port not given is None, and `up` takes the last `up`'s (upkeep.py)."""
    s = Settings()
    p.add_argument("--run-dir", default=s.run_dir,
                   help="configs, data, logs and pid files (default %(default)s, env OMNIWATCH_RUN_DIR)")
    if not ports:
        return
    last = "the last up's, else " if keep else ""
    p.add_argument("--prometheus-port", type=cliargs.port, default=None if keep else s.prometheus_port,
                   help=f"(default {last}{s.prometheus_port}; env OMNIWATCH_PROMETHEUS_PORT)")
    p.add_argument("--alertmanager-port", type=cliargs.port, default=None if keep else s.alertmanager_port,
                   help=f"(default {last}{s.alertmanager_port}; env OMNIWATCH_ALERTMANAGER_PORT)")
    p.add_argument("--exporter-port", type=cliargs.port, default=None if keep else s.port,
                   help=f"(default {last}{s.port}; env OMNIWATCH_EXPORTER_PORT)")
    p.add_argument("--grafana-port", type=cliargs.port, default=None if keep else s.grafana_port,
                   help=f"(default {last}{s.grafana_port}; env OMNIWATCH_GRAFANA_PORT)")


def add_commands(sub) -> None:
    p = sub.add_parser("up", help="start Prometheus, Alertmanager and the exporter as local processes",
                       description="Run again, `up` keeps every setting the last `up` of the run dir was given "
                                   "(ports, paths, receivers, Slack) except those given again, and prints what "
                                   "changed; --reset starts from this command's settings alone.")
    add_stack_args(p, keep=True)
    p.add_argument("--reset", action="store_true",
                   help="forget the settings the last `up` kept (<run dir>/up.json): only these flags apply")
    p.add_argument("--profile", choices=sorted(PROFILES), default=None,
                   help="intervals: default (15 s scrape/eval) or fast (1 s, for demos and tests)")
    p.add_argument("--watch", action="append", default=[], metavar="PATH", help="passed to `omniwatch serve --watch`")
    p.add_argument("--console", action="append", default=[], metavar="PATH", help="passed to `omniwatch serve --console`")
    p.add_argument("--checkpoint-root", action="append", default=[], metavar="DIR",
                   help="passed to `omniwatch serve --checkpoint-root` (where trainers save checkpoints)")
    p.add_argument("--trainer-config", action="append", default=[], metavar="FILE|GLOB|DIR",
                   help="passed to `omniwatch serve --trainer-config` (the runs' resolved trainer configs)")
    p.add_argument("--exporter-bind", metavar="ADDR", default=None, type=headnode.bind_address,
                   help="the head node of a cluster: the exporter listens on ADDR (0.0.0.0, or the head's "
                        "cluster IP) so node agents on other hosts register (with the push token); Prometheus "
                        "and Alertmanager stay on 127.0.0.1. Default: 127.0.0.1 like the rest")
    p.add_argument("--receivers", metavar="FILE", default=None,
                   help="relay receivers file (Slack / Feishu / webhook, docs/relay.md); without it, "
                        "OMNIWATCH_SLACK_URL / OMNIWATCH_FEISHU_URL / OMNIWATCH_NOTIFY_WEBHOOK_URL set one up "
                        "(make up SLACK_URL=...)")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop what `omniwatch up` started (from its pid files)")
    add_stack_args(p, ports=False)
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("status", help="what runs, what is watched, and the runs and bad lines per watched path")
    add_stack_args(p, ports=False)
    p.set_defaults(func=cmd_status)
