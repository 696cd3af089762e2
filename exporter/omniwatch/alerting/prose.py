"""Alert text written once: the Go template Prometheus fills in when the alert fires (``go()``), and a plain
text of the same parts for readers outside Prometheus (``expect(ctx)``: the remedy in the offline report,
``omniwatch_remedy_info`` and docs/alerts.md's remedy table).

A :class:`Prose` is a sequence of parts: literal text, or slots (the alert's value, a run label, the
value of one of the run's series, a branch on the run's detected modes). ``expect(ctx)`` fills them with
``ctx``'s labels, series and ``omniwatch_run_info`` modes, and formats numbers plainly: it is not a model of
Prometheus' template functions, and no test predicts an annotation with it. The promtool tests in
``alerts/tests/`` state the text Prometheus renders literally.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Sequence

from .. import names
from ..prosetext import Ctx, render


def span(d: str) -> str:
    """``10m`` -> ``10 minutes``, ``1h`` -> ``hour`` (as in "the last hour"), ``90s`` -> ``90 seconds``."""
    number, unit = float(d[:-1]), {"s": "second", "m": "minute", "h": "hour", "d": "day"}[d[-1]]
    return unit if number == 1 else f"{number:g} {unit}s"


FORMATS = {"pct": "humanizePercentage", "dur": "humanizeDuration", "f0": 'printf "%.0f"', "f1": 'printf "%.1f"',
           "f2": 'printf "%.2f"'}  # fmt name -> Go pipeline suffix (the plain ones: prosetext.PLAIN)


def data(x):
    """The JSON tree prosetext.render reads: a prose -> its parts' list, a part -> {"t": class, field: data}."""
    if isinstance(x, Prose):
        return [data(p) for p in x.parts]
    if isinstance(x, Part):
        return {"t": type(x).__name__, **{f.name: data(getattr(x, f.name)) for f in fields(x)}}
    return [data(v) for v in x] if isinstance(x, tuple) else x


# --- parts ----------------------------------------------------------------------------------------------
class Part:
    def go(self) -> str:
        raise NotImplementedError

    def expect(self, ctx: Ctx) -> str:
        return render([data(self)], ctx)


@dataclass(frozen=True)
class Text(Part):
    text: str

    def go(self) -> str:
        if "{{" in self.text or "}}" in self.text:
            raise ValueError(f"literal alert text may not contain template braces: {self.text!r}")
        return self.text


@dataclass(frozen=True)
class Label(Part):
    name: str

    def go(self) -> str:
        return f"{{{{ $labels.{self.name} }}}}"


@dataclass(frozen=True)
class Value(Part):
    fmt: str

    def go(self) -> str:
        return f"{{{{ $value | {FORMATS[self.fmt]} }}}}"


def _run_selector(metric: str, extra: str) -> str:
    m = f",{extra}" if extra else ""
    return f'printf "{metric}{{project=%q,experiment=%q{m}}}" $labels.project $labels.experiment'


@dataclass(frozen=True)
class Query(Part):
    """The value of one of the run's series at evaluation time (``query`` over the run's labels):
    ``prefix + formatted value + suffix``, or ``default`` when the series is absent.

    ``pre`` / ``post`` wrap the run's selector in PromQL (``pre + metric{project, experiment} + post``, e.g.
    ``post=" > 0"``: the part shows only while the value is positive); ``expect`` then reads the
    value of that whole expression from ``Ctx.series[key]``. ``show``
    False leaves the value out (a closing bracket that belongs to an earlier part, say)."""
    metric: str
    fmt: str = "f0"
    prefix: str = ""
    suffix: str = ""
    default: str = ""
    matchers: str = ""  # extra label matchers, e.g. 'role="actor"' (values may use $labels via %q below)
    label_args: tuple[str, ...] = ()  # $labels.<x> values filling %q placeholders in `matchers`
    pre: str = ""
    post: str = ""
    show: bool = True

    def go(self) -> str:
        m = f",{self.matchers}" if self.matchers else ""
        args = " ".join(f"$labels.{a}" for a in self.label_args)
        for text in (self.pre, self.post):
            if any(ch in text for ch in '"%`'):
                raise ValueError(f"PromQL around a query may not contain quotes or %: {text!r}")
        sel = (f'printf "{self.pre}{self.metric}{{project=%q,experiment=%q{m}}}{self.post}" '
               f'$labels.project $labels.experiment{" " + args if args else ""}')
        for part in (self.prefix, self.suffix, self.default):
            Text(part).go()
        other = f"{{{{ else }}}}{self.default}" if self.default else ""
        body = f"{{{{ . | first | value | {FORMATS[self.fmt]} }}}}" if self.show else ""
        return f"{{{{ with {sel} | query }}}}{self.prefix}{body}{self.suffix}{other}{{{{ end }}}}"


