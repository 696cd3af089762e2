"""Relay configuration: a small YAML file naming receivers; every secret (webhook URL, signing
secret, extra auth header) is read from an environment variable the file names (or ``$NAME_FILE``),
so the file itself can be committed. A broken receiver entry disables that receiver with a clear
error in ``/api/v1/relay/status``; it never stops the exporter.

    receivers:
      - name: ml-slack
        type: slack            # webhook | slack | feishu
        url_env: OMNIWATCH_SLACK_URL
    retry: {initial_seconds: 1, max_seconds: 300, give_up_after_seconds: 86400, timeout_seconds: 10}
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..redact import redact as redact_shapes
from ..settings import read_secret

CONFIG_ENV = "OMNIWATCH_RELAY_CONFIG"  # Settings.relay_config
TYPES = ("webhook", "slack", "feishu")
FEISHU_FORMATS = ("interactive", "post")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEYS = ("url", "api_url", "webhook_url", "secret", "token")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Retry:
    initial_seconds: float = 1.0
    max_seconds: float = 300.0
    give_up_after_seconds: float = 86400.0
    timeout_seconds: float = 10.0


@dataclass
class Receiver:
    name: str
    type: str
    url: str | None = None                 # secret: never logged, never in API output
    secret: str | None = None              # feishu signing secret
    headers: dict[str, str] = field(default_factory=dict)  # secret values (e.g. Authorization)
    format: str = "interactive"            # feishu: interactive | post
    channel: str | None = None             # slack channel override
    send_resolved: bool = True
    match: dict[str, str] = field(default_factory=dict)  # label equality filter
    exclude: dict[str, str] = field(default_factory=dict)  # groups whose labels all match this are not sent
    error: str | None = None               # why this receiver is disabled (no secret in it)

    @property
    def enabled(self) -> bool:
        return self.error is None and bool(self.url)

    def secrets(self) -> list[str]:
        return [s for s in (self.url, self.secret, *self.headers.values()) if s]

    def wants(self, status: str, labels: dict[str, str]) -> bool:
        if status == "resolved" and not self.send_resolved:
            return False
        if self.exclude and all(labels.get(k) == v for k, v in self.exclude.items()):
            return False
        return all(labels.get(k) == v for k, v in self.match.items())


@dataclass
class RelayConfig:
    receivers: list[Receiver] = field(default_factory=list)
    retry: Retry = field(default_factory=Retry)
    grafana_url: str | None = None
    path: str | None = None
    error: str | None = None               # the whole file failed to load
    runbooks: tuple[str, str] | None = None  # (default runbook base, this exporter's): messages link here

    def secrets(self) -> list[str]:
        return [s for r in self.receivers for s in r.secrets()]


def _env_secret(name: object, what: str) -> str:
    if not isinstance(name, str) or not _ENV_RE.match(name):
        raise ConfigError(f"{what} must name an environment variable, got {type(name).__name__}")
    v = read_secret(name)
    if not v:
        raise ConfigError(f"{what}: environment variable {name} (or {name}_FILE) is not set")
    return v


def _receiver(i: int, raw: object) -> Receiver:
    if not isinstance(raw, dict):
        return Receiver(name=f"receiver{i}", type="?", error="entry must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        name, bad_name = f"receiver{i}", True
    else:
        bad_name = False
    r = Receiver(name=name, type=str(raw.get("type", "")))
    try:
        if bad_name:
            raise ConfigError("name must match [A-Za-z0-9_.-]{1,64}")
        for k in _SECRET_KEYS:
            if k in raw:
                raise ConfigError(f"'{k}' is not allowed in the file (secrets come from the environment): use {k}_env")
        if r.type not in TYPES:
            raise ConfigError(f"type must be one of {', '.join(TYPES)}")
        r.url = _env_secret(raw.get("url_env"), "url_env")
        if not r.url.startswith(("http://", "https://")):
            raise ConfigError(f"url_env {raw['url_env']}: the value is not an http(s) URL")
        if raw.get("secret_env") is not None:
            r.secret = _env_secret(raw["secret_env"], "secret_env")
        for h, env in (raw.get("headers_env") or {}).items():
            r.headers[str(h)] = _env_secret(env, f"headers_env.{h}")
        r.format = str(raw.get("format", "interactive"))
        if r.type == "feishu" and r.format not in FEISHU_FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FEISHU_FORMATS)}")
        r.channel = raw.get("channel")
        r.send_resolved = bool(raw.get("send_resolved", True))
        match = raw.get("match") or {}
        if not isinstance(match, dict):
            raise ConfigError("match must be a mapping of label: value")
        r.match = {str(k): str(v) for k, v in match.items()}
        exclude = raw.get("exclude") or {}
        if not isinstance(exclude, dict):
            raise ConfigError("exclude must be a mapping of label: value")
        r.exclude = {str(k): str(v) for k, v in exclude.items()}
    except ConfigError as e:
        r.url = r.secret = None
        r.headers = {}
        r.error = str(e)
    return r


def load(path: str | None, grafana: str | None = None) -> RelayConfig:
    """Read the relay config; problems end up in ``.error`` fields, never as exceptions. ``grafana`` is
    the Grafana base URL messages link to (Settings.grafana_url, OMNIWATCH_GRAFANA_URL)."""
    if not path:
        return RelayConfig(grafana_url=grafana)
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError("top level must be a mapping with 'receivers:'")
        receivers = raw.get("receivers") or []
        if not isinstance(receivers, list):
            raise ConfigError("'receivers' must be a list")
        retry_raw = raw.get("retry") or {}
        if not isinstance(retry_raw, dict):
            raise ConfigError("'retry' must be a mapping")
        retry = Retry(**{k: float(v) for k, v in retry_raw.items() if k in Retry.__dataclass_fields__})
        if retry.initial_seconds <= 0 or retry.max_seconds < retry.initial_seconds or retry.timeout_seconds <= 0:
            raise ConfigError("retry: need 0 < initial_seconds <= max_seconds and timeout_seconds > 0")
    except (OSError, yaml.YAMLError, ConfigError, TypeError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return RelayConfig(grafana_url=grafana, path=path, error=f"{type(e).__name__}: {msg}")
    # `optional: true`: a receiver whose url_env is unset is left out (compose's receivers file names every
    # kind; the ones whose URL is not given are absent, not disabled)
    rs = [_receiver(i, r) for i, r in enumerate(receivers)
          if not (isinstance(r, dict) and r.get("optional") is True and isinstance(r.get("url_env"), str)
                  and _ENV_RE.match(r["url_env"]) and not read_secret(r["url_env"]))]
    seen: set[str] = set()
    for r in rs:
        if r.name in seen:
            r.error, r.url = "duplicate receiver name", None
        seen.add(r.name)
    return RelayConfig(receivers=rs, retry=retry, grafana_url=grafana, path=path)


def redact(text: str, secrets: list[str]) -> str:
    """Remove every configured secret (and a URL secret's path, which is where Slack/Feishu keep the
    token), then every credential shape and secret assignment (:func:`omniwatch.redact.redact`)."""
    for s in sorted(set(secrets), key=len, reverse=True):
        if not s:
            continue
        text = text.replace(s, "<redacted>")
        if "://" in s:
            path = s.split("://", 1)[1].partition("/")[2]
            if len(path) >= 8:
                text = text.replace("/" + path, "/<redacted>").replace(path, "<redacted>")
    return redact_shapes(text)
