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

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .. import names


@dataclass(frozen=True)
class Ctx:
    labels: Mapping[str, str]
    value: float | None = None
    series: Mapping[str, float] = field(default_factory=dict)   # run series name -> value
    modes: Mapping[str, str] | None = None                         # omniwatch_run_info labels; None = absent


def span(d: str) -> str:
    """``10m`` -> ``10 minutes``, ``1h`` -> ``hour`` (as in "the last hour"), ``90s`` -> ``90 seconds``."""
    number, unit = float(d[:-1]), {"s": "second", "m": "minute", "h": "hour", "d": "day"}[d[-1]]
    return unit if number == 1 else f"{number:g} {unit}s"


# fmt name -> (Go pipeline suffix, plain Python formatter for ``expect``)
FORMATS = {
    "pct": ("humanizePercentage", lambda v: f"{v * 100:.4g}%"),
    "dur": ("humanizeDuration", lambda v: f"{v:.0f}s"),
    "f0": ('printf "%.0f"', lambda v: f"{v:.0f}"),
    "f1": ('printf "%.1f"', lambda v: f"{v:.1f}"),
    "f2": ('printf "%.2f"', lambda v: f"{v:.2f}"),
}


# --- parts ----------------------------------------------------------------------------------------------
class Part:
    def go(self) -> str:
        raise NotImplementedError

    def expect(self, ctx: Ctx) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Text(Part):
    text: str

    def go(self) -> str:
        if "{{" in self.text or "}}" in self.text:
            raise ValueError(f"literal alert text may not contain template braces: {self.text!r}")
        return self.text

    def expect(self, ctx: Ctx) -> str:
        return self.text


@dataclass(frozen=True)
class Label(Part):
    name: str

    def go(self) -> str:
        return f"{{{{ $labels.{self.name} }}}}"

    def expect(self, ctx: Ctx) -> str:
        return ctx.labels.get(self.name, "")


@dataclass(frozen=True)
class Value(Part):
    fmt: str

    def go(self) -> str:
        return f"{{{{ $value | {FORMATS[self.fmt][0]} }}}}"

    def expect(self, ctx: Ctx) -> str:
        assert ctx.value is not None, "the test context needs the alert's value"
        return FORMATS[self.fmt][1](ctx.value)


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

    @property
    def key(self) -> str:
        """The ``Ctx.series`` key of this query: the metric, or the whole expression when wrapped."""
        return f"{self.pre}{self.metric}{self.post}"

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
        body = f"{{{{ . | first | value | {FORMATS[self.fmt][0]} }}}}" if self.show else ""
        return f"{{{{ with {sel} | query }}}}{self.prefix}{body}{self.suffix}{other}{{{{ end }}}}"

    def expect(self, ctx: Ctx) -> str:
        v = ctx.series.get(self.key)
        if v is None:
            return self.default
        return self.prefix + (FORMATS[self.fmt][1](v) if self.show else "") + self.suffix


def key_of(metric: str, matchers: str = "") -> str:
    """The ``Ctx.series`` key of a series queried with fixed matchers (``kind="checkpoint"``)."""
    return f"{metric}{{{matchers}}}" if matchers else metric


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

    @property
    def key(self) -> str:
        return key_of(self.metric, ",".join(f'{k}="{v}"' for k, v in self.fixed))

    def go(self) -> str:
        for part in (self.prefix, self.suffix, self.default):
            Text(part).go()
        m = "".join(f",{k}=%q" for k, _ in self.fixed)
        args = "".join(f' "{v}"' for _, v in self.fixed)
        cond = f" {self.cond}" if self.cond else ""
        sel = f'printf "{self.metric}{{project=%q,experiment=%q{m}}}{cond}" $labels.project $labels.experiment{args}'
        body = f"{{{{ . | first | value | {FORMATS[self.fmt][0]} }}}}" if self.show else ""
        other = f"{{{{ else }}}}{self.default}" if self.default else ""
        return f"{{{{ with {sel} | query }}}}{self.prefix}{body}{self.suffix}{other}{{{{ end }}}}"

    def expect(self, ctx: Ctx) -> str:
        v = ctx.series.get(self.key)
        if v is not None and self.cond:
            op, _, ref = self.cond.partition(" ")
            v = v if {">": v > float(ref), ">=": v >= float(ref), "==": v == float(ref)}[op] else None
        if v is None:
            return self.default
        return self.prefix + (FORMATS[self.fmt][1](v) if self.show else "") + self.suffix


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

    def expect(self, ctx: Ctx) -> str:
        v = ctx.series.get(f"{self.metric}:{self.label}")
        return "" if v is None else f"{self.prefix}{v}{self.suffix}"


@dataclass(frozen=True)
class IfSeries(Part):
    """``then`` while the run has the series ``metric`` (any value), else ``otherwise``."""
    metric: str
    then: "Prose"
    otherwise: "Prose"

    def go(self) -> str:
        sel = _run_selector(self.metric, "")
        return f"{{{{ if {sel} | query }}}}{self.then.go()}{{{{ else }}}}{self.otherwise.go()}{{{{ end }}}}"

    def expect(self, ctx: Ctx) -> str:
        return (self.then if ctx.series.get(self.metric) is not None else self.otherwise).expect(ctx)


@dataclass(frozen=True)
class LabelIf(Part):
    """``prefix + $labels.<name> + suffix`` when the alert has that label, else nothing."""
    name: str
    prefix: str = ""
    suffix: str = ""

    def go(self) -> str:
        Text(self.prefix).go(), Text(self.suffix).go()
        return f"{{{{ with $labels.{self.name} }}}}{self.prefix}{{{{ . }}}}{self.suffix}{{{{ end }}}}"

    def expect(self, ctx: Ctx) -> str:
        v = ctx.labels.get(self.name)
        return f"{self.prefix}{v}{self.suffix}" if v else ""


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

    def expect(self, ctx: Ctx) -> str:
        if ctx.modes is not None:
            for cond, prose in self.cases:
                if all(ctx.modes.get(lab) == val for lab, val in cond):
                    return prose.expect(ctx)
        return self.default.expect(ctx)


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

    def expect(self, ctx: Ctx) -> str:
        return dict(self.cases).get(ctx.labels.get(self.name), self.default).expect(ctx)


@dataclass(frozen=True)
class Prose:
    parts: tuple[Part, ...]

    def go(self) -> str:
        return "".join(p.go() for p in self.parts)

    def expect(self, ctx: Ctx) -> str:
        return "".join(p.expect(ctx) for p in self.parts)

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
