"""Alert prose as plain text, from its data (issue 34 item 2, the floors): the one renderer of ``Prose.expect``.

``alerting/prose.py`` authors alert text (parts, ``go()``: the Go template); :func:`data` of a part there is a JSON
tree of ``{"t": <part class>, <field>: ...}`` nodes (a prose: a list of nodes), and :func:`render` fills one with a
:class:`Ctx` here, on the ground floor, so the exporter serves remedy texts from the data file ``omniwatch
generate`` writes (remedy_info.py) without importing rule authoring. The run-context helpers (``setting_series``:
a run's trainer config as the series a remedy queries) live here for the same reason.
"""
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


INFO_LABELS = ("source", "engine", "trainer", "async_mode", "lora")  # omniwatch_trainer_config_info's own labels
NO_CONFIG_INFO = {"source": "none", "engine": "unknown", "trainer": "unknown", "async_mode": "unknown",
                  "lora": "unknown"}  # what the exporter says of a run without a trainer config


def info_series(info: Mapping[str, str]) -> dict:
    """``Ctx.series`` entries for omniwatch_trainer_config_info as the exporter writes it (``info``: its labels,
    trainer_config.TrainerConfig.info_labels): a remedy part that queries it with one fixed label
    (``remedies._config("engine", "veomni", ...)``) renders as Prometheus renders it."""
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


# --- the renderer: one function per part class of alerting/prose.py ---------------------------------------------
def render(prose: list, ctx: Ctx) -> str:
    return "".join(_PART[p["t"]](p, ctx) for p in prose)


def _value(p, v) -> str:  # prefix + value + suffix, or default (Query, SeriesValue)
    return p["default"] if v is None else p["prefix"] + (PLAIN[p["fmt"]](v) if p["show"] else "") + p["suffix"]


def _value_part(p, ctx):
    assert ctx.value is not None, "the test context needs the alert's value"
    return PLAIN[p["fmt"]](ctx.value)


def _series_value(p, ctx):
    v = ctx.series.get(key_of(p["metric"], ",".join(f'{k}="{v}"' for k, v in p["fixed"])))
    if v is not None and p["cond"]:
        op, _, ref = p["cond"].partition(" ")
        v = v if OPS[op](v, float(ref)) else None
    return _value(p, v)


def _switch(p, ctx):
    if ctx.modes is not None:
        for cond, prose in p["cases"]:
            if all(ctx.modes.get(lab) == val for lab, val in cond):
                return render(prose, ctx)
    return render(p["default"], ctx)


def _shift_shape(p, ctx):
    kind, s = ctx.labels.get(f"shape:{p['signal']}"), ctx.series
    if kind == "step":
        return f"{p['prefix']}a step change at step {s.get(names.SHIFT_ONSET_STEP, 0):.0f}"
    if kind == "creep":
        return (f"{p['prefix']}a {p['creep']} of {s.get(names.SHIFT_SIZE, 0) * 100:.4g}% over "
                f"{s.get(names.SHIFT_STEPS, 0):.0f} steps (from step {s.get(names.SHIFT_ONSET_STEP, 0):.0f})")
    return ""


def _setting_switch(p, ctx):
    for conds, prose in p["cases"]:
        if all(ctx.series.get(setting_key(s, v)) is not None for s, v in conds):
            return render(prose, ctx)
    return render(p["default"] if ctx.series.get(CONFIG_READ) is not None else p["unknown"], ctx)


def _value_switch(p, ctx):
    v = ctx.series.get(p["metric"])
    if v is not None:
        for op, ref, prose in p["cases"]:
            if OPS[op](v, ref):
                return render(prose, ctx)
    return render(p["default"], ctx)


def _label_if(p, ctx):
    v = ctx.labels.get(p["name"])
    return f"{p['prefix']}{v}{p['suffix']}" if v else ""


def _query_label(p, ctx):
    v = ctx.series.get(f"{p['metric']}:{p['label']}")
    return "" if v is None else f"{p['prefix']}{v}{p['suffix']}"


def _setting_value(p, ctx):
    v = ctx.series.get(setting_key(p["setting"]))
    return p["default"] if v is None else p["prefix"] + PLAIN[p["fmt"]](v) + p["suffix"]


def _setting_word(p, ctx):
    v = ctx.series.get(setting_key(p["setting"]) + ":value")
    return p["default"] if v is None else f"{p['prefix']}{v}{p['suffix']}"


_PART = {
    "Text": lambda p, ctx: p["text"],
    "Label": lambda p, ctx: ctx.labels.get(p["name"], ""),
    "Value": _value_part,
    "Query": lambda p, ctx: _value(p, ctx.series.get(f"{p['pre']}{p['metric']}{p['post']}")),
    "SeriesValue": _series_value,
    "QueryLabel": _query_label,
    "IfSeries": lambda p, ctx: render(p["then"] if ctx.series.get(p["metric"]) is not None else p["otherwise"], ctx),
    "LabelIf": _label_if,
    "Switch": _switch,
    "LabelSwitch": lambda p, ctx: render(dict(p["cases"]).get(ctx.labels.get(p["name"]), p["default"]), ctx),
    "ShiftShape": _shift_shape,
    "SettingSwitch": _setting_switch,
    "SettingValue": _setting_value,
    "SettingWord": _setting_word,
    "ValueSwitch": _value_switch,
}
