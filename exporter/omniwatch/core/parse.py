"""Parsers for the two verl Tracking outputs omniwatch reads: the ``file`` backend's JSONL and the
``console`` backend's ``step:N - key:value - ...`` lines.

Both return a :class:`ParsedStep` (or ``None`` plus a reason) and never raise on bad input: a bad line
is a counted skip, a bad value inside a good line is dropped and counted, the rest of the line is kept.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import orjson

from ..redact import is_secret_key

MAX_KEY_CHARS = 256


@dataclass
class ParsedStep:
    step: int
    values: dict[str, float]
    # reason -> count of values dropped from this line (non_numeric, non_finite, key_too_long)
    dropped: dict[str, int] = field(default_factory=dict)
    # keys whose value was NaN / +-Inf (orjson writes them as null): dropped from ``values`` (and counted
    # as non_finite) but kept as a fact of the step, e.g. a non-finite actor/grad_norm = a skipped update
    non_finite: tuple[str, ...] = ()


class LineError(Exception):
    """A whole line was skipped; ``reason`` is the ingest_errors_total label."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


_STEP_TEXT = re.compile(r"-?[0-9]{1,13}")  # a bounded number of ASCII digits: never int("9" * 5000)


def _coerce_step(raw) -> int:
    if isinstance(raw, bool) or raw is None:
        raise LineError("bad_step", repr(raw)[:40])
    if isinstance(raw, int):
        step = raw
    elif isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        step = int(raw)
    elif isinstance(raw, str) and _STEP_TEXT.fullmatch(raw.strip()):
        step = int(raw.strip())  # ASCII digits only ("²".isdigit() is True; int("²") raises)
    else:
        raise LineError("bad_step", repr(raw)[:40])
    if step < 0 or step > 10**12:
        raise LineError("bad_step", str(step))
    return step


_KEY_OK: dict[str, bool] = {}  # key -> a string within MAX_KEY_CHARS, not named like a secret
_KEYS_OK: set[str] = set()     # the acceptable keys of _KEY_OK (one C-level subset test per line)
_KEY_CACHE_MAX = 1 << 16


def _key_ok(key) -> bool:
    ok = _KEY_OK.get(key) if type(key) is str else None
    if ok is None:
        ok = type(key) is str and 0 < len(key) <= MAX_KEY_CHARS and not is_secret_key(key)
        if type(key) is str and len(_KEY_OK) < _KEY_CACHE_MAX:
            _KEY_OK[key] = ok
            if ok:
                _KEYS_OK.add(key)
    return ok


def clean_values(data: dict, non_finite: list | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """Keep finite numeric values; count what was dropped and why. Keys named like a secret
    (``HF_TOKEN``, ``env/WANDB_API_KEY``) are dropped whatever their value: a key becomes a label.
    The common case (a known key, a finite float) costs one dict lookup; the rest takes the slow path.
    ``non_finite``, when given, collects the (acceptable) keys whose value was NaN / +-Inf / null."""
    if data.keys() <= _KEYS_OK:  # the usual line: keys seen and accepted before, every value a finite number
        try:
            total = sum(data.values())  # TypeError unless every value is a number (null, a string, a list)
        except TypeError:
            total = None
        if total is not None and total - total == 0:  # finite, so every value is (a NaN or an Inf makes the sum one)
            try:
                return dict(zip(data, map(float, data.values()))), {}
            except OverflowError:  # an integer beyond a float: the slow path says so
                pass
    values: dict[str, float] = {}
    dropped: dict[str, int] = {}
    key_ok = _KEY_OK.get
    for key, v in data.items():
        t = type(v)
        if t is float:
            if v - v == 0.0 and key_ok(key):  # finite: inf - inf and nan - nan are nan
                values[key] = v
                continue
        elif t is int and key_ok(key):
            values[key] = float(v)
            continue
        if not _key_ok(key):
            if isinstance(key, str) and key and len(key) <= MAX_KEY_CHARS:
                reason = "secret_key"
            else:
                reason = "key_too_long" if isinstance(key, str) and key else "bad_key"
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)):
            f = float(v)
            if math.isfinite(f):
                values[key] = f
            else:
                dropped["non_finite"] = dropped.get("non_finite", 0) + 1
                if non_finite is not None:
                    non_finite.append(key)
        elif v is None:  # orjson writes NaN/Inf as null
            dropped["non_finite"] = dropped.get("non_finite", 0) + 1
            if non_finite is not None:
                non_finite.append(key)
        else:
            dropped["non_numeric"] = dropped.get("non_numeric", 0) + 1
    return values, dropped


def parse_record(obj) -> ParsedStep:
    """A decoded ``{"step": N, "data": {...}}`` object (JSONL line or push body)."""
    if not isinstance(obj, dict):
        raise LineError("not_object", type(obj).__name__)
    if "step" not in obj:
        raise LineError("missing_step")
    step = _coerce_step(obj["step"])
    data = obj.get("data")
    if not isinstance(data, dict):
        raise LineError("missing_data", type(data).__name__)
    nf: list[str] = []
    values, dropped = clean_values(data, nf)
    return ParsedStep(step, values, dropped, tuple(nf))


def parse_jsonl_line(line: bytes | str) -> ParsedStep:
    """One line written by verl's FileLogger: ``orjson.dumps({"step": step, "data": data})``."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise LineError("malformed_json", str(e)[:80]) from None
    return parse_record(obj)


# verl LocalLogger: "step:<N> - k:v - k:v"; Ray may prefix "(TaskRunner pid=1) ". numpy>=2 prints
# np.float64(0.1); the nightly parser strips it the same way.
_CONSOLE_STEP = re.compile(r"(?:^|[\s)\]])step:(\d+)((?: - [^\n]*)?)$")
_NP_WRAPPED = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")


def _console_value(text: str):
    text = text.strip()
    m = _NP_WRAPPED.match(text)
    if m:
        text = m.group(1).strip()
    try:
        return float(text)
    except ValueError:
        if text in ("True", "False"):
            return 1.0 if text == "True" else 0.0
        return text  # a string: dropped as non_numeric by clean_values


def parse_console_line(line: bytes | str) -> ParsedStep:
    """One ``console`` backend line. Lines that are not step lines raise ``LineError('not_a_step_line')``
    (the console source ignores those without counting them: stdout carries other logs)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.rstrip("\r\n")
    m = _CONSOLE_STEP.search(line)
    if not m:
        raise LineError("not_a_step_line")
    step = _coerce_step(int(m.group(1)))
    data: dict = {}
    rest = m.group(2)
    if rest:
        for part in rest[3:].split(" - "):
            key, sep, val = part.partition(":")
            if not sep or not key.strip():
                data.setdefault("\x00malformed", 0)
                continue
            data[key.strip()] = _console_value(val)
    malformed = data.pop("\x00malformed", None)
    nf: list[str] = []
    values, dropped = clean_values(data, nf)
    if malformed is not None:
        dropped["malformed_pair"] = dropped.get("malformed_pair", 0) + 1
    return ParsedStep(step, values, dropped, tuple(nf))
