"""Read a finished verl run (file logger JSONL or console log) into ordered step entries.

The same parsers and labels as the live file sources, so a run replayed, backfilled or backtested is
the run the exporter would have seen. Bad lines are counted skips (by the live sources' reasons),
never exceptions; an empty or unreadable file is a :class:`RunFileError` with a clear message.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import orjson

from ..core.analytics import K_STEP, K_TESTING, K_TIME_PER_STEP
from ..core.parse import LineError, ParsedStep, parse_console_line, parse_record
from ..settings import DEFAULT_MAX_LINE
from .. import trainer_config
from ..runlabel import fit_label, raw_run_labels, shortened

DEFAULT_STEP_SECONDS = 60.0  # wall time of a step when the whole run carries no timer at all


class RunFileError(Exception):
    """The file cannot be used at all (missing, unreadable, no step in it)."""


@dataclass
class Entry:
    """One logged step, in file order."""

    parsed: ParsedStep
    record: dict  # {"step": N, "data": {...}} as verl's FileLogger writes it (for replay)

    @property
    def step(self) -> int:
        return self.parsed.step

    def timer_seconds(self) -> float | None:
        """Wall seconds this line stands for: the step (timing_s/step, else perf/time_per_step) plus
        validation (timing_s/testing runs after the step, before the line is logged). None when the
        line carries no timer."""
        v = self.parsed.values
        step = v.get(K_STEP, v.get(K_TIME_PER_STEP))
        step = step if step is not None and step > 0 else None
        testing = v.get(K_TESTING)
        testing = testing if testing is not None and testing > 0 else None
        if step is None and testing is None:
            return None
        return (step or 0.0) + (testing or 0.0)


@dataclass
class RecordedRun:
    path: str
    kind: str  # "jsonl" | "console" (the live source names)
    project: str
    experiment: str
    entries: list[Entry]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> lines skipped
    mtime: float = 0.0
    label_note: str = ""  # how the names on disk became the labels (shortened, renamed), for the reports
    trainer_config: object = None  # trainer_config.TrainerConfig: printed in the console log, or --trainer-config
    truncated_before: list[int] = field(default_factory=list)  # entry indices before which the live file source saw
    #                                the log truncated (verl reopens its JSONL with "wb" on a resume): load_incarnations

    @property
    def feed(self) -> str:
        return f"{self.kind}:{self.path}"

    def wall_seconds(self, pace: float | None = None) -> list[float]:
        """Seconds each entry adds to the wall clock; a line without timers counts as the run's median
        timed line (the fallback keeps a timer-less run on a sane clock). ``pace`` (seconds per line)
        replaces the timers by a uniform clock: an accelerated live replay (``replay --pace``) keeps
        the rules' ``for:`` and evaluation interval fixed, so a backtest must use the replay's clock,
        not the run's, to fire at the same steps."""
        if pace is not None:
            return [pace] * len(self.entries)
        raw = [e.timer_seconds() for e in self.entries]
        known = [x for x in raw if x is not None]
        fallback = statistics.median(known) if known else DEFAULT_STEP_SECONDS
        return [fallback if x is None else x for x in raw]


def detect_kind(path: str) -> str:
    return "console" if path.endswith((".log", ".txt")) else "jsonl"


def _count(d: dict[str, int], reason: str, n: int = 1) -> None:
    d[reason] = d.get(reason, 0) + n


def _jsonl_entry(line: bytes) -> Entry:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise LineError("malformed_json", str(e)[:80]) from None
    parsed = parse_record(obj)
    return Entry(parsed, {"step": parsed.step, "data": obj["data"]})


def _console_entry(line: bytes) -> Entry:
    parsed = parse_console_line(line)
    return Entry(parsed, {"step": parsed.step, "data": dict(parsed.values)})


READ_CHUNK = 1 << 20


