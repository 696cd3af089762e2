"""Alertmanager webhook receiver and relay: stores every notification durably (SQLite), serves the
alert history, and forwards to Slack / Feishu / generic webhooks with retries. See docs/relay.md."""
from .api import init, router
from .commands import add_commands

__all__ = ["router", "init", "add_commands"]
