"""Turn one Alertmanager notification into the message an RL engineer reads: which run
(project/experiment), which step, the numbers, the remedy, and links to the runbook and dashboard;
then render it for a generic webhook, Slack (incoming webhook, attachments) or Feishu/Lark
(custom bot, ``interactive`` card or ``post``, optionally signed).

Everything in a notification is user-controlled (run names come from directory and file names, labels
and annotations from whoever can post to Alertmanager): every label and annotation value is made one line
(control characters and line breaks become a space) before it is rendered, so a file name cannot plant a
fake line; Slack text is escaped (``&<>``); Feishu gets plain text only (``plain_text`` card elements,
``text`` post elements, and ``<`` followed by a zero-width space, so nothing parses as ``<at id=all>``).

Annotations read (see docs/relay.md): ``summary``, ``description`` (the numbers), ``remedy``
(or ``action``), ``step``, ``value``, ``runbook_url``, ``dashboard_url`` (absolute, or a path joined
to ``OMNIWATCH_GRAFANA_URL``).

Every message says how urgent it is, in words and in colour (label ``severity``: info, warning, critical):
the title starts with the highest severity firing (``[CRITICAL] TrainingStalled — run``), each alert's
line names its own, Slack's attachment colour and Feishu's card header follow it (critical red, warning
orange, info blue), and a resolved message is green, titled ``[RESOLVED]`` and says what it was
(``resolved; was critical``). An alert without a severity label is shown as firing, in red.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from .payload import go_time

MAX_ALERTS_SHOWN = 10
DEFAULT_DASHBOARD_PATH = "/dashboards?query=omniwatch"
RELAY_FORMAT_VERSION = "omniwatch.relay/1"
# Most urgent first. Colours: Slack attachment colours (its named "danger" / "warning" / "good" and a hex blue);
# Feishu card header templates (red, orange, blue, green: the names its card header accepts).
SEVERITIES = ("critical", "warning", "info")
SLACK_COLOUR = {"critical": "danger", "warning": "warning", "info": "#439FE0", "": "danger", "resolved": "good"}
FEISHU_TEMPLATE = {"critical": "red", "warning": "orange", "info": "blue", "": "red", "resolved": "green"}


def severity_of(labels: dict) -> str:
    """The alert's severity when it is one of :data:`SEVERITIES`, else ``""`` (shown as plain firing)."""
    s = str(labels.get("severity", "")).strip().lower()
    return s if s in SEVERITIES else ""


def most_urgent(severities) -> str:
    got = set(severities)
    return next((s for s in SEVERITIES if s in got), "")


@dataclass
class AlertView:
    name: str
    status: str
    run: str | None
    step: str | None
    summary: str
    numbers: str
    remedy: str | None
    runbook_url: str | None
    dashboard_url: str | None
    starts_at: str | None
    ends_at: str | None
    labels: dict = field(default_factory=dict)
    severity: str = ""           # info / warning / critical, "" when the alert has none of them

    @property
    def colour_key(self) -> str:
        """What the colour says: ``resolved``, else the severity (``""``: firing without one)."""
        return "resolved" if self.status == "resolved" else self.severity

    @property
    def state(self) -> str:
        """``critical``; ``resolved; was critical``; ``firing`` (no severity label); ``resolved``."""
        if self.status == "resolved":
            return f"resolved; was {self.severity}" if self.severity else "resolved"
        return self.severity or self.status or "firing"


@dataclass
class Message:
    status: str
    title: str
    alerts: list[AlertView]
    more: int                      # alerts left out of the text (MAX_ALERTS_SHOWN)
    external_url: str
    group_key: str
    severity: str = ""             # the most urgent severity among the firing alerts

    @property
    def firing(self) -> bool:
        return self.status == "firing"

    @property
    def colour_key(self) -> str:
        return self.severity if self.firing else "resolved"


def _dashboard(ann: dict, labels: dict, grafana: str | None) -> str | None:
    d = ann.get("dashboard_url")
    if d and d.startswith(("http://", "https://")):
        return d
    if not grafana:
        return None
    base = grafana.rstrip("/")
    if d and d.startswith("/"):
        return base + d
    q = {f"var-{k}": labels[k] for k in ("project", "experiment") if labels.get(k)}
    return base + DEFAULT_DASHBOARD_PATH + ("&" + urlencode(q) if q else "")


