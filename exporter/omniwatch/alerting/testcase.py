"""The pieces of a promtool unit test (input series, alert and expression checks, cases) as data: what every
rule module builds its tests from; promtests.py renders them into ``alerts/tests/*.test.yml``."""
from __future__ import annotations

from dataclasses import dataclass, field

from .prose import Ctx

JOB = {"job": "omniwatch", "instance": "127.0.0.1:19095"}
INTERVAL = 15  # seconds between samples and evaluations


def dur(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(float(text[:-1]) * units[text[-1]])


def secs(t: int) -> str:
    return f"{t // 60}m{t % 60}s" if t % 60 else (f"{t // 60}m" if t else "0s")


def every(t: int) -> str:
    """An interval: ``15s``, ``1m``."""
    return f"{t}s" if t < 60 else secs(t)


def num(v: float) -> str:
    return f"{v:g}"


@dataclass
class Series:
    metric: str
    labels: dict
    values: str

    def render(self) -> dict:
        lab = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        return {"series": f"{self.metric}{{{lab}}}", "values": self.values}


@dataclass
class Expect:
    labels: dict          # the alert's labels (severity etc. included), alertname excluded
    ctx: Ctx


@dataclass
class Check:
    at: int
    alert: str
    expect: list[Expect] = field(default_factory=list)


@dataclass
class Sample:
    """One expected sample of a ``promql_expr_test``: ``metric{labels}`` (metric "" for an expression whose
    result has no name) and its value."""
    metric: str
    labels: dict
    value: float

    def render(self) -> dict:
        lab = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        value = int(self.value) if float(self.value).is_integer() else self.value
        return {"labels": f"{self.metric}{{{lab}}}", "value": value}


@dataclass
class ExprCheck:
    """A ``promql_expr_test``: ``expr`` evaluated at ``at`` returns exactly ``samples`` (none: empty)."""
    at: int
    expr: str
    samples: list[Sample] = field(default_factory=list)

    def render(self) -> dict:
        return {"expr": self.expr, "eval_time": secs(self.at), "exp_samples": [s.render() for s in self.samples]}


@dataclass
class Case:
    name: str
    series: list[Series]
    checks: list[Check]
    comment: str = ""                  # written above the test in the YAML
    exprs: list[ExprCheck] = field(default_factory=list)
    interval: int | None = None        # seconds between input samples; None: the file's evaluation interval


def run_labels(project: str, experiment: str, **extra) -> dict:
    return {**JOB, "project": project, "experiment": experiment, **extra}
