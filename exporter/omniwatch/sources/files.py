"""File sources: verl's ``file`` logger JSONL and its ``console`` backend lines.

A watch spec is one file, a glob, or a directory laid out as verl's ``VERL_FILE_LOGGER_ROOT``
(``<root>/<project>/<experiment>.jsonl``). Every file's runs are labelled ``project`` = its parent
directory's name and ``experiment`` = its name without the suffix(es) — exactly verl's layout.
One thread per source polls all its files; parsing and ingestion are the model's, errors are counted.
"""
from __future__ import annotations

import fnmatch
import glob
import itertools
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from prometheus_client.registry import Collector

from .. import names
from ..core.analytics import K_STEP
from ..core.model import RunStore
from ..periodic import Periodic
from ..core.parse import LineError, ParsedStep, parse_console_line, parse_jsonl_line
from ..core.planned import total_steps_in
from ..redact import looks_like_credential, redact
from .. import trainer_config
from .book import SourceBook
from ..runlabel import raw_run_labels, run_labels, shortened
from .tail import DEFAULT_MAX_OPEN, UNCHANGED, FdPool, FileTail, NotRegularFile, OutsideRoot, birth_time, escapes

log = logging.getLogger(__name__)

RESCAN_SECONDS = 2.0
IDLE_AFTER_POLLS = 60  # unchanged this many polls in a row (30 s at the default 0.5 s) ...
IDLE_EVERY = 4         # ... then looked at every 4th poll
LONG_IDLE_AFTER_POLLS = 120  # unchanged at this many looks (2.5 min at the default poll: 60 polls, then 60 looks every 4th) ...
LONG_IDLE_EVERY = 16         # ... then looked at every 16th poll (a run resumed after that is seen <= 8 s late)
# A file's own modification time says how long it has been idle, from the first look (issue 35 item 5: 100,000 idle
# files were each looked at every poll for their first 30 s and every 4th for 2 more minutes of *this* exporter's
# life -- 72-75 % of a core -- whatever their age): a file last written IDLE_AGE_S ago starts at every 4th poll,
# LONG_IDLE_AGE_S ago at every 16th, DORMANT_AGE_S ago at every DORMANT_EVERY-th (a run resumed after half an hour
# of silence is seen at most 32 s late at the default 0.5 s poll).
# And whatever the files' ages, a pass looks at no more than MAX_LOOKS_PER_PASS of them (the files changed recently
# first, in turn; then the idle ones due, the rest moved to the next pass): 100,000 files written a moment before
# the exporter started are looked at in turn, not all at every pass.
MAX_LOOKS_PER_PASS = 2048
FIRST_READ_WEIGHT = 8   # a file's first read (open, read its backlog, parse, apply) counts as this many looks
IDLE_AGE_S = 30.0
LONG_IDLE_AGE_S = 150.0
DORMANT_AGE_S = 1800.0
DORMANT_EVERY = 64
RACY_SECONDS = 3.0
COPY_SLACK_S = 2.0     # a log written faster than half its steps' own time less this is a copy (see _judge_copy)


