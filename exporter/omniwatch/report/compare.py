"""Run vs run: ``omniwatch compare A B`` — did the config change pay off?

Per ledger bucket: the median wall seconds per normal step side by side with the change, and GPU-hours
per 1,000 images before and after (images: verl's ``perf/total_num_images``; a run without it is
compared per step). The bottleneck that moved is the bucket whose GPU-hours per 1,000 images fell (or
grew) most; alerts are split into resolved (fired in A only), new (B only) and kept.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core import ledger
from .facts import RunFacts
from .verdict import Bottleneck
from .output import facts_json


MOVED = 0.05


@dataclass
class Comparison:
    a: RunFacts
    b: RunFacts
    va: list[Bottleneck]
    vb: list[Bottleneck]

    @property
    def unit(self) -> str:
        return "GPU-h per 1,000 images" if self.a.images and self.b.images else "GPU-h per step"

    def per_unit(self, f: RunFacts) -> dict[str, float]:
        hours = f.gpu_hours()
        if self.a.images and self.b.images:
            return {b: h / (f.images / 1000) for b, h in hours.items()}
        n = len(f.steps) or 1
        return {b: h / n for b, h in hours.items()}

    def phases(self) -> list[dict]:
        ma, mb = self.a.phase_medians(), self.b.phase_medians()
        rows = []
        for b in ledger.ordered(set(ma) | set(mb)):
            x, y = ma.get(b, 0.0), mb.get(b, 0.0)
            rows.append({"bucket": b, "a": x, "b": y, "change": _change(x, y)})
        x, y = self.a.median_step_seconds, self.b.median_step_seconds
        rows.append({"bucket": "step", "a": x, "b": y, "change": _change(x, y)})
        return rows

    def buckets(self) -> list[dict]:
        pa, pb = self.per_unit(self.a), self.per_unit(self.b)
        rows = [{"bucket": k, "a": pa.get(k, 0.0), "b": pb.get(k, 0.0), "change": _change(pa.get(k, 0.0), pb.get(k, 0.0))}
                for k in ledger.ordered(set(pa) | set(pb))]
        ta, tb = sum(pa.values()), sum(pb.values())
        rows.append({"bucket": "total", "a": ta, "b": tb, "change": _change(ta, tb)})
        return rows

    def moved(self) -> dict:
        """The buckets that fell and grew most (by GPU-hours per unit), among those that changed by at
        least MOVED (run-to-run noise is a few %)."""
        rows = [r for r in self.buckets() if r["bucket"] != "total" and r["change"] is not None
                and abs(r["change"]) >= MOVED]
        fell = min(rows, key=lambda r: r["b"] - r["a"], default=None)
        grew = max(rows, key=lambda r: r["b"] - r["a"], default=None)
        return {"fell": fell if fell and fell["b"] < fell["a"] else None,
                "grew": grew if grew and grew["b"] > grew["a"] else None}

    def alerts(self) -> dict:
        na, nb = {b.alertname for b in self.va}, {b.alertname for b in self.vb}
        return {"resolved": sorted(na - nb), "new": sorted(nb - na), "kept": sorted(na & nb)}

    def headline(self) -> str:
        t = self.buckets()[-1]
        s = f"{self.unit}: {t['a']:.3f} -> {t['b']:.3f} ({_pct(t['change'])})"
        m = self.moved()
        if m["fell"]:
            r = m["fell"]
            s += f"; {r['bucket']} fell {r['a']:.3f} -> {r['b']:.3f}"
        if m["grew"]:
            r = m["grew"]
            s += f"; {r['bucket']} grew {r['a']:.3f} -> {r['b']:.3f}"
        return s

    def as_json(self) -> dict:
        return {"a": facts_json(self.a, self.va), "b": facts_json(self.b, self.vb), "unit": self.unit,
                "phase_medians_seconds": self.phases(), "per_unit": self.buckets(), "moved": self.moved(),
                "alerts": self.alerts(), "headline": self.headline()}


def _change(x, y):
    if x is None or y is None or not x:
        return None
    return (y - x) / x


def _pct(c) -> str:
    return "–" if c is None else f"{c * 100:+.1f}%"


def name(f: RunFacts) -> str:
    return f"{f.project}/{f.experiment}"


def print_comparison(c: Comparison, con: Console) -> None:
    con.print(f"[bold]A[/] {escape(name(c.a))}  {escape(c.a.run)}\n[bold]B[/] {escape(name(c.b))}  {escape(c.b.run)}",
              highlight=False)
    t = Table(title="Median seconds per normal step, by ledger bucket", title_justify="left")
    for col in ("bucket", "A", "B", "change"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for r in c.phases():
        t.add_row(r["bucket"], _s(r["a"]), _s(r["b"]), _pct(r["change"]))
    con.print(t)
    t = Table(title=c.unit, title_justify="left")
    for col in ("bucket", "A", "B", "change"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for r in c.buckets():
        t.add_row(r["bucket"], f"{r['a']:.3f}", f"{r['b']:.3f}", _pct(r["change"]))
    con.print(t)
    al = c.alerts()
    con.print(f"alerts resolved: {', '.join(al['resolved']) or '-'}; new: {', '.join(al['new']) or '-'}; "
              f"still firing: {', '.join(al['kept']) or '-'}", highlight=False, markup=False)
    con.print(f"[bold]{escape(c.headline())}[/]", highlight=False)


def _s(v) -> str:
    return "–" if v is None else f"{v:,.1f}"


