"""What a person receives: Prometheus' notifier and Alertmanager 0.25 modelled on a simulated clock, from the
configuration file (``alerts/alertmanager.yml``: routes, grouping, timing, receivers' ``send_resolved``,
``inhibit_rules``), never from a hard-coded copy of it.

Prometheus (``rules/alerting.go`` and ``rules/manager.go`` of v2.42): an alert is sent when it starts firing and
again whenever the last send is more than ``resend_delay`` (1m) old, with ``startsAt`` = when it fired and
``endsAt`` = the evaluation + 4 x max(resend delay, evaluation interval); once resolved it is sent with
``endsAt`` = the resolving evaluation, and re-sent every ``resend_delay`` for 15 minutes (``resolvedRetention``)
unless the same labels become active again.

Alertmanager (``api/v2``, ``provider/mem``, ``dispatch``, ``inhibit``, ``notify`` of v0.25):

- a received alert is merged with the stored one of the same labels when their activity overlaps (``Put``), then
  matched against the routing tree (first matching child unless ``continue``; no child: the node) and put in its
  aggregation group (the route and the values of its ``group_by`` labels);
- a new group flushes ``group_wait`` after it was created (at once for an alert whose ``startsAt`` is older than
  that: ``insert``), then every ``group_interval`` (``run``); a flush of an empty group does nothing; groups found
  empty by the dispatcher's 30-second cleanup are dropped (a later alert starts a new group);
- a flush hands every alert of the group (``endsAt`` in the future: firing) to the pipeline: alerts muted by an
  inhibit rule are dropped — a rule mutes an alert matching its target matchers while an unresolved alert
  matching its source matchers with equal values of its ``equal`` labels exists, except one that also matches the
  target matchers when the muted alert matches the source matchers (``hasEqual``) —; nothing is left: nothing
  happens. Then per receiver integration the notification log decides (``DedupStage.needsUpdate``): the first
  notification needs a firing alert; later a firing alert not in the last notification's firing set, all alerts
  resolved (if the last had firing ones), a resolved alert not in the last resolved set (``send_resolved``
  integrations), or ``repeat_interval`` since the last notification. An integration without ``send_resolved``
  sends only the firing alerts (and nothing, but still logs, when none fire). Log entries expire after 2 x
  ``repeat_interval``. After the flush, resolved alerts not updated since are removed from the group.

Not modelled (the model refuses a configuration that uses them, or says so): silences, ``mute_time_intervals`` /
``active_time_intervals``, clustering (one instance: no peer wait), notification failures and retries, and the
provider's 30-minute garbage collection of resolved alerts (which changes no notification). A label set that goes
pending without firing again does not stop the resends of its resolved alert (the backtest reports firing
intervals only; only the group's lifetime could differ).
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..backtest.timeline import parse_duration
from ..yamlio import load as yaml_load

# Prometheus 2.42 defaults (cmd/prometheus/main.go, rules/alerting.go)
RESEND_DELAY = 60.0
RESOLVED_RETENTION = 15 * 60.0
# Alertmanager 0.25 (dispatch/route.go DefaultRouteOpts, dispatch/dispatch.go cleanup ticker)
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
CLEANUP_INTERVAL = 30.0
# config/notifiers.go: send_resolved defaults per integration
SEND_RESOLVED_DEFAULT = {"webhook_configs": True, "pagerduty_configs": True, "opsgenie_configs": True,
                         "victorops_configs": True, "pushover_configs": True, "sns_configs": True,
                         "telegram_configs": True, "discord_configs": True, "webex_configs": True,
                         "email_configs": False, "slack_configs": False, "wechat_configs": False}
UNSUPPORTED = ("mute_time_intervals", "time_intervals")
SEVERITY_RANK = {"critical": 3, "warning": 2, "info": 1}


class ConfigError(ValueError):
    pass


# --- matchers -----------------------------------------------------------------------------------------------
_MATCHER = re.compile(r'^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(=~|=|!=|!~)\s*(.*?)\s*$', re.S)


@dataclass(frozen=True)
class LabelMatcher:
    name: str
    op: str  # = != =~ !~
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = re.fullmatch(f"(?:{self.value})", v, re.S) is not None
        return hit if self.op == "=~" else not hit

    @classmethod
    def parse(cls, text: str) -> "LabelMatcher":
        """Alertmanager's matcher syntax (``name op "value"``, the value quoted or bare)."""
        m = _MATCHER.match(str(text))
        if not m:
            raise ConfigError(f"not a matcher: {text!r}")
        name, op, raw = m.groups()
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = re.sub(r'\\(.)', lambda x: {"n": "\n"}.get(x[1], x[1]), raw[1:-1])
        if op in ("=~", "!~"):
            re.compile(raw)
        return cls(name, op, raw)


