"""One typed settings object for every omniwatch process, resolved in one place.

Precedence, highest first (``tests/test_settings.py`` checks it):

1. command-line flags (passed as keyword arguments: ``Settings.load(port=..., watch=[...])``; a flag left
   unset does not count);
2. ``OMNIWATCH_<FIELD>`` environment variables (``OMNIWATCH_PORT``, ``OMNIWATCH_WATCH='["/logs"]'``);
   secrets also as ``OMNIWATCH_<FIELD>_FILE`` naming a file that holds them (so they never appear in
   ``ps``: argv is visible to every user);
3. a settings file: YAML named by ``OMNIWATCH_CONFIG`` (or ``Settings.load(config_file=...)``), keys as
   the field names below;
4. the defaults written here, once.

This is the only module that reads the process environment (a test fails otherwise). Other tools'
variables omniwatch must honour (Ray's token, Grafana's home, Docker's host) go through :func:`env`;
subprocesses get theirs from :func:`process_env`; binaries are found by :func:`tool` (on PATH, or the
path in ``OMNIWATCH_<TOOL>``, e.g. ``OMNIWATCH_PROMTOOL``).
"""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .config import DEFAULT_BASELINE_STEPS, DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from .core.model import DEFAULT_MAX_KEYS, DEFAULT_MAX_RUNS, DEFAULT_RUN_EXPIRY, DEFAULT_STALLED_EXPIRY

PREFIX = "OMNIWATCH_"
CONFIG_ENV = PREFIX + "CONFIG"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_EXPORTER_PORT = 19095
DEFAULT_PROMETHEUS_PORT = 19090
DEFAULT_ALERTMANAGER_PORT = 19093
DEFAULT_GRAFANA_PORT = 13000
DEFAULT_RUN_DIR = ".omniwatch"
DEFAULT_MAX_BODY = 1 << 20  # 1 MiB for push and webhook bodies
DEFAULT_MAX_LINE = 1 << 20  # a JSONL line longer than this is skipped (counted)
DEFAULT_POLL_SECONDS = 0.5
SECRETS = ("push_token", "webhook_token", "grafana_admin_password")


def env(name: str, default: str | None = None) -> str | None:
    """A variable of another tool's (``RAY_AUTH_TOKEN``, ``GF_PATHS_HOME``, ``DOCKER_HOST``)."""
    return os.environ.get(name, default)


def set_env(name: str, value: str) -> None:
    """Set a variable another tool reads when it loads (Ray's ``RAY_AUTH_MODE``, before importing ray)."""
    os.environ[name] = value


@contextlib.contextmanager
def env_override(name: str, value: str) -> Iterator[None]:
    """Set a variable another tool reads for the length of a ``with`` (verl's ``VERL_FILE_LOGGER_ROOT`` while
    the scorecard corpus writes through its Tracking), then put back what was there."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a child process gets: this one's plus ``extra``."""
    return {**os.environ, **(extra or {})}


