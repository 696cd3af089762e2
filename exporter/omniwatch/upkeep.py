"""``omniwatch up`` run again keeps what it was given (issue 35 item 12).

Each setting ``up`` takes — the ports, ``--profile``, ``--watch``, ``--console``, ``--checkpoint-root``,
``--trainer-config``, ``--exporter-bind`` and where alerts go (``--receivers FILE``, or the URL variables
``OMNIWATCH_SLACK_URL`` / ``OMNIWATCH_FEISHU_URL`` / ``OMNIWATCH_NOTIFY_WEBHOOK_URL``) — is kept in
``<run dir>/up.json``. A later ``up`` starts from it: a setting given again replaces that setting (``--watch B``
after ``--watch A`` watches B: a typo is fixed by giving the right path), a setting not given is kept, and
``--reset`` starts from what this ``up`` is given alone. ``up`` prints each setting that changed and names the
ones it kept, so nothing is dropped or disabled without a line saying so.

The notify URLs are secrets: ``up.json`` names their variables only; each value ``up`` was given is kept in
``<run dir>/secrets/env/<VAR>`` (0600, in the 0700 secrets directory beside the push and webhook tokens) and
reaches the exporter as ``<VAR>_FILE`` (``settings.read_secret``). A receivers file's ``*_env`` variables are kept
the same way, so a later ``up`` from a shell without them does not leave its receivers disabled."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from .notify import FROM_ENV
from .settings import DEFAULT_ALERTMANAGER_PORT, DEFAULT_EXPORTER_PORT, DEFAULT_GRAFANA_PORT, \
    DEFAULT_PROMETHEUS_PORT, Settings, read_secret

KEPT_FILE = "up.json"
# StackConfig field -> (Settings field, default, the flag)
PORTS = {"exporter_port": ("port", DEFAULT_EXPORTER_PORT, "--exporter-port"),
         "prometheus_port": ("prometheus_port", DEFAULT_PROMETHEUS_PORT, "--prometheus-port"),
         "alertmanager_port": ("alertmanager_port", DEFAULT_ALERTMANAGER_PORT, "--alertmanager-port"),
         "grafana_port": ("grafana_port", DEFAULT_GRAFANA_PORT, "--grafana-port")}
LISTS = {"watch": "--watch", "console": "--console", "checkpoint_root": "--checkpoint-root",
         "trainer_config": "--trainer-config"}
SCALARS = {"profile": ("--profile", "default"), "exporter_bind": ("--exporter-bind", None)}
NOTIFY_VARS = tuple(var for _, _, var in FROM_ENV)
MAX_KEPT_BYTES = 1 << 20


def given(args) -> dict:
    """The settings this ``up`` was given: flags, and the OMNIWATCH_* variables (or settings file) for ports."""
    s = Settings()
    out: dict = {}
    for key, (field, _, _) in PORTS.items():
        v = getattr(args, key, None)
        if v is None and field in s.model_fields_set:
            v = getattr(s, field)
        if v is not None:
            out[key] = int(v)
    for key in LISTS:
        vals = getattr(args, key, None) or []
        if vals:
            out[key] = [os.path.abspath(v) for v in vals]
    for key in SCALARS:
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    if getattr(args, "receivers", None):
        out["notify"] = {"receivers": str(Path(args.receivers).resolve())}
    else:
        urls = {var: v for var in NOTIFY_VARS if (v := read_secret(var))}
        if urls:
            out["notify"] = {"env": sorted(urls)}
    return out


def receivers_vars(path: str) -> list[str]:
    """The variables a receivers file names (``url_env``, ``secret_env``, ``headers_env``); [] when unreadable."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError, ValueError):
        return []
    out = []
    for r in (raw.get("receivers") if isinstance(raw, dict) else None) or []:
        if not isinstance(r, dict):
            continue
        for k in ("url_env", "secret_env"):
            if isinstance(r.get(k), str):
                out.append(r[k])
        if isinstance(r.get("headers_env"), dict):
            out += [v for v in r["headers_env"].values() if isinstance(v, str)]
    return sorted({v for v in out if v.replace("_", "").isalnum()})


def load(run_dir: Path) -> dict:
    """What the last ``up`` of this run dir kept ({} for none, or an unreadable file)."""
    path = run_dir / KEPT_FILE
    try:
        if path.stat().st_size > MAX_KEPT_BYTES:
            return {}
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def merge(kept: dict, now: dict, reset: bool = False) -> dict:
    """Each setting given now replaces the kept one; the rest is kept (nothing with ``reset``)."""
    out = {} if reset else {k: v for k, v in kept.items() if k in (*PORTS, *LISTS, *SCALARS, "notify")}
    out.update(now)
    return out


def _show(key: str, value) -> str:
    if key == "notify":
        if not value:
            return "nowhere (omniwatch alerts only)"
        if value.get("receivers"):
            return f"--receivers {value['receivers']}"
        return ", ".join(value.get("env", []))
    if key in LISTS:
        return " ".join(value) if value else "nothing"
    return str(value)


def _flag(key: str) -> str:
    return PORTS[key][2] if key in PORTS else LISTS.get(key) or (SCALARS[key][0] if key in SCALARS else "notify")


def changes(kept: dict, merged: dict, now: dict) -> tuple[list[str], list[str]]:
    """(what changed, as ``--flag: old -> new`` lines; the settings kept from the last ``up``, by flag)."""
    changed, kept_names = [], []
    for key in (*PORTS, *SCALARS, *LISTS, "notify"):
        old, new = kept.get(key), merged.get(key)
        if old == new:
            if old is not None and key not in now:
                kept_names.append(_flag(key) if key != "notify" else "notify (" + _show(key, old) + ")")
            continue
        if old is None and key in PORTS | SCALARS:
            continue  # a first value of a scalar is no change worth a line
        changed.append(f"{_flag(key)}: {_show(key, old)} -> {_show(key, new)}")
    return changed, kept_names


def secrets_dir(run_dir: Path) -> Path:
    return run_dir / "secrets" / "env"


def notify_env(run_dir: Path, notify: dict | None) -> dict[str, str]:
    """Keep each notify variable set now (its value, 0600) and return ``<VAR>_FILE`` for every one kept: what the
    exporter's environment gets. Variables neither set now nor kept are left out (the relay says they are unset)."""
    if not notify:
        return {}
    names = notify.get("env") or receivers_vars(notify.get("receivers") or "")
    d = secrets_dir(run_dir)
    out = {}
    for var in names:
        path = d / var
        value = read_secret(var)
        if value:
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d.parent, 0o700)
            os.chmod(d, 0o700)
            tmp = d / f".{var}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(value)
            os.replace(tmp, path)
        if path.is_file():
            out[var + "_FILE"] = str(path)
    return out


def kept_value(run_dir: Path, var: str) -> str | None:
    """A notify variable's value: set now, else kept by an earlier ``up``."""
    v = read_secret(var)
    if v:
        return v
    try:
        return (secrets_dir(run_dir) / var).read_text().strip() or None
    except OSError:
        return None


def save(run_dir: Path, merged: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (KEPT_FILE + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, run_dir / KEPT_FILE)


def value(merged: dict, key: str):
    """A merged setting, or its default."""
    if key in PORTS:
        return merged.get(key, PORTS[key][1])
    if key in LISTS:
        return merged.get(key, [])
    return merged.get(key, SCALARS[key][1])
