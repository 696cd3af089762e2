"""``omniwatch up --exporter-bind ADDR``: the native stack on the head node of a cluster. The exporter
listens on ADDR so node agents on other hosts can register (``POST /api/v1/agents``, bearer push token)
and Prometheus scrapes them through the exporter's HTTP service discovery; Prometheus and Alertmanager
stay on 127.0.0.1. ``up`` states the bind address, what it exposes, and the agents command to run."""
from __future__ import annotations

import argparse
import ipaddress
import socket
from pathlib import Path


def bind_address(value: str) -> str:
    """An IP address to listen on (``0.0.0.0``, ``::``, or one of this host's)."""
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address (0.0.0.0, or the head node's IP)") from None


def advertised(bind: str) -> str:
    """The address other hosts use: the bind address, or this host's name when it binds every interface."""
    return socket.gethostname() if bind in ("0.0.0.0", "::") else bind


def rows(bind: str | None, port: int, push_token: Path) -> list[tuple[str, str]]:
    if not bind:
        return []
    host = advertised(bind)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    return [("listening", f"exporter on {bind}:{port}: /metrics readable from other hosts;"),
            ("", "push and agent registration need the push token"),
            ("agents", "on the Ray head, with the token file readable there:"),
            ("", f"OMNIWATCH_PUSH_TOKEN_FILE={push_token}"),
            ("", f"omniwatch agents start --ray-address auto --exporter {url}")]
