"""Alert prose as plain text from its data (``prose.data``: ``{"t": part class, field: ...}`` nodes): the one renderer
of ``Prose.expect``, and the run context it reads (``Ctx``, ``setting_series``), on the ground floor, so the exporter
serves remedies from the data ``omniwatch generate`` writes (remedy_info.py) without importing rule authoring."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from . import names


@dataclass(frozen=True)
class Ctx:
    labels: Mapping[str, str]
    value: float | None = None
    series: Mapping[str, float] = field(default_factory=dict)   # run series name -> value
    modes: Mapping[str, str] | None = None                         # omniwatch_run_info labels; None = absent


PLAIN = {"pct": lambda v: f"{v * 100:.4g}%", "dur": lambda v: f"{v:.0f}s", "f0": lambda v: f"{v:.0f}",
         "f1": lambda v: f"{v:.1f}", "f2": lambda v: f"{v:.2f}"}  # prose.FORMATS' plain formatters
OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "<": lambda a, b: a < b}


def key_of(metric: str, matchers: str = "") -> str:
    """The ``Ctx.series`` key of a series queried with fixed matchers (``kind="checkpoint"``)."""
    return f"{metric}{{{matchers}}}" if matchers else metric


# omniwatch_trainer_config_setting{project, experiment, setting, value} (trainer_config.SETTINGS) as ``Ctx.series``
# carries it (``setting_series``): ``<metric>{setting="x"}`` -> number, ``<metric>{setting="x",value="w"}`` -> 1,
# ``<metric>{setting="x"}:value`` -> word, and CONFIG_READ -> 1 when a config was read.
CONFIG_READ = f'{names.TRAINER_CONFIG_INFO}{{source!="none"}}'


def setting_key(setting: str, value: str | None = None) -> str:
    m = f'setting="{setting}"' + (f',value="{value}"' if value is not None else "")
    return key_of(names.TRAINER_CONFIG_SETTING, m)


NO_CONFIG_INFO = {"source": "none", "engine": "unknown", "trainer": "unknown", "async_mode": "unknown",
                  "lora": "unknown"}  # what the exporter says of a run without a trainer config


def info_series(info: Mapping[str, str]) -> dict:
    """``Ctx.series`` entries for omniwatch_trainer_config_info as the exporter writes it (``info``: its labels)."""
    return {key_of(names.TRAINER_CONFIG_INFO, f'{k}="{v}"'): 1.0 for k, v in info.items()}


def _derived_info(settings: Mapping[str, object]) -> dict[str, str]:
    """The info labels the settings imply (engine; LoRA by its rank), where no info labels were passed."""
    out = {}
    if isinstance(settings.get("engine"), str):
        out["engine"] = str(settings["engine"])
    rank = settings.get("lora_rank")
    if isinstance(rank, (int, float)) and not isinstance(rank, bool):
        out["lora"] = "true" if rank > 0 else "false"
    return out


def setting_series(settings: Mapping[str, object] | None, info: Mapping[str, str] | None = None) -> dict:
    """``Ctx.series`` entries for a run's trainer-config settings and its config info series (None: no config read:
    the info series the exporter writes then, source="none" and every fact unknown). ``info``: the run's
    omniwatch_trainer_config_info labels; without it, what the settings imply."""
    if settings is None:
        return info_series(NO_CONFIG_INFO)
    out: dict = {CONFIG_READ: 1.0, **info_series(info if info is not None else _derived_info(settings))}
    for name, v in settings.items():
        word = ("true" if v else "false") if isinstance(v, bool) else str(v)
        out[setting_key(name)] = 1.0 if isinstance(v, str) else float(v)
        out[setting_key(name, word)] = 1.0
        out[setting_key(name) + ":value"] = word
    return out


# --- the renderer: one entry per part class of alerting/prose.py ------------------------------------------------
def render(prose: list, ctx: Ctx) -> str:
    return "".join(_PART[p["t"]](p, ctx) for p in prose)


def _value(p, v) -> str:  # prefix + value + suffix, or default (Query, SeriesValue, SettingValue)
    return p["default"] if v is None else p["prefix"] + (PLAIN[p["fmt"]](v) if p.get("show", True) else "") + p["suffix"]


def _cond(p, v):  # SeriesValue: the value while it meets ``cond`` (e.g. "> 0")
    op, _, ref = p["cond"].partition(" ")
    return v if v is None or not op or OPS[op](v, float(ref)) else None


def _first(cases, ok, default, ctx) -> str:  # the first case whose condition holds, else ``default``
    return render(next((prose for *cond, prose in cases if ok(*cond)), default), ctx)


def _shift_shape(p, ctx):
    kind, s = ctx.labels.get(f"shape:{p['signal']}"), ctx.series
    if kind == "step":
        return f"{p['prefix']}a step change at step {s.get(names.SHIFT_ONSET_STEP, 0):.0f}"
    if kind == "creep":
        return (f"{p['prefix']}a {p['creep']} of {s.get(names.SHIFT_SIZE, 0) * 100:.4g}% over "
                f"{s.get(names.SHIFT_STEPS, 0):.0f} steps (from step {s.get(names.SHIFT_ONSET_STEP, 0):.0f})")
    return ""


def _wrap(p, v) -> str:  # prefix + word + suffix, or the default (nothing)
    return p.get("default", "") if v is None else f"{p['prefix']}{v}{p['suffix']}"


_PART = {
    "Text": lambda p, ctx: p["text"],
    "Label": lambda p, ctx: ctx.labels.get(p["name"], ""),
    "Value": lambda p, ctx: PLAIN[p["fmt"]](ctx.value),   # a TypeError where the context has no alert value
    "Query": lambda p, ctx: _value(p, ctx.series.get(f"{p['pre']}{p['metric']}{p['post']}")),
    "SeriesValue": lambda p, ctx: _value(p, _cond(p, ctx.series.get(
        key_of(p["metric"], ",".join(f'{k}="{v}"' for k, v in p["fixed"]))))),
    "QueryLabel": lambda p, ctx: _wrap(p, ctx.series.get(f"{p['metric']}:{p['label']}")),
    "IfSeries": lambda p, ctx: render(p["then"] if ctx.series.get(p["metric"]) is not None else p["otherwise"], ctx),
    "LabelIf": lambda p, ctx: _wrap(p, ctx.labels.get(p["name"]) or None),
    "Switch": lambda p, ctx: _first(p["cases"], lambda cond: ctx.modes is not None and all(
        ctx.modes.get(lab) == val for lab, val in cond), p["default"], ctx),
    "LabelSwitch": lambda p, ctx: render(dict(p["cases"]).get(ctx.labels.get(p["name"]), p["default"]), ctx),
    "ShiftShape": _shift_shape,
    "SettingSwitch": lambda p, ctx: _first(p["cases"], lambda conds: all(
        ctx.series.get(setting_key(s, v)) is not None for s, v in conds),
        p["default"] if ctx.series.get(CONFIG_READ) is not None else p["unknown"], ctx),
    "SettingValue": lambda p, ctx: _value(p, ctx.series.get(setting_key(p["setting"]))),
    "SettingWord": lambda p, ctx: _wrap(p, ctx.series.get(setting_key(p["setting"]) + ":value")),
    "ValueSwitch": lambda p, ctx: _first(p["cases"], lambda op, ref: (v := ctx.series.get(p["metric"])) is not None
                                         and OPS[op](v, ref), p["default"], ctx),
}
