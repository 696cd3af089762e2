"""File sources: verl's ``file`` logger JSONL and its ``console`` backend lines.

A watch spec is one file, a glob, or a directory laid out as verl's ``VERL_FILE_LOGGER_ROOT``
(``<root>/<project>/<experiment>.jsonl``). Every file's runs are labelled ``project`` = its parent
directory's name and ``experiment`` = its name without the suffix(es) — exactly verl's layout.
One thread per source polls all its files; parsing and ingestion are the model's, errors are counted.
"""
from __future__ import annotations

import fnmatch
import glob
import logging
import os
import threading
import time
from pathlib import Path

from prometheus_client.registry import Collector

from .. import names
from ..model import RunStore
from ..parse import LineError, ParsedStep, parse_console_line, parse_jsonl_line
from ..planned import total_steps_in
from ..redact import looks_like_credential, redact
from .book import SourceBook
from .layout import run_labels
from .tail import DEFAULT_MAX_OPEN, UNCHANGED, FdPool, FileTail, NotRegularFile, OutsideRoot, escapes

log = logging.getLogger(__name__)

RESCAN_SECONDS = 2.0
IDLE_AFTER_POLLS = 60  # unchanged this many polls in a row (30 s at the default 0.5 s) ...
IDLE_EVERY = 4         # ... then looked at every 4th poll