@dataclass(frozen=True)
class SeriesValue(Part):
    """The value of one of the run's series, selected with fixed label values (``fixed``: label -> value,
    passed to printf as literals) and an optional comparison (``cond``, e.g. ``> 0``): ``prefix + value +
    suffix`` when the query returns a sample, else ``default``; ``show`` False leaves the value out."""
    metric: str
    fmt: str = "dur"
    prefix: str = ""
    suffix: str = ""
    default: str = ""
    fixed: tuple[tuple[str, str], ...] = ()
    cond: str = ""
    show: bool = True

    def go(self) -> str:
        for part in (self.prefix, self.suffix, self.default):
            Text(part).go()
        m = "".join(f",{k}=%q" for k, _ in self.fixed)
        args = "".join(f' "{v}"' for _, v in self.fixed)
        cond = f" {self.cond}" if self.cond else ""
        sel = f'printf "{self.metric}{{project=%q,experiment=%q{m}}}{cond}" $labels.project $labels.experiment{args}'
        body = f"{{{{ . | first | value | {FORMATS[self.fmt]} }}}}" if self.show else ""
        other = f"{{{{ else }}}}{self.default}" if self.default else ""
        return f"{{{{ with {sel} | query }}}}{self.prefix}{body}{self.suffix}{other}{{{{ end }}}}"


@dataclass(frozen=True)
class QueryLabel(Part):
    """A label of one of the run's series (first result): ``prefix + label value + suffix``, or nothing."""
    metric: str
    label: str
    prefix: str = ""
    suffix: str = ""
    matchers: str = ""
    label_args: tuple[str, ...] = ()

    def go(self) -> str:
        m = f",{self.matchers}" if self.matchers else ""
        args = " ".join(f"$labels.{a}" for a in self.label_args)
        sel = f'printf "{self.metric}{{project=%q,experiment=%q{m}}}" $labels.project $labels.experiment{" " + args if args else ""}'
        Text(self.prefix).go(), Text(self.suffix).go()
        return f'{{{{ with {sel} | query }}}}{self.prefix}{{{{ . | first | label "{self.label}" }}}}{self.suffix}{{{{ end }}}}'


@dataclass(frozen=True)
class IfSeries(Part):
    """``then`` while the run has the series ``metric`` (any value), else ``otherwise``."""
    metric: str
    then: "Prose"
    otherwise: "Prose"

    def go(self) -> str:
        sel = _run_selector(self.metric, "")
        return f"{{{{ if {sel} | query }}}}{self.then.go()}{{{{ else }}}}{self.otherwise.go()}{{{{ end }}}}"


@dataclass(frozen=True)
class LabelIf(Part):
    """``prefix + $labels.<name> + suffix`` when the alert has that label, else nothing."""
    name: str
    prefix: str = ""
    suffix: str = ""

    def go(self) -> str:
        Text(self.prefix).go(), Text(self.suffix).go()
        return f"{{{{ with $labels.{self.name} }}}}{self.prefix}{{{{ . }}}}{self.suffix}{{{{ end }}}}"


@dataclass(frozen=True)
class Switch(Part):
    """Branch on the run's detected modes (labels of ``omniwatch_run_info``): the first case whose every
    label matches wins; ``default`` when none does or the run has no info series."""
    cases: tuple[tuple[tuple[tuple[str, str], ...], "Prose"], ...]
    default: "Prose"

    def go(self) -> str:
        if not self.cases:
            return self.default.go()
        out = [f"{{{{ with {_run_selector(names.RUN_INFO, '')} | query }}}}{{{{ $i := . | first }}}}"]
        for k, (cond, prose) in enumerate(self.cases):
            tests = [f'(eq ($i | label "{lab}") "{val}")' for lab, val in cond]
            test = tests[0][1:-1] if len(tests) == 1 else "and " + " ".join(tests)
            out.append(f"{{{{ {'if' if k == 0 else 'else if'} {test} }}}}{prose.go()}")
        out.append(f"{{{{ else }}}}{self.default.go()}{{{{ end }}}}{{{{ else }}}}{self.default.go()}{{{{ end }}}}")
        return "".join(out)