_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]+")


def one_line(value) -> str:
    """``value`` as one line of text: control characters, line breaks and direction overrides become one
    space (a run named ``x\\nResolved at …`` cannot add a line to a message)."""
    return _BREAKS.sub(" ", value if isinstance(value, str) else str(value))


def _one_line_map(d) -> dict:
    return {one_line(k): one_line(v) for k, v in d.items()} if isinstance(d, dict) else {}


def _runbook(url: str | None, runbooks: tuple[str, str] | None) -> str | None:
    """The rules link runbooks at the exporter's default address (alerting config ``runbook_base``); an
    exporter on another port serves them itself, so its messages link there (``runbooks`` = (default, own))."""
    if url and runbooks and url.startswith(runbooks[0]):
        return runbooks[1] + url[len(runbooks[0]):]
    return url


def _view(a: dict, grafana: str | None, runbooks: tuple[str, str] | None = None) -> AlertView:
    labels, ann = _one_line_map(a.get("labels")), _one_line_map(a.get("annotations"))
    project, experiment = labels.get("project"), labels.get("experiment")
    run = "/".join(x for x in (project, experiment) if x) or labels.get("instance") or labels.get("job")
    numbers = ann.get("description", "")
    if ann.get("value") and ann["value"] not in numbers:
        numbers = (numbers + f" (value {ann['value']})").strip()
    return AlertView(
        name=labels.get("alertname", "alert"), status=a.get("status", ""), run=run,
        step=ann.get("step") or labels.get("step"), summary=ann.get("summary", ""), numbers=numbers,
        remedy=ann.get("remedy") or ann.get("action"), runbook_url=_runbook(ann.get("runbook_url"), runbooks),
        dashboard_url=_dashboard(ann, labels, grafana), starts_at=go_time(a.get("startsAt")),
        ends_at=go_time(a.get("endsAt")), labels=labels, severity=severity_of(labels))


def build(body: dict, grafana: str | None = None, runbooks: tuple[str, str] | None = None) -> Message:
    alerts = body.get("alerts") or []
    views = [_view(a, grafana, runbooks) for a in alerts[:MAX_ALERTS_SHOWN]]
    status = body.get("status", "firing")
    names = sorted({v.name for v in views})
    runs = sorted({v.run for v in views if v.run})
    firing = [a for a in alerts if isinstance(a, dict) and a.get("status") == "firing"]
    sev = most_urgent(severity_of(_one_line_map(a.get("labels"))) for a in firing)
    if status == "firing":
        head = f"[{(sev or 'firing').upper()}" + (f", {len(firing)} firing]" if len(firing) > 1 else "]")
    else:
        was = most_urgent(v.severity for v in views)
        head = "[RESOLVED" + (f", was {was}]" if was else "]")
    title = f"{head} {', '.join(names)}" + (f" — {', '.join(runs[:3])}" if runs else "") + ("…" if len(runs) > 3 else "")
    return Message(one_line(status), one_line(title), views, max(0, len(alerts) - len(views)),
                   one_line(body.get("externalURL", "")), one_line(body.get("groupKey", "")), sev)


def _lines(v: AlertView) -> list[str]:
    """Plain-text lines of one alert (used by every renderer)."""
    where = " · ".join(x for x in (f"run {v.run}" if v.run else "", f"step {v.step}" if v.step else "") if x)
    out = [f"{v.name} ({v.state})" + (f" — {where}" if where else "")]
    if v.summary:
        out.append(v.summary)
    if v.numbers:
        out.append(v.numbers)
    if v.remedy:
        out.append(f"Remedy: {v.remedy}")
    if v.status == "resolved" and v.ends_at:
        out.append(f"Resolved at {v.ends_at}")
    return out


def text(msg: Message) -> str:
    parts = ["\n".join(_lines(v)) for v in msg.alerts]
    if msg.more:
        parts.append(f"… and {msg.more} more alerts")
    return "\n\n".join(parts)


def _links(v: AlertView) -> list[tuple[str, str]]:
    return [(t, u) for t, u in (("Runbook", v.runbook_url), ("Dashboard", v.dashboard_url)) if u]


