"""``omniwatch alerts``: recent alerts and relay delivery status, read from a running exporter."""
from __future__ import annotations

import datetime as dt
import json
import sys

import httpx

from .. import cliargs

DEFAULT_URL = "http://127.0.0.1:19095"


def _ts(v) -> str:
    if isinstance(v, (int, float)):
        return dt.datetime.fromtimestamp(v, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return (v or "-").replace("T", " ")[:19]


def fetch(url: str, limit: int, status: str | None = None, timeout: float = 10.0) -> tuple[list, dict]:
    params = {"limit": limit, **({"status": status} if status else {})}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout) as c:
        a = c.get("/api/v1/alerts", params=params)
        a.raise_for_status()
        s = c.get("/api/v1/relay/status")
        s.raise_for_status()
    return a.json(), s.json()


def render(alerts: list, status: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"Recent alerts ({len(alerts)})")
    for col in ("received", "status", "alert", "run", "step", "summary", "ends"):
        t.add_column(col, overflow="fold")
    for a in alerts:
        lab, ann = a.get("labels", {}), a.get("annotations", {})
        run = "/".join(x for x in (lab.get("project"), lab.get("experiment")) if x) or lab.get("instance", "-")
        color = "red" if a.get("status") == "firing" else "green"
        # every cell from the alert is text, never console markup (a run named "a[/]b" must not crash this)
        t.add_row(_ts(a.get("receivedAt")), Text(str(a.get("status")), style=color), Text(str(lab.get("alertname", "-"))),
                  Text(str(run)), Text(str(ann.get("step", "-"))), Text(str(ann.get("summary", ""))[:80]),
                  _ts(a.get("endsAt")))
    console.print(t)
    r = Table(title=f"Relay (notifications {status.get('notifications', 0)}, duplicates {status.get('duplicates', 0)})")
    for col in ("receiver", "type", "enabled", "pending", "delivered", "failed", "last error"):
        r.add_column(col, overflow="fold")
    for x in status.get("receivers", []):
        r.add_row(Text(str(x["name"])), Text(str(x.get("type") or "-")),
                  "yes" if x.get("enabled") else Text(f"no: {x.get('config_error')}"),
                  str(x["pending"]), str(x["delivered"]), str(x["failed"]), Text((x.get("last_error") or "")[:80]))
    console.print(r)
    if status.get("config_error"):
        console.print(f"[red]relay config error:[/red] {escape(str(status['config_error']))}")


def default_url() -> str:
    """``OMNIWATCH_URL`` when set, else the exporter on loopback at ``OMNIWATCH_EXPORTER_PORT`` (19095)."""
    from ..settings import Settings
    s = Settings()
    return s.url if "url" in s.model_fields_set else f"http://127.0.0.1:{s.port}"


def cmd_alerts(args) -> int:
    from rich.console import Console

    url = args.url or default_url()
    try:
        alerts, status = fetch(url, args.limit, args.status)
    except httpx.HTTPStatusError as e:
        try:
            detail = e.response.json().get("detail", e.response.text)
        except ValueError:
            detail = e.response.text
        print(f"omniwatch alerts: {url} answered HTTP {e.response.status_code}: {str(detail)[:200]}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, ValueError) as e:
        print(f"omniwatch alerts: cannot read {url}: {type(e).__name__}: {e} (is the stack up? omniwatch status)",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"alerts": alerts, "relay": status}, indent=2))
    else:
        render(alerts, status, Console())
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("alerts", help="recent alerts and relay delivery status from a running exporter")
    p.add_argument("--url", default=None, help="exporter base URL (default: $OMNIWATCH_URL, else "
                   "http://127.0.0.1:$OMNIWATCH_EXPORTER_PORT, i.e. " + DEFAULT_URL + ")")
    p.add_argument("--limit", type=cliargs.int_range(1, 1000), default=20, help="how many alerts (1..1000, default 20)")
    p.add_argument("--status", choices=["firing", "resolved"], help="only alerts with this status")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_alerts)