class FileSource:
    """Follow every file matched by ``specs``; ``kind`` is ``jsonl`` or ``console``.

    Files found *under* a directory or glob spec must resolve inside it: a symlink pointing out of the
    watch root (``/shared/verl-logs/p/x.jsonl -> /home/me/.netrc``) is refused unless
    ``follow_symlinks``; a file named explicitly is the user's choice and is followed. A path whose
    project or experiment label would look like a credential is refused (labels are shown everywhere).
    Each refusal and each unreadable file (a FIFO, a device, permission denied) is logged once and
    counted once, not on every poll."""

    def __init__(self, store: RunStore, specs: list[str], kind: str = "jsonl", *,
                 poll_seconds: float = 0.5, max_line: int = 1 << 20, clock=time.time,
                 max_open: int = DEFAULT_MAX_OPEN, follow_symlinks: bool = False):
        if kind not in ("jsonl", "console"):
            raise ValueError(kind)
        self.store, self.specs, self.kind = store, list(specs), kind
        self.poll_seconds, self.max_line, self.clock = poll_seconds, max_line, clock
        self.follow_symlinks = follow_symlinks
        self.parse = parse_jsonl_line if kind == "jsonl" else parse_console_line
        self.pool = FdPool(max_open)
        self.tails: dict[str, FileTail] = {}
        self._labels: dict[str, tuple[str, str]] = {}
        self._problems: dict[str, str] = {}  # path -> the problem last reported for it (logged once)
        self.book = SourceBook(kind)  # lines read/skipped per file, missing specs (status, logs)
        self._spec_of: dict[str, str] = {}  # path -> the spec that found it
        self.poll_lock = threading.Lock()  # a checkpoint sees offsets and the model at one point
        self._resume: dict[str, dict] = {}
        self._last_scan = 0.0
        self._pass = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for spec in self.specs:
            store.set_source_up(kind, redact(spec), True)

    # -- file discovery ----------------------------------------------------------------------------
    def _pattern(self) -> str:
        return "*.jsonl" if self.kind == "jsonl" else "*.log"

    def _root(self, spec: str) -> str | None:
        """The resolved directory files found through ``spec`` must stay in (None: a file named explicitly)."""
        if os.path.isdir(spec):
            return os.path.realpath(spec)
        if glob.has_magic(spec):
            parts = []
            for part in Path(spec).parts:
                if glob.has_magic(part):
                    break
                parts.append(part)
            return os.path.realpath(os.path.join(*parts)) if parts else os.path.realpath(".")
        return None

    def _expand(self, spec: str) -> list[str]:
        if os.path.isdir(spec):
            # <root>/<project>/<experiment>.jsonl (VERL_FILE_LOGGER_ROOT), or files directly in it. scandir:
            # the entry types come with the listing, no stat per file (a root may hold thousands).
            pat, found = self._pattern(), []
            with os.scandir(spec) as top:
                for e in top:
                    try:
                        if e.is_dir():
                            with os.scandir(e.path) as sub:
                                found += [f.path for f in sub if fnmatch.fnmatchcase(f.name, pat) and f.is_file()]
                        elif fnmatch.fnmatchcase(e.name, pat) and e.is_file():
                            found.append(e.path)
                    except OSError:
                        continue  # a project dir removed or unreadable while listing
            return sorted(found)
        if glob.has_magic(spec):
            return sorted(p for p in glob.glob(spec) if os.path.isfile(p))
        return [spec]  # a single file, perhaps not there yet: waited for

    def watches(self, path: str) -> bool:
        """``path`` is one of the files this source follows now (it exists, a spec matches it, and it is
        not refused)."""
        if not os.path.isfile(path):
            return False
        for spec in self.specs:
            if path in self._expand(spec):
                return self._refusal(path, self._root(spec)) is None
        return False

    def _refusal(self, path: str, root: str | None, labels: tuple[str, str] | None = None,
                 checks: list[str] | None = None) -> tuple[str, str] | None:
        """(counted reason, log text) when ``path`` must not be followed, else None."""
        project, experiment = labels or run_labels(path)
        for what, label in (("project", project), ("experiment", experiment)):
            if looks_like_credential(label):
                return f"credential_in_{what}", f"its {what} label would look like a credential"
        if root is not None and not self.follow_symlinks and escapes(root, path, checks):
            return "symlink_outside_root", "it resolves (symlink) outside the watched directory; " \
                                           "pass --follow-symlinks to follow it"
        return None

    @staticmethod
    def _checks(spec: str, path: str) -> list[str] | None:
        """The components of ``path`` below the directory ``spec`` (None: not found under it as given)."""
        base = spec.rstrip(os.sep) + os.sep
        if not path.startswith(base):
            return None
        parts = path[len(base):].split(os.sep)
        return [base + os.sep.join(parts[: i + 1]) for i in range(len(parts))]

    def _report(self, path: str, reason: str | None, text: str = "", level=logging.WARNING) -> None:
        """Log and count a problem with ``path`` once (again only after it went away or changed)."""
        if reason is None:
            if self._problems.pop(path, None) is not None:
                log.info("%s source: %s is readable again", self.kind, redact(path))
            return
        if self._problems.get(path) == reason:
            return
        self._problems[path] = reason
        self.store.count_error(self.kind, reason)
        log.log(level, "%s source: not following %s: %s", self.kind, redact(path), text)

    def scan(self) -> None:
        for spec in self.specs:
            try:
                root = self._root(spec)
                is_dir = os.path.isdir(spec)
                found = self._expand(spec)
                self.book.spec_seen(spec, len(found) if is_dir or glob.has_magic(spec) else int(os.path.exists(spec)))
                for path in found:
                    if path in self.tails:
                        continue
                    labels = run_labels(path)
                    checks = self._checks(spec, path) if is_dir else None
                    try:
                        refused = self._refusal(path, root, labels, checks)
                    except OSError:
                        continue  # gone while we looked: the next scan sees what is there
                    if refused is not None:
                        self._report(path, *refused)
                        continue
                    self._report(path, None)
                    confined = root is not None and not self.follow_symlinks
                    tail = FileTail(path, self.max_line, pool=self.pool, confine=root if confined else None,
                                    checks=checks)
                    if path in self._resume:
                        tail.resume_from(self._resume.pop(path))
                        self.book.file(path).resumed = True
                    self.tails[path] = tail
                    self._spec_of[path] = spec
                    self._labels[path] = labels
                self.store.set_source_up(self.kind, redact(spec), True)
            except OSError as e:
                log.warning("%s source cannot list %s: %s", self.kind, redact(spec), redact(str(e)))
                self.store.set_source_up(self.kind, redact(spec), False)
        self._last_scan = self.clock()

    # -- checkpoint support ----------------------------------------------------------------------
    def offsets(self) -> dict[str, dict]:
        out = {p: pos for p, t in self.tails.items() if (pos := t.position()) is not None}
        out.update({p: pos for p, pos in self._resume.items() if p not in out})
        return out

    def restore_offsets(self, saved: dict[str, dict]) -> None:
        self._resume = dict(saved)

    # -- one polling pass (public for tests and replay) ---------------------------------------------
    def poll_once(self) -> int:
        with self.poll_lock:
            return self._poll_once()

    def _poll_once(self) -> int:
        if self.clock() - self._last_scan >= RESCAN_SECONDS or not self.tails:
            self.scan()
        applied = 0
        self._pass += 1
        problems = self._problems
        for i, (path, tail) in enumerate(list(self.tails.items())):
            if not i & 255 and self._stop.is_set():
                break  # shutting down: the checkpoint holds the offsets of what was read
            # A file unchanged for IDLE_AFTER_POLLS polls (a finished or stalled run) is looked at every
            # IDLE_EVERY-th poll, spread over the passes: thousands of idle files cost a quarter of the stat()s,
            # and a run that resumes is seen at most IDLE_EVERY polls late.
            if tail.unchanged_polls >= IDLE_AFTER_POLLS and (self._pass + i) % IDLE_EVERY:
                continue
            try:
                res = tail.poll()
            except NotRegularFile as e:
                self._report(path, "not_regular_file", str(e.strerror or e))
                self.store.set_source_up(self.kind, redact(path), False)
                continue
            except OutsideRoot:
                self._report(path, *self._refusal(path, tail.confine) or ("symlink_outside_root", "outside the root"))
                self.store.set_source_up(self.kind, redact(path), False)
                continue
            except OSError as e:
                self._report(path, "unreadable_file", f"{type(e).__name__}: {e.strerror or e}")
                self.store.set_source_up(self.kind, redact(path), False)
                continue
            if problems and path in problems:
                self._report(path, None)
                self.store.set_source_up(self.kind, redact(path), True)
            if res is UNCHANGED:
                continue
            project, experiment = self._labels[path]
            book = self.book.file(path)
            if res.too_long:
                self.store.count_error(self.kind, "line_too_long", res.too_long)
                self.book.bad(path, book, self.book.read(path, book, res.too_long), "line_too_long", res.too_long)
            for ev in res.events:
                if ev == "truncated":  # verl reopens its log with "wb": a restarted trainer
                    log.info("%s: truncated (trainer restart)", redact(path))
                    self.store.trainer_restarted(project, experiment, self.kind)
                    self.book.restarted(path)
                elif ev == "rotated":  # logrotate; a restart that also rotates shows as its step going back
                    log.info("%s: rotated; following the new file", redact(path))
            if not res.lines:
                continue
            backlog_arrival = tail.mtime or self.clock()
            for i, line in enumerate(res.lines):
                backlog = i < res.backlog
                applied += self._apply(project, experiment, path, line, backlog_arrival if backlog else self.clock(),
                                       backlog)
        return applied

    def open_files(self) -> int:
        return len(self.pool)

    def _apply(self, project: str, experiment: str, path: str, line: bytes, arrival: float,
               backlog: bool = False) -> int:
        try:
            parsed: ParsedStep = self.parse(line)
        except LineError as e:
            book = self.book.file(path)
            lineno = self.book.read(path, book)
            if e.reason != "not_a_step_line":  # console logs carry other output: not an error
                self.store.count_error(self.kind, e.reason)
                self.book.bad(path, book, lineno, e.reason)
            elif (total := total_steps_in(line)) is not None:  # the trainer's "Total training steps: N"
                self.store.set_total_steps(project, experiment, total)
            return 0
        except Exception:  # never let one line kill the source
            log.exception("unexpected parse failure in %s", redact(path))
            self.store.count_error(self.kind, "parser_bug")
            book = self.book.file(path)
            self.book.bad(path, book, self.book.read(path, book), "parser_bug")
            return 0
        book = self.book.file(path)
        self.book.read(path, book)
        rec = self.store.ingest(project, experiment, parsed, self.kind, arrival=arrival,
                                feed=f"{self.kind}:{path}", backlog=backlog)
        if rec is None:
            return 0
        book.applied += 1
        return 1

    def describe(self) -> list[dict]:
        """Per watch spec: exists, files, runs with steps, lines read and skipped (``/api/v1/sources``)."""
        return self.book.describe(self.specs, dict(self._spec_of), dict(self._labels))

    # -- thread ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("%s source pass failed", self.kind)
                for spec in self.specs:
                    self.store.set_source_up(self.kind, redact(spec), False)
            self._stop.wait(self.poll_seconds)

    def start(self) -> "FileSource":
        self._thread = threading.Thread(target=self._loop, name=f"omniwatch-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a poll pass stops between two files
        if self._thread is None or not self._thread.is_alive():
            self.pool.close_all()


class FilesCollector(Collector):
    """``omniwatch_watched_files`` and ``omniwatch_open_files`` per file source."""

    def __init__(self, sources: list):
        self.sources = sources

    def describe(self):
        return names.describe((names.WATCHED_FILES, names.OPEN_FILES))

    def collect(self):
        watched, opened = names.family(names.WATCHED_FILES), names.family(names.OPEN_FILES)
        for src in self.sources:
            if isinstance(src, FileSource):
                watched.add_metric([src.kind], len(src.tails))
                opened.add_metric([src.kind], src.open_files())
        yield watched
        yield opened