def tool(*names: str) -> str | None:
    """Path of the first of ``names`` found: ``OMNIWATCH_<NAME>`` (``-`` as ``_``) when set, else on PATH."""
    for name in names:
        override = os.environ.get(PREFIX + name.upper().replace("-", "_"))
        if override:
            return override
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def parse_listen(value: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` (or ``PORT``, ``:PORT``, ``[::1]:PORT``); the host defaults to loopback."""
    host, sep, port = value.rpartition(":")
    if not sep:
        return DEFAULT_HOST, int(value)
    host = host.strip("[]") or DEFAULT_HOST
    return host, int(port)


def read_secret(name: str) -> str | None:
    """``$NAME`` or the contents of the file named by ``$NAME_FILE``; None when neither is set."""
    v = os.environ.get(name)
    if v:
        return v.strip()
    f = os.environ.get(name + "_FILE")
    if f and Path(f).is_file():
        return Path(f).read_text().strip() or None
    return None


class _SecretFiles(PydanticBaseSettingsSource):
    """``OMNIWATCH_<SECRET>_FILE``: the secret is the file's content (below the plain variable)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out = {}
        for name in SECRETS:
            path = os.environ.get(f"{PREFIX}{name.upper()}_FILE")
            if path and Path(path).is_file():
                out[name] = Path(path).read_text().strip() or None
        return out


class _SettingsFile(PydanticBaseSettingsSource):
    """The YAML settings file named by ``OMNIWATCH_CONFIG`` (or ``config_file=``)."""

    def __init__(self, settings_cls, path: str | None):
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self.path:
            return {}
        data = yaml.safe_load(Path(self.path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: a settings file is a mapping of setting -> value")
        return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", populate_by_name=True)

    # -- the exporter ------------------------------------------------------------------------------
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_EXPORTER_PORT, validation_alias=AliasChoices(
        "port", "exporter_port", PREFIX + "PORT", PREFIX + "EXPORTER_PORT"))
    watch: list[str] = []                      # JSONL files, globs or VERL_FILE_LOGGER_ROOT dirs
    console: list[str] = []                    # console log files
    window_steps: int = DEFAULT_WINDOW_STEPS
    baseline_steps: int = DEFAULT_BASELINE_STEPS
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    max_runs: int = DEFAULT_MAX_RUNS
    max_keys: int = DEFAULT_MAX_KEYS
    run_expiry_seconds: float = DEFAULT_RUN_EXPIRY
    stalled_expiry_seconds: float = DEFAULT_STALLED_EXPIRY  # runs that may be hung (core/planned.py)
    checkpoint_roots: list[str] = []           # <root>/<project>/<experiment>/global_step_<N>
    gpus: int | None = None                    # GPUs of runs whose keys cannot tell (ledger)
    trainer_configs: list[str] = []            # trainer config files, globs or dirs (trainer_config.py)
    stale_horizon_seconds: float = 6 * 3600.0  # a run first seen older than this is history (core/model.py)
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_line_bytes: int = DEFAULT_MAX_LINE
    poll_seconds: float = DEFAULT_POLL_SECONDS
    state_dir: str | None = None               # durable state (alert history, relay queue)
    max_connections: int = 256                 # HTTP connections held at once (httpguard)
    header_timeout: float = 10.0               # seconds to receive a request head
    body_timeout: float = 30.0                 # seconds to receive a request body
    max_open_files: int = 128                  # descriptors each file source keeps open
    follow_symlinks: bool = False              # follow symlinks out of a watched directory
    push_token: str | None = None              # OMNIWATCH_PUSH_TOKEN(_FILE); None = push disabled
    webhook_token: str | None = None           # OMNIWATCH_WEBHOOK_TOKEN(_FILE); None = webhook disabled
    gpu: str = "auto"                          # NVML sampler: auto | on | off
    gpu_busy_threshold: float = 50.0           # NVML utilization % above which a sample counts as busy
    gpu_node: str | None = None                # node label of GPU series (default: hostname)
    gpu_interval_s: float = 1.0                # seconds between NVML sample drains
    gpu_inter_stage_evidence: str | None = None  # on | off (default: on, off for a replayed trace)
    gpu_peak_tflops: float | None = None       # the real device peak, for an exporter without local GPUs
    # VERL_OMNI_DEVICE_FLOPS_TFLOPS the trainer uses, when the exporter is told the same value
    gpu_trainer_flops_tflops: str | None = Field(None, validation_alias=AliasChoices(
        "gpu_trainer_flops_tflops", PREFIX + "GPU_TRAINER_FLOPS_TFLOPS", "VERL_OMNI_DEVICE_FLOPS_TFLOPS"))
    relay_config: str | None = None            # receivers file of the alert relay
    alert_config: str | None = None            # threshold overrides the rules were generated with (YAML, as rules generate --config)
    grafana_url: str | None = None             # Grafana base URL the relay links to
    # -- the native stack ----------------------------------------------------------------------------
    run_dir: str = DEFAULT_RUN_DIR
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    alertmanager_port: int = DEFAULT_ALERTMANAGER_PORT
    grafana_port: int = DEFAULT_GRAFANA_PORT
    grafana_admin_password: SecretStr | None = None  # a Grafana on PATH starts only with one set
    grafana_anonymous: bool = False
    demo_step_seconds: float = 5.0
    # -- the trainer-side client (omniwatch.client) ---------------------------------------------------
    url: str = f"http://{DEFAULT_HOST}:{DEFAULT_EXPORTER_PORT}"
    # Area objects that are not settings (a replay GPU backend, a discovery configuration), set by the
    # code that builds the exporter (flags that parse into objects, tests).
    extra: dict = Field(default_factory=dict, exclude=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        path = init_settings.init_kwargs.pop("config_file", None) or os.environ.get(CONFIG_ENV)
        return init_settings, env_settings, _SecretFiles(settings_cls), _SettingsFile(settings_cls, path)

    @classmethod
    def load(cls, **flags) -> "Settings":
        """Settings with ``flags`` on top: a flag that is None was not given and does not count."""
        return cls(**{k: v for k, v in flags.items() if v is not None})

    # the old spelling
    from_env = load