@dataclass(frozen=True)
class LabelSwitch(Part):
    """Branch on one of the alert's own labels (``$labels.<name>``)."""
    name: str
    cases: tuple[tuple[str, "Prose"], ...]
    default: "Prose"

    def go(self) -> str:
        out = [f'{{{{ {"if" if k == 0 else "else if"} eq $labels.{self.name} "{val}" }}}}{prose.go()}'
               for k, (val, prose) in enumerate(self.cases)]
        return "".join(out) + f"{{{{ else }}}}{self.default.go()}{{{{ end }}}}"


@dataclass(frozen=True)
class ShiftShape(Part):
    """What a signal did since its reference, as the exporter fitted it (shift.shape): ``prefix`` + "a step change at
    step N" or "a <creep> of X% over N steps (from step M)" (``creep``: the word for this signal's direction); nothing
    while the exporter has no shape for it. ``role``: the signal is per role ($labels.role)."""
    signal: str
    creep: str = "creep"
    prefix: str = ""
    role: bool = False

    def _sel(self, metric: str, extra: str = "", cond: str = "") -> str:
        role = ",role=%q" if self.role else ""
        arg = " $labels.role" if self.role else ""
        m = ",shape=%q" if extra else ""
        a = f' "{extra}"' if extra else ""
        return (f'printf "{metric}{{project=%q,experiment=%q,signal=%q{role}{m}}}{cond}" $labels.project '
                f'$labels.experiment "{self.signal}"{arg}{a}')

    def go(self) -> str:
        Text(self.prefix).go(), Text(self.creep).go()
        v = "{{ . | first | value | printf \"%.0f\" }}"
        onset = f"{{{{ with {self._sel(names.SHIFT_ONSET_STEP)} | query }}}}{v}{{{{ end }}}}"
        steps = f"{{{{ with {self._sel(names.SHIFT_STEPS)} | query }}}}{v}{{{{ end }}}}"
        size = f"{{{{ with {self._sel(names.SHIFT_SIZE)} | query }}}}{{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}"
        step = f"{{{{ with {self._sel(names.SHIFT_SHAPE, 'step', ' == 1')} | query }}}}{self.prefix}a step change at step {onset}"
        creep = (f"{{{{ else }}}}{{{{ with {self._sel(names.SHIFT_SHAPE, 'creep', ' == 1')} | query }}}}{self.prefix}a "
                 f"{self.creep} of {size} over {steps} steps (from step {onset}){{{{ end }}}}{{{{ end }}}}")
        return step + creep


@dataclass(frozen=True)
class Prose:
    parts: tuple[Part, ...]

    def go(self) -> str:
        return "".join(p.go() for p in self.parts)

    def expect(self, ctx: Ctx) -> str:
        return render(data(self), ctx)

    def __add__(self, other: "Prose | str") -> "Prose":
        return Prose(self.parts + P(other).parts)

    def __radd__(self, other: str) -> "Prose":
        return P(other) + self


def P(*items: "str | Part | Prose") -> Prose:
    """Build prose from strings (literal text), parts and other prose."""
    parts: list[Part] = []
    for it in items:
        if isinstance(it, Prose):
            parts.extend(it.parts)
        elif isinstance(it, Part):
            parts.append(it)
        elif isinstance(it, str):
            if it:
                parts.append(Text(it))
        else:
            raise TypeError(it)
    return Prose(tuple(parts))


def switch(cases: Sequence[tuple[Mapping[str, str], "Prose | str"]], default: "Prose | str") -> Prose:
    return P(Switch(tuple((tuple(sorted(c.items())), P(p)) for c, p in cases), P(default)))


# Slots every run-scoped alert uses.
RUN = P(Label(names.L_PROJECT), "/", Label(names.L_EXPERIMENT))
K = Query(names.WINDOW_STEPS, "f0", default="k")
AT_STEP = Query(names.STEP, "f0", prefix=", at step ")
STEP = Query(names.STEP, "f0")


# --- the run's trainer configuration (issue 32: remedies from the run's own config) ---------------------------
# omniwatch_trainer_config_setting{project, experiment, setting, value} (trainer_config.SETTINGS): one series per
# setting the run's config states; value = its word, the sample = its number. A remedy branches on it with
# SettingSwitch and quotes it with SettingValue / SettingWord (``Ctx.series`` carries them: prosetext.setting_series).
def _setting_query(conds: tuple[tuple[str, str], ...]) -> str:
    """printf + args of the PromQL that returns a sample when the run's config states every (setting, value)."""
    m = names.TRAINER_CONFIG_SETTING
    one = f"{m}{{project=%q,experiment=%q,setting=%q,value=%q}}"
    fmt = " and on (project, experiment) ".join([one] * len(conds))
    args = " ".join(f'$labels.project $labels.experiment "{s}" "{v}"' for s, v in conds)
    return f'printf "{fmt}" {args}'


