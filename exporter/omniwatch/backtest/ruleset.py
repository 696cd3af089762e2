"""The rule files as the backtest needs them: alerting rules with ``for``/``keep_firing_for``, and
recording rules ordered by dependency level.

An alert reads a recorded series of its own group at the very evaluation that recorded it (rules of a
group run in order at one timestamp), so the backtest evaluates the alert with those earlier
same-group recording rules inlined (``LoadedAlert.eval_expr``): that is what live computes. Reading
them from backfilled blocks instead would lag by up to one evaluation per rule level, because promtool
evaluates each backfilled group at its own hash offset. Recorded series of other groups (which lag
live too) and references with matchers, ranges, ``offset`` or ``@`` are read from the backfill.

Rules are always read from disk at run time (``alerts/*.rules.yml`` by default, the one set of rule
files); nothing is copied. Recording rules are backfilled level by level because ``promtool tsdb
create-blocks-from rules`` evaluates each rule against the server as it is: a rule that reads another
recorded series needs that series in the TSDB first.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import names
from ..rules import RULES_DIR, LoadedAlert, Record, RulesError, load_rules, rule_files

# Alerts a backtest cannot judge, and why (printed in the report instead of a verdict).
LIVE_ONLY = {
    names.ALERT_OUTSIDE_STEP: "live-only: arrivals are rebuilt from the timers, so the time outside them is 0 by "
                              "construction (it fires on a live run's real gaps between steps)",
    names.ALERT_RUN_CAP: "live-only: the exporter's run cap (--max-runs); a backtest replays each run in a store of its own",
}
# Rule files a recorded run cannot speak to: every series they read is scraped from the endpoints
# discovery finds (vLLM-Omni rollout and reward servers, TransferQueue), which a verl log does not carry.
# The backtest does not load them (their recording rules are not backfilled, promtool does not read
# them); their alerts are listed as not evaluated, with this reason.
LIVE_ONLY_FILES = {
    "endpoints.rules.yml": "live-only: reads the series of the rollout / reward / TransferQueue endpoints "
                           "discovery scrapes, which a recorded run does not carry",
}
# Alerts judged only while the run ran: over every gap between two steps, at evaluation times up to the
# last step's arrival (a finished file is no stall after its last line; a long gap mid-run may be one).
GAPS_ONLY = {
    names.ALERT_STALLED: "judged over every gap between steps, up to the last step's arrival",
}
HEARTBEAT_SEVERITY = "none"  # Watchdog-style alerts that always fire by design
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# A bare reference: not part of a longer name, not followed by matchers, a range, offset or @.
_REF = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*[{\[@])(?!\s+offset\b)")


@dataclass
class RuleSet:
    alerts: list[LoadedAlert] = field(default_factory=list)
    recordings: list[Record] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # the rule files loaded (promtool renders annotations with them)
    live_only: dict[str, str] = field(default_factory=dict)  # alerts of the files not loaded -> why

    def skipped(self) -> dict[str, str]:
        """Alert name -> why the backtest does not evaluate it."""
        out: dict[str, str] = dict(self.live_only)
        for a in self.alerts:
            if a.name in LIVE_ONLY:
                out[a.name] = LIVE_ONLY[a.name]
            elif a.severity == HEARTBEAT_SEVERITY:
                out[a.name] = "heartbeat: always firing by design"
        return out

    def evaluated(self) -> list[LoadedAlert]:
        skip = self.skipped()
        return [a for a in self.alerts if a.name not in skip]

    def needed_recordings(self, alerts: list[LoadedAlert] | None = None, inlined: bool = False) -> list[Record]:
        """Recording rules the given alerts read, directly or through other recording rules
        (``inlined``: as the backtest evaluates them, with same-group recordings inlined)."""
        return self.recordings_read(tok for a in (self.alerts if alerts is None else alerts)
                                    for tok in _IDENT.findall(a.eval_expr if inlined else a.expr))

    def recordings_read(self, tokens) -> list[Record]:
        """Recording rules named by ``tokens``, and those they read, recursively."""
        by_name: dict[str, list[Record]] = {}
        for r in self.recordings:
            by_name.setdefault(r.record, []).append(r)
        todo, seen = list(tokens), set()
        while todo:
            tok = todo.pop()
            if tok in by_name and tok not in seen:
                seen.add(tok)
                todo.extend(t for r in by_name[tok] for t in _IDENT.findall(r.expr))
        return [r for r in self.recordings if r.record in seen]


def levels(recordings: list[Record]) -> list[list[Record]]:
    """Group recording rules so that each level reads only series recorded by earlier levels."""
    recorded = {r.record for r in recordings}
    by_name: dict[str, list[Record]] = {}
    for r in recordings:
        by_name.setdefault(r.record, []).append(r)
    memo: dict[str, int] = {}

    def deps(r: Record) -> set[str]:
        return {t for t in _IDENT.findall(r.expr) if t in recorded and t != r.record}

    def level_of(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise RulesError("recording rules depend on each other in a cycle: " + " -> ".join(path + (name,)))
        if name not in memo:
            memo[name] = max(1 + max((level_of(d, path + (name,)) for d in deps(r)), default=0)
                             for r in by_name[name])
        return memo[name]

    out: dict[int, list[Record]] = {}
    for r in recordings:
        r.level = 1 + max((level_of(d, (r.record,)) for d in deps(r)), default=0)
        out.setdefault(r.level, []).append(r)
    return [out[k] for k in sorted(out)]


def inline(expr: str, defs: dict[str, str]) -> str:
    """``expr`` with each bare reference to a name of ``defs`` replaced by ``(its expression)``;
    string literals are left alone."""
    if not defs:
        return expr

    def code(part: str) -> str:
        return _REF.sub(lambda m: f"({defs[m[1]]})" if m[1] in defs else m[0], part)
    out, pos = [], 0
    for m in _STRING.finditer(expr):
        out += [code(expr[pos:m.start()]), m[0]]
        pos = m.end()
    return "".join(out) + code(expr[pos:])


def _inline_groups(rs: RuleSet, ordered: list[LoadedAlert | Record]) -> None:
    """Set each alert's ``eval_expr``: recording rules defined earlier in its group (once in the whole
    rule set, without extra labels, and named level:metric:ops — a colon no label or function name
    has) are inlined, themselves inlined the same way."""
    once = {k for k, n in Counter(r.record for r in rs.recordings).items() if n == 1}
    defs: dict[tuple[str, str], dict[str, str]] = {}
    for rule in ordered:
        d = defs.setdefault((str(rule.file), rule.group), {})
        if isinstance(rule, Record):
            if rule.record in once and not rule.labels and ":" in rule.record:
                d[rule.record] = inline(rule.expr, d).strip()
        else:
            rule.eval_expr = inline(rule.expr, d)


def load(rules_dir: str | Path | None = None) -> RuleSet:
    """Every ``*.rules.yml`` under ``rules_dir`` (default: the repository's ``alerts/``) but the
    ``LIVE_ONLY_FILES``, whose alerts only go to ``live_only``."""
    d = Path(rules_dir) if rules_dir else RULES_DIR
    if not d.is_dir():
        raise RulesError(f"rules directory {d} does not exist")
    files = rule_files(d)
    if not files:
        raise RulesError(f"no *.rules.yml in {d}")
    rs = RuleSet(files=[str(f) for f in files if f.name not in LIVE_ONLY_FILES])
    ordered: list[LoadedAlert | Record] = []
    for rule in load_rules(files):
        if rule.file.name in LIVE_ONLY_FILES:
            if isinstance(rule, LoadedAlert):
                rs.live_only[rule.name] = LIVE_ONLY_FILES[rule.file.name]
        else:
            (rs.alerts if isinstance(rule, LoadedAlert) else rs.recordings).append(rule)
            ordered.append(rule)
    _inline_groups(rs, ordered)
    return rs


def write_rule_file(recordings: list[Record], path: str | Path) -> None:
    """A temporary rule file holding one level of recording rules, for promtool (run-time only)."""
    groups: dict[str, list] = {}
    for r in recordings:
        rule = {"record": r.record, "expr": r.expr}
        if r.labels:
            rule["labels"] = r.labels
        groups.setdefault(r.group, []).append(rule)
    doc = {"groups": [{"name": g, "rules": rules} for g, rules in groups.items()]}
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
