"""What a rule file is made of (recording rules, alerts, groups, files) and the selector every rule uses: the
types the rule modules (spec.py, stalls.py, endpoints.py), and the renderer share."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..names import RUN_BY
from .config import Config
from .prose import Prose



@dataclass
class Record:
    record: str
    expr: str
    labels: dict = field(default_factory=dict)
    comment: str = ""


@dataclass
class Alert:
    name: str
    expr: str
    severity: str
    summary: str
    description: Prose
    for_: str | None = None
    labels: dict = field(default_factory=dict)
    remedy: Prose | None = None
    step: bool = False          # carries a `step` annotation (the run's latest step)
    comment: str = ""

    def all_labels(self) -> dict:
        return {"severity": self.severity, **self.labels}


@dataclass
class Group:
    name: str
    rules: list
    comment: str = ""


@dataclass
class RuleFile:
    name: str
    header: str
    groups: list[Group]


def sel(cfg: Config, metric: str, matchers: str = "") -> str:
    """``metric{matchers, <cfg extra matchers>}``."""
    ms = ",".join(m for m in (matchers, cfg.selectors.extra) if m)
    return f"{metric}{{{ms}}}" if ms else metric


def pct(x: float) -> str:
    return f"{x * 100:g}%"
