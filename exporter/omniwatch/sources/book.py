"""What a file source has read, per watch spec and per file: whether each spec exists, how many files and
runs it yields, how many lines were read and skipped (by reason), and where the first bad lines are.

It serves ``omniwatch status`` (through ``/api/v1/sources``) and logs malformed input: the file and line
number of the first :data:`FIRST_BAD` bad lines of each file, then at most one summary per file every
:data:`SUMMARY_SECONDS` — never one log line per bad line. A spec that matches nothing (a typo, or a run
that has not started) is said once, loudly, and watched for; its appearance is said once too.

Line numbers count the lines this exporter read from the start of the file; a file resumed from a
checkpoint counts from where it resumed (``resumed`` is set then)."""
from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..redact import redact

log = logging.getLogger("omniwatch.sources.files")

FIRST_BAD = 3            # bad lines of one file logged one by one
SUMMARY_SECONDS = 60.0   # then one summary line per file at most this often
FIRST_BAD_KEPT = 5       # line numbers kept per file for status


@dataclass
class FileBook:
    lines: int = 0          # lines read (a line too long counts too)
    applied: int = 0        # lines that became a step
    skipped: dict = field(default_factory=lambda: defaultdict(int))  # reason -> lines
    first_bad: list = field(default_factory=list)  # [(line number, reason)], the first few
    resumed: bool = False
    unlogged: int = 0       # bad lines since the last log line about this file
    logged_at: float = 0.0


class SourceBook:
    def __init__(self, kind: str, clock=time.monotonic):
        self.kind, self.clock = kind, clock
        self.files: dict[str, FileBook] = {}
        self.missing: set[str] = set()   # specs that matched nothing at the last scan

    # -- specs ---------------------------------------------------------------------------------------
    def spec_seen(self, spec: str, matched: int) -> None:
        """After a scan of ``spec``: say once that it matches nothing, and once that it appeared."""
        if matched == 0 and spec not in self.missing:
            self.missing.add(spec)
            what = "does not exist" if not os.path.exists(spec) else "holds no run log yet"
            log.warning("%s source: watch path %s %s — watching for it (verl creates "
                        "<root>/<project>/<experiment>.jsonl when the run starts; check the path for a typo)",
                        self.kind, redact(spec), what)
        elif matched and spec in self.missing:
            self.missing.discard(spec)
            log.info("%s source: watch path %s appeared (%d file(s))", self.kind, redact(spec), matched)

    # -- lines ---------------------------------------------------------------------------------------
    def file(self, path: str) -> FileBook:
        book = self.files.get(path)
        if book is None:
            book = self.files[path] = FileBook()
        return book

    def restarted(self, path: str) -> None:
        """The file was truncated (a restarted trainer): line numbers start again."""
        book = self.file(path)
        book.lines = 0

    def read(self, path: str, book: FileBook, n: int = 1) -> int:
        """Count ``n`` lines read; the line number of the last."""
        book.lines += n
        return book.lines

    def bad(self, path: str, book: FileBook, lineno: int, reason: str, n: int = 1) -> None:
        book.skipped[reason] += n
        if len(book.first_bad) < FIRST_BAD_KEPT:
            book.first_bad.append((lineno, reason))
        total = sum(book.skipped.values())
        now = self.clock()
        where = f"line {lineno}" + (" (counted from where it resumed)" if book.resumed else "")
        if total <= FIRST_BAD:
            log.warning("%s source: %s %s skipped: %s", self.kind, redact(path), where, reason)
            book.logged_at = now
            return
        book.unlogged += n
        if now - book.logged_at >= SUMMARY_SECONDS:
            log.warning("%s source: %s: %d more line(s) skipped (last: %s, %s); %d of %d lines skipped so far",
                        self.kind, redact(path), book.unlogged, where, reason, total, book.lines)
            book.unlogged, book.logged_at = 0, now

    # -- status --------------------------------------------------------------------------------------
    def describe(self, specs: list[str], spec_of: dict[str, str], labels: dict[str, tuple]) -> list[dict]:
        """One entry per spec: exists, files, runs with steps, lines read and skipped by reason."""
        out = []
        for spec in specs:
            paths = [p for p, s in spec_of.items() if s == spec]
            skipped: dict[str, int] = defaultdict(int)
            lines = 0
            first_bad = []
            for p in paths:
                b = self.files.get(p)
                if b is None:
                    continue
                lines += b.lines
                for reason, n in b.skipped.items():
                    skipped[reason] += n
                first_bad += [{"file": redact(p), "line": ln, "reason": r} for ln, r in b.first_bad[:2]]
            runs = {labels[p] for p in paths if p in labels and (b := self.files.get(p)) and b.applied}
            files = sum(1 for p in paths if os.path.isfile(p))
            out.append({"kind": self.kind, "spec": redact(spec), "exists": os.path.exists(spec) or files > 0,
                        "files": files, "runs": len(runs), "lines": lines, "skipped": dict(skipped),
                        "first_bad": first_bad[:FIRST_BAD_KEPT]})
        return out