@dataclass(frozen=True)
class SettingSwitch(Part):
    """Branch on the run's trainer config: the first case whose every (setting, value) the config states wins;
    ``default`` when a config was read but states none of them; ``unknown`` when no config was read for the run
    (``omniwatch_trainer_config_info{source="none"}``, or no info series at all)."""
    cases: tuple[tuple[tuple[tuple[str, str], ...], "Prose"], ...]
    default: "Prose"
    unknown: "Prose"

    def go(self) -> str:
        read = (f'printf "{names.TRAINER_CONFIG_INFO}{{project=%q,experiment=%q,source!=%q}}" '
                f'$labels.project $labels.experiment "none"')
        tail = f"{{{{ with {read} | query }}}}{self.default.go()}{{{{ else }}}}{self.unknown.go()}{{{{ end }}}}"
        for conds, prose in reversed(self.cases):
            tail = f"{{{{ with {_setting_query(conds)} | query }}}}{prose.go()}{{{{ else }}}}{tail}{{{{ end }}}}"
        return tail


def settings(cases: Sequence[tuple[Mapping[str, str], "Prose | str"]], default: "Prose | str",
             unknown: "Prose | str") -> Prose:
    """``SettingSwitch`` from ``({setting: value, ...}, text)`` cases (values as the ``value`` label says them)."""
    return P(SettingSwitch(tuple((tuple(c.items()), P(p)) for c, p in cases), P(default), P(unknown)))


@dataclass(frozen=True)
class SettingValue(Part):
    """The number a run's config states for ``setting`` (``prefix + value + suffix``), or ``default``."""
    setting: str
    prefix: str = ""
    suffix: str = ""
    default: str = ""
    fmt: str = "f0"

    def go(self) -> str:
        return SeriesValue(names.TRAINER_CONFIG_SETTING, self.fmt, self.prefix, self.suffix, self.default,
                           fixed=((names.L_SETTING, self.setting),)).go()


@dataclass(frozen=True)
class SettingWord(Part):
    """The word a run's config states for ``setting`` (true / false / an enum word / the integer)."""
    setting: str
    prefix: str = ""
    suffix: str = ""
    default: str = ""

    def go(self) -> str:
        for part in (self.prefix, self.suffix, self.default):
            Text(part).go()
        sel = (f'printf "{names.TRAINER_CONFIG_SETTING}{{project=%q,experiment=%q,setting=%q}}" '
               f'$labels.project $labels.experiment "{self.setting}"')
        other = f"{{{{ else }}}}{self.default}" if self.default else ""
        return (f'{{{{ with {sel} | query }}}}{self.prefix}{{{{ . | first | label "{names.L_VALUE}" }}}}'
                f'{self.suffix}{other}{{{{ end }}}}')


@dataclass(frozen=True)
class Remedy(Prose):
    """A remedy: the full text (its parts) and a one-line ``action`` (<= ACTION_MAX characters rendered, for every
    layout and config: the override to paste or the one thing to check) shown first — the overview's "Why slow"
    row, the relay message, the alert's ``action`` annotation."""
    action: Prose = field(default_factory=lambda: Prose(()))


ACTION_MAX = 120


def remedy(text: "Prose | str", action: "Prose | str") -> Remedy:
    return Remedy(P(text).parts, P(action))


@dataclass(frozen=True)
class ValueSwitch(Part):
    """Branch on the value of one of the run's series: the first ``(op, number, prose)`` case it satisfies wins;
    ``default`` when none does or the series is absent."""
    metric: str
    cases: tuple[tuple[str, float, "Prose"], ...]
    default: "Prose"

    def go(self) -> str:
        tail = self.default.go()
        for op, ref, prose in reversed(self.cases):
            sel = f'printf "{self.metric}{{project=%q,experiment=%q}} {op} {ref:g}" $labels.project $labels.experiment'
            tail = f"{{{{ with {sel} | query }}}}{prose.go()}{{{{ else }}}}{tail}{{{{ end }}}}"
        return tail


def by_value(metric: str, cases: Sequence[tuple[str, float, "Prose | str"]], default: "Prose | str") -> Prose:
    return P(ValueSwitch(metric, tuple((op, float(ref), P(p)) for op, ref, p in cases), P(default)))