class FileSource(Periodic):
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
        # a poll pass every poll_seconds; stop() ends a pass between two files (_stop)
        super().__init__(poll_seconds, name=f"omniwatch-{kind}", what=f"{kind} source pass", join_timeout=1.0)
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
        self._blocks: dict[str, trainer_config.PprintBlock] = {}  # console: VeRL-Omni's config print per file
        self._last_scan = 0.0
        self._listings: dict[str, tuple[int, list[str], list[str]]] = {}  # dir -> (mtime_ns, subdirs, files)
        self._pass = 0
        self._now = 0.0                            # wall clock of the current pass (a file's age = _now - mtime)
        self._active: dict[str, FileTail] = {}     # polled every pass (changed recently)
        self._due: dict[int, list[str]] = {}       # pass -> idle files looked at in it
        self._queue: deque[str] = deque()          # idle files due, over a pass's budget: the next passes take them
        self._scanned: set[str] = set()            # specs scanned once: a file a later scan finds was born since
        self._last_scan_wall = 0.0
        self._born_after: dict[str, float] = {}    # path -> a wall time it did not exist yet (found by a rescan)
        self._span = 0.0                           # seconds of step timers in the backlog being read
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

    def _listing(self, d: str, now: float) -> tuple[list[str], list[str]]:
        """(subdirectories, matching files) of directory ``d``, listed again only when its mtime moved
        (a file created, removed or renamed in it) or it was modified within :data:`RACY_SECONDS` (an
        mtime tick may hide a second change): a root of 100,000 idle files costs one ``stat`` per
        project directory per rescan, not a listing of every file. scandir: the entry types come with
        the listing, no stat per file."""
        st = os.stat(d)
        cached = self._listings.get(d)
        if cached is not None and cached[0] == st.st_mtime_ns and now - st.st_mtime > RACY_SECONDS:
            return cached[1], cached[2]
        pat, dirs, found = self._pattern(), [], []
        with os.scandir(d) as it:
            for e in it:
                try:
                    if e.is_dir():
                        dirs.append(e.path)
                    elif fnmatch.fnmatchcase(e.name, pat) and e.is_file():
                        found.append(e.path)
                except OSError:
                    continue
        self._listings[d] = (st.st_mtime_ns, dirs, found)
        return dirs, found

    def _expand(self, spec: str) -> list[str]:
        if os.path.isdir(spec):
            # <root>/<project>/<experiment>.jsonl (VERL_FILE_LOGGER_ROOT), or files directly in it.
            now = time.time()  # file system times are wall-clock times, whatever self.clock is
            dirs, found = self._listing(spec, now)
            found = list(found)
            for sub in dirs:
                try:
                    found += self._listing(sub, now)[1]
                except OSError:
                    self._listings.pop(sub, None)
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
                if is_dir and spec in self.tails:
                    self._forget(spec)   # waited for as a file while it did not exist: it is the root of the runs
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
                    tail.slot = len(self.tails)
                    if spec in self._scanned and self._last_scan:   # not there at the previous scan: born since
                        self._born_after[path] = self._last_scan_wall
                    self.tails[path] = tail
                    self._active[path] = tail
                    self._spec_of[path] = spec
                    self._labels[path] = labels
                    self._say_shortened(path, labels)
                self.store.set_source_up(self.kind, redact(spec), True)
                self._scanned.add(spec)
            except OSError as e:
                log.warning("%s source cannot list %s: %s", self.kind, redact(spec), redact(str(e)))
                self.store.set_source_up(self.kind, redact(spec), False)
        self._last_scan = self.clock()
        self._last_scan_wall = time.time()

    def _forget(self, path: str) -> None:
        """A watch path that was waited for (it did not exist: ``make up WATCH=<root>`` before the trainer created
        the root) and appeared as a directory: not a file to tail; its runs are followed from it (issue 35 item 11:
        it was opened as a file, failed "not a regular file" and stayed source_up 0 for good)."""
        tail = self.tails.pop(path)
        tail.close()
        self._active.pop(path, None)
        self._labels.pop(path, None)
        self._spec_of.pop(path, None)
        self._problems.pop(path, None)

    def _say_shortened(self, path: str, labels: tuple[str, str]) -> None:
        """Once per file: how its directory or file name became its run's labels (control characters
        stripped, a long name made a unique 128-character label)."""
        notes = [f"{what} {n}" for what, raw in zip(("project:", "experiment:"), raw_run_labels(path))
                 if (n := shortened(raw))]
        if notes:
            log.info("%s source: %s is run %s/%s (%s)", self.kind, redact(ascii(path)), redact(labels[0]),
                     redact(labels[1]), "; ".join(notes))

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
        # Files changed recently are polled every pass; a file unchanged for IDLE_AFTER_POLLS polls (a finished
        # or stalled run) every IDLE_EVERY-th pass, one unchanged for LONG_IDLE_AFTER_POLLS looks every
        # LONG_IDLE_EVERY-th, spread over the passes by a slot per file. Idle files wait in a calendar of
        # passes, so a pass touches only the files due in it: 100,000 idle files cost a sixteenth of their
        # stat()s and no Python work in between (docs/benchmarks.md); a run that resumes is seen at most
        # IDLE_EVERY (LONG_IDLE_EVERY) polls late.
        self._now = self.clock()   # a file's age: its mtime against the source's clock (time.time when serving)
        todo = self._due.pop(self._pass, None)
        if todo:   # idle files due now wait in one queue, looked at in order within the pass's budget
            self._queue.extend(todo)
        # active files first (in turn when more than the budget: _schedule moves a looked-at one to the end)
        batch = list(itertools.islice(self._active.items(), MAX_LOOKS_PER_PASS))
        q, tails = self._queue, self.tails
        while q and len(batch) < MAX_LOOKS_PER_PASS:
            p = q.popleft()
            if p in tails:
                batch.append((p, tails[p]))
        spent = 0
        for i, (path, tail) in enumerate(batch):
            if not i & 255 and self._stop.is_set():
                for p, t in batch[i:]:  # shutting down: the checkpoint holds the offsets of what was read
                    self._schedule(p, t, self._pass + 1)
                break
            if spent >= MAX_LOOKS_PER_PASS:   # first reads weigh more: the rest waits for the next pass, in order
                self._queue.extendleft(reversed([p for p, _ in batch[i:] if p not in self._active]))
                break
            spent += 1 if tail.opened else FIRST_READ_WEIGHT
            try:
                applied += self._poll_one(path, tail)
            finally:
                if path in self.tails:
                    self._schedule(path, tail)
        return applied

    def _schedule(self, path: str, tail: FileTail, at: int | None = None) -> None:
        """Keep ``path`` polled every pass while it changes, else put it in the calendar for its next look: the
        longer it has been unchanged -- in this exporter's looks, or by its own modification time -- the rarer."""
        if at is None:
            period = self._period(tail)
            if period == 1:
                self._active.pop(path, None)   # to the end: over the budget, active files take turns
                self._active[path] = tail
                return
            at = self._pass + period - (self._pass + tail.slot) % period
        self._active.pop(path, None)
        self._due.setdefault(at, []).append(path)

    def _period(self, tail: FileTail) -> int:
        u = tail.unchanged_polls
        age = self._now - tail.mtime if tail.mtime is not None else 0.0
        if age >= DORMANT_AGE_S:
            return DORMANT_EVERY
        if u >= LONG_IDLE_AFTER_POLLS or age >= LONG_IDLE_AGE_S:
            return LONG_IDLE_EVERY
        if u >= IDLE_AFTER_POLLS or age >= IDLE_AGE_S:
            return IDLE_EVERY
        return 1

    def _poll_one(self, path: str, tail: FileTail) -> int:
        problems = self._problems
        try:
            res = tail.poll()
        except NotRegularFile as e:
            if path in self.specs and os.path.isdir(path):
                self._forget(path)   # the watched root appeared: the next scan follows its runs
                self._last_scan = 0.0
                return 0
            self._report(path, "not_regular_file", str(e.strerror or e))
            self.store.set_source_up(self.kind, redact(path), False)
            return 0
        except OutsideRoot:
            self._report(path, *self._refusal(path, tail.confine) or ("symlink_outside_root", "outside the root"))
            self.store.set_source_up(self.kind, redact(path), False)
            return 0
        except OSError as e:
            self._report(path, "unreadable_file", f"{type(e).__name__}: {e.strerror or e}")
            self.store.set_source_up(self.kind, redact(path), False)
            return 0
        if problems and path in problems:
            self._report(path, None)
            self.store.set_source_up(self.kind, redact(path), True)
        if res is UNCHANGED:
            return 0
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
            return 0
        applied = 0
        backlog_arrival = tail.mtime or self.clock()
        self._span = 0.0
        for i, line in enumerate(res.lines):
            backlog = i < res.backlog
            applied += self._apply(project, experiment, path, line, backlog_arrival if backlog else self.clock(),
                                   backlog)
        if "opened" in res.events and res.backlog and self._span > 0:
            self._judge_copy(path, project, experiment, tail.mtime)
        return applied

    def _judge_copy(self, path: str, project: str, experiment: str, mtime: float | None) -> None:
        """A file read whole at first sight: were its steps written live? Its steps' own timers (``timing_s/step``)
        say how long they ran; a file born (statx) or first found after the previous scan less than half that
        before its last write was written faster than its steps ran: a copy or a restore (``cp -r``, rsync
        without ``-t``), whose mtime is not its last step's time. (A file born after its own mtime kept the
        original's: its age says how old its steps are, and RunStore.history judges that.) The run is then history (info once, never
        escalated) until live evidence (issue 35 item 8: such a run paged TrainingStalled critical for days)."""
        born = [b for b in (birth_time(path), self._born_after.pop(path, None)) if b]
        if not born or mtime is None:
            return
        written = mtime - max(born)
        if written < -COPY_SLACK_S:
            return   # born after its last write: a copy that kept the original's mtime (cp -p, rsync -t), which the
            #          age at first sight judges (RunStore.history)
        if written < 0.5 * self._span - COPY_SLACK_S and self.store.copied_log(project, experiment):
            log.info("%s source: %s holds %d s of steps by their own timers but was written within %.0f s (a copy or "
                     "a restore): run %s/%s is read as history, not paged, until it steps again", self.kind,
                     redact(ascii(path)), self._span, max(0.0, written), redact(project), redact(experiment))

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
            elif self.kind == "console":
                self._config_line(project, experiment, path, line)
            return 0
        except Exception:  # never let one line kill the source
            log.exception("unexpected parse failure in %s", redact(path))
            self.store.count_error(self.kind, "parser_bug")
            book = self.book.file(path)
            self.book.bad(path, book, self.book.read(path, book), "parser_bug")
            return 0
        book = self.book.file(path)
        self.book.read(path, book)
        if backlog:
            v = parsed.values.get(K_STEP)
            if isinstance(v, (int, float)) and 0 < v < 86_400 * 7:
                self._span += v
        rec = self.store.ingest(project, experiment, parsed, self.kind, arrival=arrival,
                                feed=f"{self.kind}:{path}", backlog=backlog)
        if rec is None:
            return 0
        book.applied += 1
        return 1

    def describe(self) -> list[dict]:
        """Per watch spec: exists, files, runs with steps, lines read and skipped (``/api/v1/sources``)."""
        return self.book.describe(self.specs, dict(self._spec_of), dict(self._labels))

    def _config_line(self, project: str, experiment: str, path: str, line: bytes) -> None:
        """A line of VeRL-Omni's resolved-config print (``pprint`` of the config at start): the run's
        trainer configuration, for this log's run and the run it names (trainer_config.py)."""
        block = self._blocks.get(path)
        if block is None or not block.lines:
            if b"{'" not in line:
                return  # the common case: not the start of a printed mapping
            block = self._blocks.setdefault(path, trainer_config.PprintBlock())
        try:
            d = block.feed(line)
            if d is None:
                return
            cfg = trainer_config.facts(d, "console", path)
        except trainer_config.ConfigError as e:
            self.store.count_error(trainer_config.SOURCE, e.reason)
            return
        self.store.set_trainer_config(cfg, labels=(project, experiment))

    # -- thread ------------------------------------------------------------------------------------
    def scan_once(self) -> None:
        self.poll_once()

    def scan_failed(self) -> None:
        super().scan_failed()
        for spec in self.specs:
            self.store.set_source_up(self.kind, redact(spec), False)

    def stop(self) -> None:
        super().stop()  # a poll pass stops between two files
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
