"""Discovery options: one dataclass, the argparse flags that fill it (shared by ``omniwatch serve``
and ``omniwatch discover``), and how it travels inside ``Settings.extra["discovery"]``."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .. import cliargs
from .targets import DEFAULT_RAY_SD_FILE, DEFAULT_ROLLOUT_PROM_FILE, parse_address_list

OFF = ("", "off", "none", "no", "false")


@dataclass
class DiscoveryConfig:
    ray_address: str | None = "auto"           # None = do not attach to Ray at all
    interval: float = 10.0                     # seconds between discovery rounds
    timeout: float = 5.0                       # per Ray call / per file read
    connect_timeout: float = 30.0              # a probe that says nothing this long is restarted
    rollout_prometheus_file: str = DEFAULT_ROLLOUT_PROM_FILE
    ray_sd_file: str | None = DEFAULT_RAY_SD_FILE
    rollout: list[str] = field(default_factory=list)   # explicit host:port of rollout servers
    reward: list[str] = field(default_factory=list)    # explicit host:port of reward-model servers
    max_num_seqs: dict[str, int] = field(default_factory=dict)  # role -> max_num_seqs
    project: str | None = None                 # run labels put on every discovered target
    experiment: str | None = None
    rejected: list[str] = field(default_factory=list)  # flag values that were not host:port
    ray_tasks: str | None = None               # Ray dashboard (state API) for task events; None = off
    ray_tasks_interval: float = 5.0            # seconds between task-event polls
    ray_job: str | None = None                 # the Ray job of the watched run (default: the job whose workers run)
    ray_lanes_max: int = 64                    # above this many workers a role's lanes collapse to counts
    ray_stack_native: bool = False             # stack dumps with C/C++ frames (py-spy --native: where NCCL waits)


def parse_max_num_seqs(text: str | None) -> dict[str, int]:
    """``"16"`` (rollout and reward) or ``"rollout=16,reward=64"``; bad parts raise ValueError."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        role, sep, val = part.partition("=")
        roles = [role.strip()] if sep else ["rollout", "reward"]
        v = int(val if sep else role)
        if v <= 0 or any(r not in ("rollout", "reward") for r in roles):
            raise ValueError(f"bad --max-num-seqs part {part!r}: want N or rollout=N,reward=M with N > 0")
        for r in roles:
            out[r] = v
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("discovery (Ray, TransferQueue, rollout and reward servers)")
    g.add_argument("--ray-address", default="auto",
                   help="Ray cluster to attach to (default auto: RAY_ADDRESS or the local cluster); 'off' disables Ray")
    g.add_argument("--rollout", action="append", default=[], metavar="HOST:PORT[,...]",
                   help="rollout (vLLM-Omni) servers, in addition to those found in Ray and the rollout Prometheus file")
    g.add_argument("--reward", action="append", default=[], metavar="HOST:PORT[,...]",
                   help="reward-model (vLLM) servers, in addition to those found in Ray")
    g.add_argument("--rollout-prometheus-file", default=DEFAULT_ROLLOUT_PROM_FILE,
                   help="the file verl writes with actor_rollout_ref.rollout.prometheus.enable=True (rollout.prometheus.file)")
    g.add_argument("--ray-sd-file", default=DEFAULT_RAY_SD_FILE, help="Ray's Prometheus service-discovery file")
    g.add_argument("--max-num-seqs", default=None, metavar="N|rollout=N,reward=M",
                   help="max_num_seqs of the servers (for the saturation rules)")
    g.add_argument("--discovery-interval", type=cliargs.positive_float, default=10.0, help="seconds between discovery rounds")
    g.add_argument("--discovery-project", default=None, help="project label for discovered targets (default: the only run)")
    g.add_argument("--discovery-experiment", default=None, help="experiment label for discovered targets")
    g.add_argument("--ray-tasks", default="off", metavar="ADDR|auto|off",
                   help="read Ray's task events from this Ray dashboard (state API: http://host:port; auto: "
                        "RAY_API_SERVER_ADDRESS or 127.0.0.1:8265): who holds the step, lanes, stragglers")
    g.add_argument("--ray-tasks-interval", type=float, default=5.0, help="seconds between task-event polls")
    g.add_argument("--ray-job", default=None, help="Ray job id of the watched run (default: the job whose workers run)")
    g.add_argument("--ray-lanes-max", type=int, default=64,
                   help="per-worker lanes up to this many workers per role; above, counts per phase")
    g.add_argument("--ray-stack-native", action="store_true",
                   help="stack dumps of held calls include C/C++ frames (py-spy --native: where an NCCL collective "
                        "waits); slower to take")


def from_args(a: argparse.Namespace) -> DiscoveryConfig:
    ray = getattr(a, "ray_address", "auto")
    rollout, bad1 = parse_address_list(getattr(a, "rollout", []))
    reward, bad2 = parse_address_list(getattr(a, "reward", []))
    return DiscoveryConfig(
        ray_address=None if ray is None or str(ray).lower() in OFF else str(ray),
        interval=max(0.2, float(getattr(a, "discovery_interval", 10.0))),
        rollout_prometheus_file=getattr(a, "rollout_prometheus_file", DEFAULT_ROLLOUT_PROM_FILE),
        ray_sd_file=None if str(getattr(a, "ray_sd_file", "") or "").lower() in OFF else a.ray_sd_file,
        rollout=rollout, reward=reward, rejected=bad1 + bad2,
        max_num_seqs=parse_max_num_seqs(getattr(a, "max_num_seqs", None)),
        project=getattr(a, "discovery_project", None), experiment=getattr(a, "discovery_experiment", None),
        ray_tasks=None if str(getattr(a, "ray_tasks", "off") or "off").lower() in OFF else str(a.ray_tasks),
        ray_tasks_interval=max(0.2, float(getattr(a, "ray_tasks_interval", 5.0))),
        ray_job=getattr(a, "ray_job", None), ray_lanes_max=max(1, int(getattr(a, "ray_lanes_max", 64))),
        ray_stack_native=bool(getattr(a, "ray_stack_native", False)),
    )


def from_settings(settings) -> DiscoveryConfig | None:
    """``Settings.extra["discovery"]``: a DiscoveryConfig, a dict of its fields, or False/absent (off).
    ``omniwatch serve`` always sets it from its flags; an app built without it (tests, tools) does not
    start a Ray probe."""
    v = (getattr(settings, "extra", None) or {}).get("discovery")
    if v is False or v is None:
        return None
    if isinstance(v, DiscoveryConfig):
        return v
    if isinstance(v, dict):
        return DiscoveryConfig(**v)
    return None