def _matchers(node: dict, new: str, eq: str, regex: str, where: str) -> list[LabelMatcher]:
    out = [LabelMatcher.parse(t) for t in node.get(new) or []]
    out += [LabelMatcher(str(k), "=", str(v)) for k, v in (node.get(eq) or {}).items()]
    out += [LabelMatcher(str(k), "=~", str(v)) for k, v in (node.get(regex) or {}).items()]
    return out


def _all(ms: list[LabelMatcher], labels: dict[str, str]) -> bool:
    return all(m.matches(labels) for m in ms)


# --- configuration ------------------------------------------------------------------------------------------
@dataclass
class Route:
    key: str
    receiver: str
    group_by: tuple[str, ...] | None  # None: group by all labels ('...')
    group_wait: float
    group_interval: float
    repeat_interval: float
    matchers: list[LabelMatcher]
    cont: bool = False
    routes: list["Route"] = field(default_factory=list)

    def match(self, labels: dict[str, str]) -> list["Route"]:
        """dispatch/route.go ``Match``."""
        if not _all(self.matchers, labels):
            return []
        out: list[Route] = []
        for child in self.routes:
            got = child.match(labels)
            out += got
            if got and not child.cont:
                break
        return out or [self]

    def group_labels(self, labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
        if self.group_by is None:
            return tuple(sorted(labels.items()))
        return tuple(sorted((k, labels[k]) for k in self.group_by if k in labels))


@dataclass
class InhibitRule:
    source: list[LabelMatcher]
    target: list[LabelMatcher]
    equal: tuple[str, ...]


@dataclass
class Integration:
    receiver: str
    kind: str
    index: int
    send_resolved: bool


@dataclass
class AMConfig:
    route: Route
    inhibit_rules: list[InhibitRule]
    integrations: dict[str, list[Integration]]
    path: str = ""

    def routes(self) -> list[Route]:
        out, todo = [], [self.route]
        while todo:
            r = todo.pop()
            out.append(r)
            todo.extend(r.routes)
        return out

    def longest_wait(self) -> float:
        """The longest an alert can wait in a group before it is sent (max group_wait, group_interval)."""
        return max(max(r.group_wait, r.group_interval) for r in self.routes())


def _dur(v, what: str) -> float:
    """Alertmanager's durations (``10s``, ``5m``, ``4h``, ``500ms``; ``0s`` allowed)."""
    if re.fullmatch(r"(0+(ms|s|m|h|d|w|y)?)+", str(v).strip()):
        return 0.0
    try:
        return parse_duration(str(v))
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def _route(node: dict, parent: Route | None, key: str) -> Route:
    if parent is None:
        r = Route(key, str(node.get("receiver") or ""), (), DEFAULT_GROUP_WAIT, DEFAULT_GROUP_INTERVAL,
                  DEFAULT_REPEAT_INTERVAL, [])
    else:
        r = Route(key, parent.receiver, parent.group_by, parent.group_wait, parent.group_interval,
                  parent.repeat_interval, [])
    if node.get("receiver"):
        r.receiver = str(node["receiver"])
    if node.get("group_by") is not None:
        gb = [str(x) for x in node["group_by"]]
        r.group_by = None if "..." in gb else tuple(gb)
    for k in ("group_wait", "group_interval", "repeat_interval"):
        if node.get(k) is not None:
            setattr(r, k, _dur(node[k], f"route {key} {k}"))
    for k in ("mute_time_intervals", "active_time_intervals"):
        if node.get(k):
            raise ConfigError(f"route {key}: {k} is not modelled")
    r.matchers = _matchers(node, "matchers", "match", "match_re", key)
    r.cont = bool(node.get("continue", False))
    r.routes = [_route(c or {}, r, f"{key}/{i}") for i, c in enumerate(node.get("routes") or [])]
    return r


def parse_config(doc: dict, path: str = "") -> AMConfig:
    """An Alertmanager configuration (the parsed YAML)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("route"), dict):
        raise ConfigError(f"{path}: no route")
    for k in UNSUPPORTED:
        if doc.get(k):
            raise ConfigError(f"{path}: {k} is not modelled")
    root = _route(doc["route"], None, "{}")
    rules = []
    for i, r in enumerate(doc.get("inhibit_rules") or []):
        rules.append(InhibitRule(_matchers(r, "source_matchers", "source_match", "source_match_re", f"rule {i}"),
                                 _matchers(r, "target_matchers", "target_match", "target_match_re", f"rule {i}"),
                                 tuple(str(x) for x in r.get("equal") or [])))
    integrations: dict[str, list[Integration]] = {}
    for rec in doc.get("receivers") or []:
        name = str(rec.get("name"))
        lst = []
        for kind, default in SEND_RESOLVED_DEFAULT.items():
            for i, cfg in enumerate(rec.get(kind) or []):
                sr = (cfg or {}).get("send_resolved")
                lst.append(Integration(name, kind, i, default if sr is None else bool(sr)))
        integrations[name] = lst
    return AMConfig(root, rules, integrations, path)


def load_config(path: str | Path) -> AMConfig:
    p = Path(path)
    return parse_config(yaml_load(p.read_text(encoding="utf-8")), str(p))


# --- alerts --------------------------------------------------------------------------------------------------
@dataclass
class AmAlert:
    labels: dict[str, str]
    starts: float
    ends: float
    updated: float = 0.0

    @property
    def fp(self) -> tuple:
        return tuple(sorted(self.labels.items()))

    def resolved_at(self, t: float) -> bool:
        return not self.ends > t


def merge(old: AmAlert, new: AmAlert) -> AmAlert:
    """types.Alert.Merge (``new`` is the younger one)."""
    res = AmAlert(dict(new.labels), min(old.starts, new.starts), new.ends, new.updated)
    if new.resolved_at(new.updated):
        if old.resolved_at(new.updated) and old.ends > new.ends:
            res.ends = old.ends
    elif old.ends > new.ends:  # Prometheus always sends endsAt: never a timeout alert
        res.ends = old.ends
    return res


@dataclass
class Notification:
    t: float
    receiver: str
    integration: str
    group: tuple[tuple[str, str], ...]
    route: str
    status: str                          # firing | resolved
    firing: list[dict[str, str]]         # label sets of the firing alerts it carries
    resolved: list[dict[str, str]]
    reason: str                          # first | new | resolved | all_resolved | repeat

    @property
    def group_labels(self) -> dict[str, str]:
        return dict(self.group)

    @property
    def severity(self) -> str:
        """The highest severity among its firing alerts ('' when none fire)."""
        sev = [a.get("severity", "") for a in self.firing]
        return max(sev, key=lambda s: SEVERITY_RANK.get(s, 0)) if sev else ""

    def to_json(self) -> dict:
        return {"t": self.t, "receiver": self.receiver, "integration": self.integration,
                "group": dict(self.group), "status": self.status, "reason": self.reason,
                "firing": self.firing, "resolved": self.resolved}


@dataclass
class _Group:
    route: Route
    labels: tuple
    next_t: float
    alerts: dict = field(default_factory=dict)  # fp -> Alert
    flushed: bool = False
    alive: bool = True


@dataclass
class _Entry:
    firing: frozenset
    resolved: frozenset
    t: float
    expires: float


class Alertmanager:
    """One Alertmanager instance on a simulated clock. ``post(t, alerts)`` is a request to ``/api/v2/alerts``
    received at ``t`` (times must not go back); ``advance(t)`` runs the group and cleanup timers due up to ``t``.
    ``notifications`` collects what was sent. ``started``: the process start (the cleanup ticker's phase)."""

    def __init__(self, config: AMConfig, started: float = 0.0, cleanup_interval: float = CLEANUP_INTERVAL):
        self.cfg = config
        self.now = started
        self.alerts: dict[tuple, AmAlert] = {}
        self.scache: list[dict[tuple, AmAlert]] = [{} for _ in config.inhibit_rules]
        self.groups: dict[tuple, _Group] = {}
        self.nflog: dict[tuple, _Entry] = {}
        self.notifications: list[Notification] = []
        self._timers: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._cleanup = cleanup_interval
        self._push(started + cleanup_interval, "cleanup", None)

    def _push(self, t: float, kind: str, obj) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, kind, obj))

    # -- time
    def advance(self, t: float) -> None:
        """Run every timer due at or before ``t``."""
        while self._timers and self._timers[0][0] <= t:
            when, _, kind, obj = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if kind == "cleanup":
                for k in [k for k, g in self.groups.items() if not g.alerts]:
                    self.groups.pop(k).alive = False
                self._push(when + self._cleanup, "cleanup", None)
            elif kind == "flush":
                g = obj
                if g.alive and g.next_t == when:
                    self._flush(g, when)
        self.now = max(self.now, t)

    # -- API
    def post(self, t: float, alerts: Iterable[AmAlert]) -> None:
        self.advance(t - 1e-9)
        self.now = max(self.now, t)
        for a in alerts:
            a = AmAlert(dict(a.labels), a.starts, a.ends, t)
            old = self.alerts.get(a.fp)
            if old is not None and ((old.starts < a.ends < old.ends) or (old.starts < a.starts < old.ends)):
                a = merge(old, a)
            self.alerts[a.fp] = a
            for i, rule in enumerate(self.cfg.inhibit_rules):
                if _all(rule.source, a.labels):
                    self.scache[i][a.fp] = a
            for route in self.cfg.route.match(a.labels):
                self._insert(route, a, t)

    def _insert(self, route: Route, a: AmAlert, t: float) -> None:
        key = (route.key, route.group_labels(a.labels))
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(route, key[1], t + route.group_wait)
            self._push(g.next_t, "flush", g)
        g.alerts[a.fp] = a
        if not g.flushed and a.starts + route.group_wait < t and g.next_t > t:
            g.next_t = t
            self._push(t, "flush", g)

    # -- the notification pipeline
    def muted(self, labels: dict[str, str], t: float) -> bool:
        for i, rule in enumerate(self.cfg.inhibit_rules):
            if not _all(rule.target, labels):
                continue
            exclude = _all(rule.source, labels)
            for src in self.scache[i].values():
                if src.resolved_at(t):
                    continue
                if any(src.labels.get(k, "") != labels.get(k, "") for k in rule.equal):
                    continue
                if exclude and _all(rule.target, src.labels):
                    continue
                return True
        return False

    def _flush(self, g: _Group, t: float) -> None:
        g.next_t = t + g.route.group_interval
        g.flushed = True
        self._push(g.next_t, "flush", g)
        if not g.alerts:
            return
        snap = [(fp, a, a.resolved_at(t)) for fp, a in sorted(g.alerts.items())]
        kept = [(fp, a, res) for fp, a, res in snap if not self.muted(a.labels, t)]
        if kept:
            for integ in self.cfg.integrations.get(g.route.receiver, []):
                self._notify(g, integ, kept, t)
        for fp, a, res in snap:
            if res and g.alerts.get(fp) is a:
                del g.alerts[fp]

    def _notify(self, g: _Group, integ: Integration, kept, t: float) -> None:
        firing = frozenset(fp for fp, _, res in kept if not res)
        resolved = frozenset(fp for fp, _, res in kept if res)
        nkey = (g.route.key, g.labels, integ.receiver, integ.kind, integ.index)
        entry = self.nflog.get(nkey)
        if entry is not None and entry.expires <= t:
            entry = None
        reason = None
        if entry is None:
            reason = "first" if firing else None
        elif not firing <= entry.firing:
            reason = "new"
        elif not firing:
            reason = "all_resolved" if entry.firing else None
        elif integ.send_resolved and not resolved <= entry.resolved:
            reason = "resolved"
        elif entry.t < t - g.route.repeat_interval:
            reason = "repeat"
        if reason is None:
            return
        sent = [(fp, a, res) for fp, a, res in kept if integ.send_resolved or not res]
        if sent:
            self.notifications.append(Notification(
                t, integ.receiver, f"{integ.kind}[{integ.index}]", g.labels, g.route.key,
                "firing" if firing else "resolved", [dict(a.labels) for _, a, res in sent if not res],
                [dict(a.labels) for _, a, res in sent if res], reason))
        self.nflog[nkey] = _Entry(firing, resolved, t, t + 2 * g.route.repeat_interval)


