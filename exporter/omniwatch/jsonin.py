"""JSON bodies from the network, bounded: every write endpoint (push, webhook, phases, agents) decodes
its body here, so a hostile body is a counted 4xx with a reason, never a ``RecursionError`` (the stdlib
decoder recurses once per nesting level) nor a 500.

orjson decodes without Python recursion and stops at 1024 levels; the tree is then walked iteratively
and refused beyond ``MAX_DEPTH`` levels (the deepest legitimate body, an Alertmanager webhook, has 4),
so nothing downstream (pydantic, redaction, SQLite, the relay's renderers) ever sees a deep tree."""
from __future__ import annotations

import orjson

MAX_DEPTH = 32


class BodyError(ValueError):
    """``reason`` is the ``omniwatch_ingest_errors_total`` label; the message names no value."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def depth(obj, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a decoded JSON tree (a scalar is 0), walked without recursion; stops counting
    once past ``limit``."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        d += 1
        if d > deepest:
            deepest = d
            if d > limit:
                return d
        stack.extend((child, d) for child in node if isinstance(child, (dict, list)))
    return deepest


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH):
    """Decode ``raw`` or raise :class:`BodyError` (malformed_json, number_out_of_range, too_deep)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        msg = str(e)
        if "depth limit" in msg or "recursion" in msg.lower():
            raise BodyError("too_deep", f"body nests deeper than {max_depth} levels") from None
        if "infinity" in msg or "number" in msg and "out of range" in msg:
            raise BodyError("number_out_of_range", f"a number in the body is out of range: {msg[:80]}") from None
        raise BodyError("malformed_json", f"body is not valid JSON: {msg[:100]}") from None
    if depth(obj, max_depth) > max_depth:
        raise BodyError("too_deep", f"body nests deeper than {max_depth} levels")
    return obj
