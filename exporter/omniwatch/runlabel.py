"""A run's ``project`` / ``experiment`` label from a name that comes from outside (a directory, a file
name, a pushed field): what every path that makes or looks up a run uses, so a run is one run everywhere.

- **Control characters are stripped** (C0, DEL, C1, line/paragraph separators and the bidirectional
  overrides): a label is shown in alert messages, pages and terminals, where a newline would plant a fake
  line and an override would reorder the text (issue 25 item 5).
- **A name over** :data:`MAX_LABEL_CHARS` **is shortened to a unique label**: its first 119 characters,
  ``~`` and the first 8 hex digits of the SHA-256 of the whole (cleaned) name — 128 characters. Two sweep
  runs that share their first 128 characters stay two runs, and a lookup by the full name finds the run
  (issue 25 item 9). :func:`shortened` says how, for the log and the reports.

Both are idempotent: a label made here is returned unchanged.

The run a file belongs to (:func:`run_labels`): verl's FileLogger writes
``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`` (verl/utils/tracking.py), so the parent directory is the
project and the name (without its suffix) the experiment; the file sources, the planned-work log-writer check, the
checkpoint and the backtest share it (:func:`raw_run_labels` gives the names as they are on disk).
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

MAX_LABEL_CHARS = 128
HASH_CHARS = 8
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def strip_control(text: str) -> str:
    """``text`` without control characters (kept: everything printable, any script)."""
    return _CONTROL.sub("", text)


@lru_cache(maxsize=1 << 14)
def fit_label(name: str) -> str:
    """The label of ``name``: control characters stripped; over :data:`MAX_LABEL_CHARS`, its head, ``~``
    and 8 hex of its SHA-256 (exactly 128 characters). Empty after stripping: ``_``."""
    clean = strip_control(name) or "_"
    if len(clean) <= MAX_LABEL_CHARS:
        return clean
    digest = hashlib.sha256(clean.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{clean[:MAX_LABEL_CHARS - HASH_CHARS - 1]}~{digest}"


def shortened(name: str) -> str | None:
    """How ``name`` became its label (None: it is its own label), said once in the log and in reports."""
    label = fit_label(name)
    if label == name:
        return None
    clean = strip_control(name)
    what = []
    if clean != name:
        what.append(f"{len(name) - len(clean)} control character(s) removed")
    if len(clean) > MAX_LABEL_CHARS:
        what.append(f"{len(clean)} characters shortened to {MAX_LABEL_CHARS} (the first "
                    f"{MAX_LABEL_CHARS - HASH_CHARS - 1}, '~' and {HASH_CHARS} hex digits of the SHA-256 of the whole name)")
    return "; ".join(what) or "empty name"


def raw_run_labels(path: str) -> tuple[str, str]:
    p = Path(path)
    name = p.name
    for suffix in (".console.log", ".jsonl", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return (p.parent.name or "default"), name


def run_labels(path: str) -> tuple[str, str]:
    project, experiment = raw_run_labels(path)
    return fit_label(project), fit_label(experiment)
