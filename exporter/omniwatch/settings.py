"""Exporter settings: flags override environment, environment overrides defaults. Secrets (tokens)
come from the environment or files only, never from argv (argv is visible in ``ps``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .analytics import DEFAULT_BASELINE_STEPS, DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from .model import DEFAULT_MAX_KEYS, DEFAULT_MAX_RUNS, DEFAULT_RUN_EXPIRY, DEFAULT_STALLED_EXPIRY

DEFAULT_HOST = "127.0.0.1"
DEFAULT_EXPORTER_PORT = 19095
DEFAULT_MAX_BODY = 1 << 20  # 1 MiB for push and webhook bodies
DEFAULT_MAX_LINE = 1 << 20  # a JSONL line longer than this is skipped (counted)
DEFAULT_POLL_SECONDS = 0.5


def read_secret(env: str) -> str | None:
    """``$NAME`` or the file named by ``$NAME_FILE``; None when neither is set."""
    v = os.environ.get(env)
    if v:
        return v.strip()
    f = os.environ.get(env + "_FILE")
    if f and Path(f).is_file():
        return Path(f).read_text().strip() or None
    return None


@dataclass
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_EXPORTER_PORT
    watch: list[str] = field(default_factory=list)           # JSONL files, globs or VERL_FILE_LOGGER_ROOT dirs
    console: list[str] = field(default_factory=list)         # console log files
    window_steps: int = DEFAULT_WINDOW_STEPS
    baseline_steps: int = DEFAULT_BASELINE_STEPS
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    max_runs: int = DEFAULT_MAX_RUNS
    max_keys: int = DEFAULT_MAX_KEYS
    run_expiry_seconds: float = DEFAULT_RUN_EXPIRY
    stalled_expiry_seconds: float = DEFAULT_STALLED_EXPIRY    # runs that may be hung (planned.py)
    checkpoint_roots: list[str] = field(default_factory=list) # <root>/<project>/<experiment>/global_step_<N>
    gpus: int | None = None                                   # GPUs of runs whose keys cannot tell (ledger)
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_line_bytes: int = DEFAULT_MAX_LINE
    poll_seconds: float = DEFAULT_POLL_SECONDS
    state_dir: str | None = None                              # durable state (alert history, relay queue)
    max_connections: int = 256                                # HTTP connections held at once (httpguard)
    header_timeout: float = 10.0                              # seconds to receive a request head
    body_timeout: float = 30.0                                # seconds to receive a request body
    max_open_files: int = 128                                 # descriptors each file source keeps open
    follow_symlinks: bool = False                             # follow symlinks out of a watched directory
    push_token: str | None = None                             # OMNIWATCH_PUSH_TOKEN(_FILE)
    webhook_token: str | None = None                          # OMNIWATCH_WEBHOOK_TOKEN(_FILE)
    extra: dict = field(default_factory=dict)                 # area-specific options (gpu, ray, relay, ...)

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        s = cls(push_token=read_secret("OMNIWATCH_PUSH_TOKEN"), webhook_token=read_secret("OMNIWATCH_WEBHOOK_TOKEN"))
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s