# --- Prometheus' side ------------------------------------------------------------------------------------------
@dataclass
class Firing:
    """One firing interval of one alert label set, on the evaluation grid."""
    labels: dict[str, str]   # alertname included
    first_t: float           # the evaluation at which it fired
    last_t: float            # the last evaluation at which it fired
    resolved_t: float | None  # the evaluation that resolved it (None: still firing when evaluation ended)
    active_t: float          # when it went pending (first_t - for:)
    end_t: float             # the last evaluation of its run


def prometheus_posts(firings: list[Firing], eval_interval: float, resend_delay: float = RESEND_DELAY,
                     hold_open: float = 0.0) -> list[tuple[float, AmAlert]]:
    """Every alert Prometheus sends to Alertmanager for these firing intervals, as (time, alert). An alert still
    firing at its run's last evaluation keeps being sent ``hold_open`` seconds longer (live, the exporter keeps
    serving a finished run's last values, so its alerts stay firing; a backtest stops evaluating there)."""
    out: list[tuple[float, AmAlert]] = []
    valid = 4 * max(resend_delay, eval_interval)
    by_labels: dict[tuple, list[Firing]] = {}
    for f in firings:
        by_labels.setdefault(tuple(sorted(f.labels.items())), []).append(f)
    for fs in by_labels.values():
        fs.sort(key=lambda f: f.first_t)
        for i, f in enumerate(fs):
            t, last_sent = f.first_t, None
            last = f.last_t + (hold_open if f.resolved_t is None else 0.0)
            while t <= last + 1e-6:
                if last_sent is None or last_sent + resend_delay < t - 1e-6:
                    out.append((t, AmAlert(dict(f.labels), f.first_t, t + valid)))
                    last_sent = t
                t += eval_interval
            if f.resolved_t is None:
                continue
            stop = fs[i + 1].active_t if i + 1 < len(fs) else math.inf
            t, last_sent = f.resolved_t, None
            while t < stop - 1e-6 and t <= f.end_t + 1e-6 and t - f.resolved_t <= RESOLVED_RETENTION + 1e-6:
                if last_sent is None or last_sent + resend_delay < t - 1e-6:
                    out.append((t, AmAlert(dict(f.labels), f.first_t, f.resolved_t)))
                    last_sent = t
                t += eval_interval
    out.sort(key=lambda p: (p[0], sorted(p[1].labels.items())))
    return out


def simulate(config: AMConfig, posts: list[tuple[float, AmAlert]], until: float, started: float | None = None
             ) -> list[Notification]:
    """Run Alertmanager over ``posts`` (time-ordered) up to ``until``; the notifications it sent."""
    if not posts:
        return []
    am = Alertmanager(config, posts[0][0] if started is None else started)
    i = 0
    while i < len(posts):
        t = posts[i][0]
        batch = []
        while i < len(posts) and posts[i][0] == t:
            batch.append(posts[i][1])
            i += 1
        am.post(t, batch)
    am.advance(until)
    return am.notifications
