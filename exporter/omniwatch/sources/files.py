"""File sources: verl's ``file`` logger JSONL and its ``console`` backend lines.

A watch spec is one file, a glob, or a directory laid out as verl's ``VERL_FILE_LOGGER_ROOT``
(``<root>/<project>/<experiment>.jsonl``). Every file's runs are labelled ``project`` = its parent
directory's name and ``experiment`` = its name without the suffix(es) — exactly verl's layout.
One thread per source polls all its files; parsing and ingestion are the model's, errors are counted.
"""
from __future__ import annotations

import glob
import logging
import os
import threading
import time
from pathlib import Path

from ..model import RunStore
from ..parse import LineError, ParsedStep, parse_console_line, parse_jsonl_line
from ..planned import total_steps_in
from .tail import FileTail

log = logging.getLogger(__name__)

RESCAN_SECONDS = 2.0


def run_labels(path: str) -> tuple[str, str]:
    p = Path(path)
    name = p.name
    for suffix in (".console.log", ".jsonl", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return (p.parent.name or "default"), name


class FileSource:
    """Follow every file matched by ``specs``; ``kind`` is ``jsonl`` or ``console``."""

    def __init__(self, store: RunStore, specs: list[str], kind: str = "jsonl", *,
                 poll_seconds: float = 0.5, max_line: int = 1 << 20, clock=time.time):
        if kind not in ("jsonl", "console"):
            raise ValueError(kind)
        self.store, self.specs, self.kind = store, list(specs), kind
        self.poll_seconds, self.max_line, self.clock = poll_seconds, max_line, clock
        self.parse = parse_jsonl_line if kind == "jsonl" else parse_console_line
        self.tails: dict[str, FileTail] = {}
        self.poll_lock = threading.Lock()  # a checkpoint sees offsets and the model at one point
        self._resume: dict[str, dict] = {}
        self._last_scan = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for spec in self.specs:
            store.set_source_up(kind, spec, True)

    # -- file discovery ----------------------------------------------------------------------------
    def _expand(self, spec: str) -> list[str]:
        if os.path.isdir(spec):
            # <root>/<project>/<experiment>.jsonl (VERL_FILE_LOGGER_ROOT), or files directly in it.
            ext = "*.jsonl" if self.kind == "jsonl" else "*.log"
            found = glob.glob(os.path.join(spec, "*", ext)) + glob.glob(os.path.join(spec, ext))
            return sorted(p for p in found if os.path.isfile(p))
        if glob.has_magic(spec):
            return sorted(p for p in glob.glob(spec) if os.path.isfile(p))
        return [spec]  # a single file, perhaps not there yet: waited for

    def watches(self, path: str) -> bool:
        """``path`` is one of the files this source follows now (it exists and a spec matches it)."""
        return os.path.isfile(path) and any(path in self._expand(spec) for spec in self.specs)

    def scan(self) -> None:
        for spec in self.specs:
            try:
                for path in self._expand(spec):
                    if path not in self.tails:
                        tail = FileTail(path, self.max_line)
                        if path in self._resume:
                            tail.resume_from(self._resume.pop(path))
                        self.tails[path] = tail
                self.store.set_source_up(self.kind, spec, True)
            except OSError as e:
                log.warning("%s source cannot list %s: %s", self.kind, spec, e)
                self.store.set_source_up(self.kind, spec, False)
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
        for path, tail in list(self.tails.items()):
            project, experiment = run_labels(path)
            try:
                res = tail.poll()
            except OSError as e:
                log.warning("%s source cannot read %s: %s", self.kind, path, e)
                self.store.set_source_up(self.kind, path, False)
                continue
            if res.too_long:
                self.store.count_error(self.kind, "line_too_long", res.too_long)
            for ev in res.events:
                if ev == "truncated":  # verl reopens its log with "wb": a restarted trainer
                    log.info("%s: truncated (trainer restart)", path)
                    self.store.trainer_restarted(project, experiment, self.kind)
                elif ev == "rotated":  # logrotate; a restart that also rotates shows as its step going back
                    log.info("%s: rotated; following the new file", path)
            if not res.lines:
                continue
            backlog_arrival = tail.mtime or self.clock()
            for i, line in enumerate(res.lines):
                backlog = i < res.backlog
                applied += self._apply(project, experiment, path, line, backlog_arrival if backlog else self.clock(),
                                       backlog)
        return applied

    def _apply(self, project: str, experiment: str, path: str, line: bytes, arrival: float,
               backlog: bool = False) -> int:
        try:
            parsed: ParsedStep = self.parse(line)
        except LineError as e:
            if e.reason != "not_a_step_line":  # console logs carry other output: not an error
                self.store.count_error(self.kind, e.reason)
            elif (total := total_steps_in(line)) is not None:  # the trainer's "Total training steps: N"
                self.store.set_total_steps(project, experiment, total)
            return 0
        except Exception:  # never let one line kill the source
            log.exception("unexpected parse failure in %s", path)
            self.store.count_error(self.kind, "parser_bug")
            return 0
        rec = self.store.ingest(project, experiment, parsed, self.kind, arrival=arrival,
                                feed=f"{self.kind}:{path}", backlog=backlog)
        return 1 if rec is not None else 0

    # -- thread ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("%s source pass failed", self.kind)
                for spec in self.specs:
                    self.store.set_source_up(self.kind, spec, False)
            self._stop.wait(self.poll_seconds)

    def start(self) -> "FileSource":
        self._thread = threading.Thread(target=self._loop, name=f"omniwatch-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for t in self.tails.values():
            t.close()
