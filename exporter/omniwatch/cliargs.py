"""Argument types for the ``omniwatch`` commands: each flag is checked by argparse while it parses, so a
bad value is one line (``omniwatch serve: error: argument --listen: ...``) before a command does anything
(starts, stops or wipes), never a traceback or a server's raw error."""
from __future__ import annotations

import argparse


def _number(kind, value: str, what: str):
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None


def int_range(lo: int, hi: int | None = None):
    """An integer in [lo, hi] (hi None: no upper bound)."""
    def check(value: str) -> int:
        n = _number(int, value, "an integer")
        if n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"{n} is out of range: " + (f"{lo}..{hi}" if hi is not None
                                                                          else f"at least {lo}"))
        return n
    check.__name__ = "integer"
    return check


positive_int = int_range(1)
nonneg_int = int_range(0)


def port(value: str) -> int:
    n = _number(int, value, "a port number")
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a port (1..65535)")
    return n


def positive_float(value: str) -> float:
    x = _number(float, value, "a number")
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return x


def nonneg_float(value: str) -> float:
    x = _number(float, value, "a number")
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return x


def listen(value: str) -> str:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (the host defaults to loopback); kept as the string given."""
    from .settings import parse_listen
    try:
        host, p = parse_listen(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:19095)") from None
    if not 1 <= p <= 65535 or not host or " " in host:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT with a port in 1..65535")
    return value
