"""What each run of the scorecard corpus holds: its truth file (``<experiment>.truth.json``, written by
``corpus.py`` next to the run) and how to replay the run as the live exporter would have read it.

A truth file says, per run: the layout, which files to replay in order (``replay``: one file, or the log as it
stood when a trainer incarnation died followed by the file as verl left it after the resume, read with a
truncation between them: ``runfile.load_incarnations``), the trainer config to read (``trainer_config``), how long
the log stays silent after its last line (``silence_after_s``: a hang), and every injected fault with its kind,
shape, first and last step and the alerts that name its cause (``named_by``: label matchers; a list value is any
of its values). Healthy runs have no fault and say so; ``changes`` are normal events of a run that must not page
(a workload change: more images per step, each costing the same).

Nothing here knows which alert fires for what: ``named_by`` is data, and the scorer reads the rule files and
``alerts/alertmanager.yml`` at run time.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRUTH_SUFFIX = ".truth.json"
FORMAT = 1

SHAPES = ("step", "episode", "creep", "early", "resume", "overlap", "stop")


@dataclass(frozen=True)
class Matcher:
    """An alert that names a fault's cause: every label given must match (a list: any of its values)."""
    labels: dict[str, str | list[str]]

    def matches(self, alertname: str, labels: dict[str, str]) -> bool:
        have = {**labels, "alertname": alertname}
        for k, want in self.labels.items():
            v = have.get(k)
            if v is None or (v not in want if isinstance(want, list) else v != want):
                return False
        return True

    def text(self) -> str:
        name = self.labels.get("alertname", "*")
        rest = ",".join(f"{k}={'|'.join(v) if isinstance(v, list) else v}" for k, v in self.labels.items()
                        if k != "alertname")
        return f"{name}{{{rest}}}" if rest else str(name)


@dataclass
class FaultTruth:
    kind: str                 # the simulator's fault kind (omniwatch.simulate.Fault.kind)
    shape: str                # step | episode | creep | early | resume | overlap | stop (see SHAPES)
    first_step: int
    last_step: int
    named_by: list[Matcher]
    params: dict = field(default_factory=dict)  # factor, seconds_share, value, phase, ramp as injected
    resume: dict | None = None  # {"died_after_step": N, "resumed_from_step": M}: the trainer died after N and
    #                             resumed from its step-M checkpoint (its next line is step M + 1), still faulty
    note: str = ""

    @property
    def is_hang(self) -> bool:
        return self.kind == "hang"

    def to_json(self) -> dict:
        d = asdict(self)
        d["named_by"] = [m.labels for m in self.named_by]
        return {k: v for k, v in d.items() if v not in (None, "", {})}

    @classmethod
    def from_json(cls, d: dict) -> "FaultTruth":
        return cls(d["kind"], d["shape"], int(d["first_step"]), int(d["last_step"]),
                   [Matcher(dict(m)) for m in d.get("named_by") or []], dict(d.get("params") or {}),
                   d.get("resume"), d.get("note", ""))


@dataclass
class ChangeTruth:
    """A normal event of the run that must not raise a warning (a workload change)."""
    kind: str
    first_step: int
    last_step: int
    params: dict = field(default_factory=dict)
    note: str = ""

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, "", {})}

    @classmethod
    def from_json(cls, d: dict) -> "ChangeTruth":
        return cls(d["kind"], int(d["first_step"]), int(d["last_step"]), dict(d.get("params") or {}), d.get("note", ""))


@dataclass
class RunTruth:
    project: str
    experiment: str
    layout: dict
    lines: int                         # step lines replayed (every incarnation)
    replay: list[str]                  # files next to the truth file, replayed in order (truncated between)
    trainer_config: str | None = None  # a file next to it holding the trainer's config (VeRL-Omni's print)
    silence_after_s: float = 0.0       # the log stays silent this long after its last line (a hang)
    faults: list[FaultTruth] = field(default_factory=list)
    changes: list[ChangeTruth] = field(default_factory=list)
    warmup_step_s: float | None = None  # the run's first step took this long (a hang right after it)
    note: str = ""
    path: str = ""                     # the truth file (not written)

    @property
    def healthy(self) -> bool:
        return not self.faults and not self.changes

    @property
    def name(self) -> str:
        return f"{self.project}/{self.experiment}"

    def to_json(self) -> dict:
        d = {"format": FORMAT, "project": self.project, "experiment": self.experiment, "layout": self.layout,
             "lines": self.lines, "replay": self.replay, "trainer_config": self.trainer_config,
             "silence_after_s": self.silence_after_s, "healthy": self.healthy,
             "faults": [f.to_json() for f in self.faults], "changes": [c.to_json() for c in self.changes],
             "warmup_step_s": self.warmup_step_s, "note": self.note}
        return {k: v for k, v in d.items() if v is not None and v != ""}

    @classmethod
    def from_json(cls, d: dict, path: str = "") -> "RunTruth":
        if d.get("format") != FORMAT:
            raise ValueError(f"{path}: truth format {d.get('format')!r}, expected {FORMAT}")
        t = cls(d["project"], d["experiment"], dict(d.get("layout") or {}), int(d["lines"]), list(d["replay"]),
                d.get("trainer_config"), float(d.get("silence_after_s") or 0.0),
                [FaultTruth.from_json(f) for f in d.get("faults") or []],
                [ChangeTruth.from_json(c) for c in d.get("changes") or []], d.get("warmup_step_s"),
                d.get("note", ""), path)
        if bool(d.get("healthy")) != t.healthy:
            raise ValueError(f"{path}: 'healthy' says {d.get('healthy')} but the run has "
                             f"{len(t.faults)} fault(s) and {len(t.changes)} change(s)")
        for f in t.faults:
            if f.shape not in SHAPES:
                raise ValueError(f"{path}: unknown fault shape {f.shape!r} (one of {', '.join(SHAPES)})")
            if not f.named_by:
                raise ValueError(f"{path}: fault {f.kind} names no alert")
        return t


def dump(truth: RunTruth) -> str:
    return json.dumps(truth.to_json(), indent=1, sort_keys=False) + "\n"


def load_all(corpus: str | Path) -> list[RunTruth]:
    """Every truth file under ``corpus`` (sorted by path)."""
    root = Path(corpus)
    files = sorted(root.rglob("*" + TRUTH_SUFFIX))
    if not files:
        raise ValueError(f"no *{TRUTH_SUFFIX} under {root}: not a scorecard corpus")
    return [RunTruth.from_json(json.loads(p.read_text(encoding="utf-8")), str(p)) for p in files]


def load_run(truth: RunTruth):
    """The truth's run, replayed as the live exporter would have read it, with its trainer config."""
    from .. import trainer_config as tc
    from ..backtest.runfile import load_incarnations
    here = Path(truth.path).parent
    run = load_incarnations([str(here / f) for f in truth.replay], project=truth.project,
                            experiment=truth.experiment)
    if truth.trainer_config:
        errors = tc.attach([run], [str(here / truth.trainer_config)])
        if errors or run.trainer_config is None:
            raise ValueError(f"{truth.path}: trainer config {truth.trainer_config} not read: {errors}")
    if len(run.entries) != truth.lines:
        raise ValueError(f"{truth.path}: {len(run.entries)} step lines replayed, the truth says {truth.lines}")
    return run
