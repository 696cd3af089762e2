"""Where the native stack's alerts go: Slack / Feishu / any webhook through the exporter's relay, set up by
``omniwatch up`` in one of two ways —

* ``--receivers FILE``: a relay receivers file (docs/relay.md), passed to the exporter as is;
* ``OMNIWATCH_SLACK_URL`` / ``OMNIWATCH_FEISHU_URL`` / ``OMNIWATCH_NOTIFY_WEBHOOK_URL`` in the environment
  (``make up SLACK_URL=...`` sets the first): ``up`` writes ``<run dir>/config/receivers.yml`` naming the
  variables (never their values: the URLs are secrets and reach the exporter by its environment, as
  ``<VAR>_FILE`` naming the 0600 copy ``up`` keeps so that a later ``up`` keeps them: upkeep.py).

``up`` and ``status`` then print each receiver the running exporter loaded, or how to add one."""
from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from .settings import read_secret

RELAY_CONFIG_ENV = "OMNIWATCH_RELAY_CONFIG"
# receiver name, relay type, the environment variable holding its URL
FROM_ENV = (("slack", "slack", "OMNIWATCH_SLACK_URL"), ("feishu", "feishu", "OMNIWATCH_FEISHU_URL"),
            ("webhook", "webhook", "OMNIWATCH_NOTIFY_WEBHOOK_URL"))


def receivers_file(config_dir: Path, lookup=read_secret, names=None) -> Path | None:
    """Write the receivers file for the URL variables set now (``lookup``: also those an earlier ``up`` kept,
    upkeep.py; ``names``: only these); None when none is set."""
    found = [(name, kind, var) for name, kind, var in FROM_ENV
             if (names is None or var in names) and lookup(var)]
    if not found:
        return None
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / "receivers.yml"
    # a digest of the URLs (not them): a changed URL changes this file, and `up` restarts the exporter
    digest = hashlib.sha256("\n".join(lookup(var) or "" for _, _, var in found).encode()).hexdigest()[:12]
    path.write_text(f"# written by `omniwatch up` from the environment: the URLs stay in these variables ({digest})\n"
                    "receivers:\n" + "".join(f"  - name: {name}\n    type: {kind}\n    url_env: {var}\n"
                                             f"    exclude: {{alertname: Watchdog}}\n"
                                             for name, kind, var in found))
    return path


def exporter_env(receivers: str | None, config_dir: Path, lookup=read_secret, names=None) -> dict[str, str]:
    """The exporter's relay configuration: the file given, else one written from the environment."""
    if receivers:
        return {RELAY_CONFIG_ENV: str(Path(receivers).resolve())}
    path = receivers_file(config_dir, lookup, names)
    return {RELAY_CONFIG_ENV: str(path)} if path else {}


def rows(exporter_url: str, timeout: float = 3.0) -> list[tuple[str, str]]:
    """(name, value) rows about the receivers the running exporter loaded."""
    try:
        r = httpx.get(f"{exporter_url}/api/v1/relay/status", timeout=timeout)
        status = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        status = None
    if status is None:
        return []
    if status.get("config_error"):
        return [("notify", f"receivers file unusable: {status['config_error']}"[:200])]
    out = []
    for x in status.get("receivers", []):
        state = "ok" if x.get("enabled") else f"DISABLED: {x.get('config_error')}"
        out.append(("notify", f"{x['name']} ({x.get('type') or '?'}): {state}, {x.get('delivered', 0)} delivered, "
                              f"{x.get('pending', 0)} pending, {x.get('failed', 0)} failed"))
    if not out:
        out = [("notify", "nowhere but `omniwatch alerts`: make up SLACK_URL=<url>,"),
               ("", "or omniwatch up --receivers FILE (docs/relay.md)")]
    return out
