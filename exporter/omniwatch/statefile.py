"""The schema of ``exporter-state.json`` (state.py writes it): the whole document is validated before
anything of it is restored, so a file of any shape — ``[]``, ``{"version": 1, "model": []}``,
``seen: [[1]]``, a negative counter, a NaN, a ``"5"`` where a number belongs — is refused as a whole
(state.py moves it aside, logs one line, counts ``corrupt_state`` and starts clean) instead of crashing
the exporter at start or loading silently and losing steps later.

Strict where a wrong value would corrupt counting (integers are integers, counters are non-negative,
step ranges are sorted disjoint ``[lo, hi]`` pairs, numbers finite); open to fields it does not know
(``extra="allow"``), so a newer writer's additions do not make an older reader throw the state away.
Secret-named passthrough keys left by an older version are dropped (and counted) on the way in."""
from __future__ import annotations

import math
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, \
    ValidationError, field_validator

from .redact import is_secret_key, looks_like_credential

MAX_STEP = 10**12
MAX_COUNT = 10**15


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


Count = Annotated[StrictInt, Field(ge=0, le=MAX_COUNT)]
Step = Annotated[StrictInt, Field(ge=0, le=MAX_STEP)]
Finite = Annotated[Union[StrictInt, StrictFloat], AfterValidator(_finite)]
NonNegFinite = Annotated[Union[StrictInt, StrictFloat], AfterValidator(_finite), Field(ge=0)]
Label = Annotated[str, Field(min_length=1, max_length=128)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Record(_Open):
    step: Step
    arrival: Finite
    duration: Finite | None
    phases: dict[str, Finite]
    rb: Finite | None
    critical: dict[str, Finite]
    idle: Finite | None
    mfu: dict[str, Finite]
    throughput: Finite | None
    flags: list[str]
    values: dict[str, Finite] = Field(default_factory=dict)
    modes: dict[str, str] = Field(default_factory=dict)
    share: Finite | None = None
    causes: dict[str, Finite] = Field(default_factory=dict)
    signals: dict[str, StrictBool | Finite | str | None] = Field(default_factory=dict)


class Incarnation(_Open):
    low: Step | None
    steps: Count
    warmup_done: Count
    warm: list[Record]
    new: StrictBool
    replay_from: Annotated[StrictInt, Field(ge=-1, le=MAX_STEP)] | None


class DigestTable(_Open):
    """Step digests of a run: each feed once, then (step, feed index, digest) rows."""
    feeds: list[str]
    rows: list[tuple[Step, Count, StrictInt]]

    @field_validator("rows")
    @classmethod
    def _feed_index(cls, v: list[tuple[int, int, int]], info) -> list[tuple[int, int, int]]:
        n = len(info.data.get("feeds") or [])
        if any(f >= n for _, f, _ in v):
            raise ValueError("a digest row names a feed index past the feeds")
        return v


class RunState(_Open):
    project: Label
    experiment: Label
    steps_total: Count
    replayed_total: Count
    restarts_total: Count
    incarnation: Incarnation
    stage_seconds_total: dict[str, NonNegFinite]
    flagged_total: dict[str, Count]
    keys: dict[str, Finite]
    feeds: dict[str, Step]
    seen: list[tuple[Step, Step]]
    last: Record | None
    last_arrival: Finite | None
    window: list[Record]
    reference: list[Record] = Field(default_factory=list)
    digests: list[tuple[Step, str, StrictInt]]
    digest_table: DigestTable | None = None
    modes: dict[str, str]
    gpu_seconds: dict[str, NonNegFinite]
    live_arrival: Finite | None
    gpus: tuple[Annotated[StrictInt, Field(ge=1, le=10**7)], str] | None
    key_steps: dict[str, Step] = Field(default_factory=dict)
    grad_nonfinite_total: Count = 0
    planned: dict[str, Any] | None = None

    @field_validator("project", "experiment")
    @classmethod
    def _no_credential(cls, v: str) -> str:
        if looks_like_credential(v):
            raise ValueError("a run label shaped like a credential")
        return v

    @field_validator("seen")
    @classmethod
    def _ranges(cls, v: list[tuple[int, int]]) -> list[tuple[int, int]]:
        prev = -1
        for lo, hi in v:
            if lo > hi:
                raise ValueError("a step range [lo, hi] with lo > hi")
            if lo <= prev:
                raise ValueError("step ranges must be sorted and disjoint")
            prev = hi
        return v


class ModelState(_Open):
    runs: list[RunState] = Field(default_factory=list)
    errors: list[tuple[str, str, Count]] = Field(default_factory=list)
    notifications: dict[str, Count] = Field(default_factory=dict)


class FilePosition(_Open):
    dev: Count
    ino: Count
    offset: Count
    head: str = ""

    @field_validator("head")
    @classmethod
    def _hex(cls, v: str) -> str:
        bytes.fromhex(v)
        return v


class StateDocument(_Open):
    version: StrictInt
    files: dict[str, dict[str, FilePosition]] = Field(default_factory=dict)
    model: ModelState


class StateInvalid(ValueError):
    """The document does not match the schema; the message names fields, never values."""


def check(data: Any, version: int) -> tuple[dict, int]:
    """Validate a decoded state document of format ``version``. Returns it (secret-named keys removed)
    and how many keys were removed; raises :class:`StateInvalid`."""
    if not isinstance(data, dict):
        raise StateInvalid(f"the document is a JSON {type(data).__name__}, not an object")
    if data.get("version") != version:
        raise StateInvalid(f"state version {str(data.get('version'))[:20]!r}, expected {version}")
    try:
        StateDocument.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        where = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'document'}: {err['msg']}" for err in errs[:3])
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        raise StateInvalid(where + more) from None
    dropped = 0
    for run in data["model"].get("runs", []):
        secret = [k for k in run["keys"] if is_secret_key(k)]
        for k in secret:
            del run["keys"][k]
        dropped += len(secret)
    return data, dropped