# -- renderers ------------------------------------------------------------------------------------
def render_webhook(msg: Message, body: dict, delivery_id: str) -> dict:
    return {
        "version": RELAY_FORMAT_VERSION, "deliveryId": delivery_id, "status": msg.status,
        "severity": msg.severity or None, "title": msg.title, "text": text(msg), "groupKey": msg.group_key,
        "alerts": [{"alertname": v.name, "status": v.status, "severity": v.severity or None, "run": v.run, "step": v.step, "summary": v.summary,
                    "numbers": v.numbers, "remedy": v.remedy, "runbook_url": v.runbook_url,
                    "dashboard_url": v.dashboard_url, "startsAt": v.starts_at, "endsAt": v.ends_at, "labels": v.labels}
                   for v in msg.alerts],
        "notification": body,
    }


def _slack_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_url(u: str) -> str:
    """A URL inside Slack's ``<url|text>``: the characters that would end it percent-encoded."""
    return u.replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def render_slack(msg: Message, channel: str | None = None) -> dict:
    atts = []
    for v in msg.alerts:
        lines = [_slack_escape(x) for x in _lines(v)[1:]]
        links = " | ".join(f"<{_slack_url(u)}|{t}>" for t, u in _links(v))
        fields = [{"title": t, "value": _slack_escape(x), "short": True} for t, x in (("Run", v.run), ("Step", v.step)) if x]
        att = {
            "color": SLACK_COLOUR[v.colour_key], "title": _slack_escape(f"{v.name} ({v.state})"),
            "text": "\n".join(lines + ([links] if links else [])), "fields": fields,
            "fallback": _slack_escape(f"{msg.title}: {v.summary or v.name}"), "mrkdwn_in": ["text"],
        }
        if v.runbook_url or v.dashboard_url:
            att["title_link"] = v.runbook_url or v.dashboard_url
        atts.append(att)
    if msg.more:
        atts.append({"color": "#808080", "text": f"… and {msg.more} more alerts", "fallback": f"{msg.more} more"})
    out = {"text": _slack_escape(msg.title), "attachments": atts, "username": "omniwatch"}
    if channel:
        out["channel"] = channel
    return out


def feishu_literal(s: str) -> str:
    """Text Feishu shows as written: ``<`` followed by a zero-width space, so no ``<at id=all>``,
    ``<at user_id=…>`` or other tag can form (Feishu has no escape for plain text; the character is
    invisible)."""
    return s.replace("<", "<\u200b")


def render_feishu(msg: Message, fmt: str = "interactive") -> dict:
    """Every user-controlled text goes as plain text: ``text`` post elements, ``plain_text`` card elements
    (``lark_md`` would turn a run named ``<at id=all></at>`` into an @-mention of everyone)."""
    if fmt == "post":
        content = []
        for v in msg.alerts:
            content += [[{"tag": "text", "text": feishu_literal(x)}] for x in _lines(v)]
            if _links(v):
                content.append([{"tag": "a", "text": t + " ", "href": u} for t, u in _links(v)])
        if msg.more:
            content.append([{"tag": "text", "text": f"… and {msg.more} more alerts"}])
        return {"msg_type": "post", "content": {"post": {"zh_cn": {"title": feishu_literal(msg.title), "content": content}}}}
    elements: list[dict] = []
    for i, v in enumerate(msg.alerts):
        if i:
            elements.append({"tag": "hr"})
        lines = [feishu_literal(x) for x in _lines(v)]
        elements.append({"tag": "div", "text": {"tag": "plain_text", "content": "\n".join(lines)}})
        if _links(v):
            elements.append({"tag": "action", "actions": [
                {"tag": "button", "text": {"tag": "plain_text", "content": t}, "url": u, "type": "default"}
                for t, u in _links(v)]})
    if msg.more:
        elements.append({"tag": "div", "text": {"tag": "plain_text", "content": f"… and {msg.more} more alerts"}})
    return {"msg_type": "interactive", "card": {
        "config": {"wide_screen_mode": True},
        "header": {"title": {"tag": "plain_text", "content": feishu_literal(msg.title)},
                   "template": FEISHU_TEMPLATE[msg.colour_key]},
        "elements": elements}}


def feishu_sign(secret: str, timestamp: int | None = None) -> dict:
    """Feishu/Lark custom-bot signature: base64(HMAC-SHA256(key="{timestamp}\\n{secret}", msg=""))."""
    ts = int(time.time()) if timestamp is None else int(timestamp)
    digest = hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return {"timestamp": str(ts), "sign": base64.b64encode(digest).decode()}
