"""What a rule file is made of (recording rules, alerts, groups, files) and the selector every rule uses: the
types the rule modules (rulespec.py, stalls.py, endpoints.py), and the renderer share."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..names import RUN_BY
from ..config import Config
from .prose import Prose



@dataclass
class Record:
    record: str
    expr: str
    labels: dict = field(default_factory=dict)
    comment: str = ""


@dataclass
class AlertSpec:
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
    resolve: str = ""           # the hold condition, for docs (hysteresis(): already part of `expr`)

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


# Hysteresis: an alert whose condition was true resolves only when a weaker one no longer holds. The rule reads its
# own state (ALERTS{alertstate="firing"}, written by Prometheus at the previous evaluation), the standard way to do it
# in PromQL; promtool tests evaluate it the same way, and the backtest replays it (backtest/evaluate.py) from the two
# halves split_hysteresis() returns. The held instance keeps its labels (``sticky``: copied from ALERTS, e.g. the cause
# StepTimeRegression named when it fired), so one incident stays one alert; the firing condition only adds an instance
# for a run none is held for. The comments mark the split.
HOLD_MARK = "# hysteresis: a firing alert stays while this holds, with the labels it fired with"
FIRE_MARK = "or on ({by}) # else it fires when"
_SPLIT = re.compile(r"^\(\n" + re.escape(HOLD_MARK) + r"\n(?P<hold>.*)\n\)\n  \* on \((?P<by>[^)]*)\) group_left "
                    r"\((?P<sticky>[^)]*)\) ALERTS\{(?P<matchers>[^}]*)\}\nor on \([^)]*\) # else it fires when\n"
                    r"(?P<fire>.*)$", re.S)


def hysteresis(fire: str, hold: str, alertname: str, by: str = RUN_BY, static: dict | None = None,
               sticky: tuple[str, ...] = (), unheld: dict[str, str] | None = None) -> str:
    """While this alert (with the ``static`` labels of its variant) fires for the ``by`` labels, it stays as long as
    ``hold`` holds, keeping its ``sticky`` labels; otherwise it fires as ``fire`` says. ``hold`` must return one
    series per ``by`` label set (it is matched one-to-one with the firing alert). ``unheld``: label -> regex of the
    instances that are never held (they resolve as soon as ``fire`` no longer holds)."""
    matchers = ", ".join([f'alertname="{alertname}"', 'alertstate="firing"',
                          *(f'{k}="{v}"' for k, v in sorted((static or {}).items())),
                          *(f'{k}!~"{v}"' for k, v in sorted((unheld or {}).items()))])
    body = "\n".join("  " + line for line in hold.splitlines())
    return (f"(\n{HOLD_MARK}\n{body}\n)\n  * on ({by}) group_left ({', '.join(sticky)}) ALERTS{{{matchers}}}\n"
            f"{FIRE_MARK.format(by=by)}\n{fire}")


@dataclass(frozen=True)
class Hysteresis:
    fire: str
    hold: str
    by: tuple[str, ...]
    sticky: tuple[str, ...]
    matchers: str


_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def matches(matchers: str, labels: dict[str, str]) -> bool:
    """Whether an alert with ``labels`` is selected by the PromQL label matchers ``matchers`` (``a="x", b!~"y|z"``;
    regexes are anchored, as in PromQL). ``alertname`` and ``alertstate`` are the caller's to judge."""
    for m in _MATCHER.finditer(matchers):
        name, op, value = m[1], m[2], m[3].replace('\\"', '"')
        if name in ("alertname", "alertstate"):
            continue
        have = labels.get(name, "")
        ok = (have == value if op in ("=", "!=") else re.fullmatch(value, have) is not None)
        if ok != (op in ("=", "=~")):
            return False
    return True


def split_hysteresis(expr: str) -> Hysteresis | None:
    """The halves of an expression hysteresis() made (with recording rules inlined or not), or None."""
    m = _SPLIT.match(expr)
    if m is None:
        return None
    names = lambda x: tuple(v.strip() for v in x.split(",") if v.strip())  # noqa: E731
    return Hysteresis(m["fire"], m["hold"], names(m["by"]), names(m["sticky"]), m["matchers"])