def stream_lines(f, max_line: int, skipped: dict[str, int]):
    """The lines of binary file ``f`` (without their ends, ``\\n``, ``\\r\\n`` or ``\\r`` as
    ``bytes.splitlines``), read in 1 MiB chunks: memory stays within ``max_line`` + a chunk whatever the
    file's size. A line longer than ``max_line`` is skipped unread and counted (``line_too_long``)."""
    buf = bytearray()
    skipping = False
    while True:
        chunk = f.read(READ_CHUNK)
        if not chunk:
            break
        buf += chunk
        lines = buf.splitlines(keepends=True)
        buf = bytearray(lines.pop()) if lines and not lines[-1].endswith((b"\n", b"\r")) else bytearray()
        for raw in lines:
            if skipping:
                skipping = False
                continue  # the end of a line already counted as too long
            line = raw.rstrip(b"\r\n")
            if len(line) > max_line:
                _count(skipped, "line_too_long")
                continue
            yield bytes(line)
        if len(buf) > max_line:
            if not skipping:
                _count(skipped, "line_too_long")
            skipping = True
            buf = bytearray()
    if buf and not skipping:
        line = bytes(buf).rstrip(b"\r\n")
        if len(line) > max_line:
            _count(skipped, "line_too_long")
        else:
            yield line


def load_run(path: str, kind: str | None = None, project: str | None = None,
             experiment: str | None = None, max_line: int = DEFAULT_MAX_LINE) -> RecordedRun:
    """Every step line of ``path`` in file order (restarts and re-runs kept as written)."""
    kind = kind or detect_kind(path)
    if kind not in ("jsonl", "console"):
        raise RunFileError(f"unknown run file kind {kind!r} (jsonl or console)")
    try:
        st = os.stat(path)
        f = open(path, "rb")
    except OSError as e:
        raise RunFileError(f"cannot read {path}: {e.strerror or e}") from None
    raw = raw_run_labels(path)
    p, x = project or raw[0], experiment or raw[1]
    notes = [f"{what} {n}" for what, name in (("project:", p), ("experiment:", x)) if (n := shortened(name))]
    run = RecordedRun(os.path.abspath(path), kind, fit_label(p), fit_label(x), [], mtime=st.st_mtime,
                      label_note="; ".join(notes))
    make = _jsonl_entry if kind == "jsonl" else _console_entry
    block = trainer_config.PprintBlock()
    with f:
        try:
            for line in stream_lines(f, max_line, run.skipped):
                if not line.strip():
                    continue
                try:
                    run.entries.append(make(line))
                except LineError as e:
                    if e.reason != "not_a_step_line":  # console logs carry other output
                        _count(run.skipped, e.reason)
                    elif kind == "console" and (block.lines or b"{'" in line):  # VeRL-Omni's config print
                        try:
                            if (d := block.feed(line)) is not None and run.trainer_config is None:
                                run.trainer_config = trainer_config.facts(d, "console", run.path)
                        except trainer_config.ConfigError as ce:
                            _count(run.skipped, "trainer_config_" + ce.reason)
        except OSError as e:
            raise RunFileError(f"cannot read {path}: {e.strerror or e}") from None
    if not run.entries:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(run.skipped.items())) or "no lines"
        raise RunFileError(f"{path}: no verl step line found ({detail})")
    return run



def load_incarnations(paths: list[str], kind: str | None = None, project: str | None = None,
                      experiment: str | None = None, max_line: int = DEFAULT_MAX_LINE) -> RecordedRun:
    """One run as the live file source read it across trainer restarts. ``paths`` are the contents one log file
    had, in order: what it held when each trainer incarnation ended (a copy kept aside), the last one the file
    as it stands now. verl's ``FileLogger`` reopens ``<project>/<experiment>.jsonl`` with ``"wb"`` on every
    start, so the file alone holds only the last incarnation; live, the exporter read every line as it was
    written and saw the truncation (``RunStore.trainer_restarted``). The run is named, labelled and typed by the
    last path; each later path's first entry is marked in ``truncated_before``."""
    if not paths:
        raise RunFileError("no run file given")
    kind = kind or detect_kind(paths[-1])
    raw = raw_run_labels(paths[-1])
    project, experiment = project or raw[0], experiment or raw[1]
    parts = [load_run(p, kind, project, experiment, max_line) for p in paths]
    run = parts[-1]
    entries: list[Entry] = []
    for part in parts:
        if entries:
            run.truncated_before.append(len(entries))
        entries.extend(part.entries)
        if part is not run:
            for reason, n in part.skipped.items():
                _count(run.skipped, reason, n)
        if run.trainer_config is None and part.trainer_config is not None:
            run.trainer_config = part.trainer_config
    run.entries = entries
    return run
