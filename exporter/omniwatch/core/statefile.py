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

import dataclasses
import math
import types
import typing
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, \
    ValidationError, create_model, field_validator

from .analytics import WINDOW_VALUE_KEYS, StepRecord
from ..redact import is_secret_key, looks_like_credential

VERSION = 3  # 3: a step record is stored under StepRecord's own field names (2: renamed keys, read and upgraded)

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


# --- the step record: one schema, StepRecord's ------------------------------------------------------------
# The state file stores a StepRecord under its own field names; the validating model below is derived from
# the dataclass's fields and types, so a field added to StepRecord is checkpointed and checked without a
# second list to keep in step (a type this map does not know fails at import, not at a restart).
def _state_type(t: Any) -> Any:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is int:
        return Step
    if t is float:
        return Finite
    if t is bool:
        return StrictBool
    if t is str or t is type(None):
        return t
    if origin in (Union, types.UnionType):
        return Union[tuple(_state_type(a) for a in args)]
    if origin is dict:
        return dict[_state_type(args[0]), _state_type(args[1])]
    if origin is frozenset:
        return list[_state_type(args[0])]
    raise TypeError(f"StepRecord field type {t!r} has no state-file form (statefile._state_type)")


_REC_FIELDS = dataclasses.fields(StepRecord)
RECORD_FIELDS = tuple(f.name for f in _REC_FIELDS)
_REC_TYPES = typing.get_type_hints(StepRecord)


def _record_field(f: dataclasses.Field) -> tuple[Any, Any]:
    t = _state_type(_REC_TYPES[f.name])
    if f.default is not dataclasses.MISSING:
        return t, (list(f.default) if isinstance(f.default, frozenset) else f.default)
    if f.default_factory is not dataclasses.MISSING:
        return t, Field(default_factory=f.default_factory)
    return t, ...


Record = create_model("Record", __base__=_Open, **{f.name: _record_field(f) for f in _REC_FIELDS})


def record_to_json(rec: StepRecord) -> dict:
    """A kept step record as the state file stores it: every StepRecord field under its own name, the flags
    as a sorted list, of the raw values only those window computations read (analytics.WINDOW_VALUE_KEYS)."""
    out = {name: getattr(rec, name) for name in RECORD_FIELDS}
    out["flags"] = sorted(rec.flags)
    out["values"] = {k: rec.values[k] for k in sorted(WINDOW_VALUE_KEYS) if k in rec.values}
    return out


def record_from_json(d: dict) -> StepRecord:
    """The inverse of :func:`record_to_json` (of a record :func:`check` has validated)."""
    kw = {name: d[name] for name in RECORD_FIELDS if name in d}
    kw["flags"] = frozenset(d.get("flags", ()))
    return StepRecord(**kw)


# Version 2 stored a record under renamed keys with the issue-13 signals in one mapping; read and upgraded.
_V2_NAMES = {"rb": "reward_bound_ratio", "critical": "reward_critical", "idle": "idle_ratio",
             "share": "reward_step_share"}


def _upgrade_record_v2(d: Any) -> Any:
    if not isinstance(d, dict) or "rb" not in d:
        return d  # not a version-2 record: validation says what is wrong with it
    out = {_V2_NAMES.get(k, k): v for k, v in d.items() if k != "signals"}
    signals = d.get("signals")
    if isinstance(signals, dict):
        for k, v in signals.items():
            if k in RECORD_FIELDS and k not in out:
                out[k] = v
    return out


def upgrade_v2(data: dict) -> dict:
    """A version-2 document in version 3's form (only the step records changed; their digests are
    ``model.legacy_step_digest``'s, which ``state.restore_store`` marks)."""
    model = data.get("model")
    runs = model.get("runs") if isinstance(model, dict) else None
    for run in runs if isinstance(runs, list) else ():
        if not isinstance(run, dict):
            continue
        for key in ("window", "reference"):
            if isinstance(run.get(key), list):
                run[key] = [_upgrade_record_v2(r) for r in run[key]]
        run["last"] = _upgrade_record_v2(run.get("last"))
        inc = run.get("incarnation")
        if isinstance(inc, dict) and isinstance(inc.get("warm"), list):
            inc["warm"] = [_upgrade_record_v2(r) for r in inc["warm"]]
        run["legacy_digests"] = True
    data["version"] = VERSION
    return data


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


class WindowState(_Open):
    """What a run window keeps beyond its steps (analytics.RunWindow): the compact history (the shape of a shift),
    a previous incarnation's reference kept across a restart (pending or adopted), why it was dropped, the
    cause StepTimeRegression names and the window end it was named at."""
    history: list[tuple[Step, Finite | None, Finite | None, list[tuple[str, Finite]]]] = Field(default_factory=list)
    prior: list[Record] | None = None
    prior_leader: Annotated[str, Field(max_length=64)] | None = None
    kept: list[Record] | None = None
    reason: Annotated[str, Field(max_length=64)] = ""
    leader: Annotated[str, Field(max_length=64)] | None = None
    leader_at: Annotated[StrictInt, Field(ge=-1, le=MAX_STEP)] = -1
    carry: Annotated[str, Field(max_length=64)] | None = None
    carried: list[Record] = Field(default_factory=list)
    carried_history: list[tuple[Step, Finite | None, Finite | None, list[tuple[str, Finite]]]] = Field(default_factory=list)


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
    window_state: WindowState | None = None
    digests: list[tuple[Step, str, StrictInt]]
    digest_table: DigestTable | None = None
    modes: dict[str, str]
    gpu_seconds: dict[str, NonNegFinite]
    live_arrival: Finite | None
    gpus: tuple[Annotated[StrictInt, Field(ge=1, le=10**7)], str] | None
    key_steps: dict[str, Step] = Field(default_factory=dict)
    legacy_digests: StrictBool = False  # its digests are model.legacy_step_digest's (a version-2 file's)
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


def check(data: Any, version: int = VERSION) -> tuple[dict, int]:
    """Validate a decoded state document of format ``version`` (a version-2 document is upgraded first,
    ``upgrade_v2``). Returns it (secret-named keys removed) and how many keys were removed; raises
    :class:`StateInvalid`."""
    if not isinstance(data, dict):
        raise StateInvalid(f"the document is a JSON {type(data).__name__}, not an object")
    if version == VERSION and data.get("version") == 2:
        data = upgrade_v2(data)
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
