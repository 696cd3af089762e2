"""Turn the exporter's registry, rendered at simulated scrape times, into OpenMetrics text with
timestamps that ``promtool tsdb create-blocks-from openmetrics`` turns into TSDB blocks.

The exporter's state only changes when a step is ingested, so the registry is rendered once per step
(:class:`FamilyRender`: the exporter's own collectors, formatted as prometheus_client's OpenMetrics
exposition writes them — byte for byte, tested — without its per-character escaping) and the samples are
repeated at every scrape timestamp until the next step: exactly what live scraping of an
unchanged exporter records. The writer groups samples per family and per series (OpenMetrics wants a
family's samples together and each series' points in time order) and adds what Prometheus attaches to
every scraped sample: the target labels ``job``/``instance`` and the synthetic ``up`` series.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

from prometheus_client.utils import floatToGoString

from ..core.exposition import OWNED, RunCollector, make_registry
from ..core.model import RunStore

DEFAULT_JOB = "omniwatch"  # the scrape job of the native stack (alerts use up{job="omniwatch"})
DEFAULT_INSTANCE = "backfill"  # distinct from any live target, so a backfill never collides with it
OWNED_NAMES = {(m[: -len("_total")] if m.endswith("_total") else m) for m in OWNED}


def label_value(v: str) -> str:
    """A label value escaped as the exposition formats write it."""
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass
class _Family:
    meta: list[str]  # "# HELP ..." / "# TYPE ..." lines as prometheus_client wrote them
    # series prefix (name{labels}) -> [start index, end index (exclusive), value text] runs
    series: dict[str, list[list]] = field(default_factory=dict)

    @property
    def is_gauge(self) -> bool:
        """A gauge (or an untyped family): what a live scrape stale-marks when its series goes."""
        return not any(m.startswith("# TYPE ") and m.split()[-1] in ("counter", "histogram", "summary", "info",
                                                                     "stateset") for m in self.meta)


class SampleGrid:
    """Samples of one target on a grid of scrape timestamps (milliseconds)."""

    def __init__(self, times_ms: list[int], job: str = DEFAULT_JOB, instance: str = DEFAULT_INSTANCE):
        self.times_ms = times_ms
        self.families: dict[str, _Family] = {}
        self._target = f'instance="{label_value(instance)}",job="{label_value(job)}"'
        self.job, self.instance = job, instance

    def _with_target(self, prefix: str) -> str:
        if prefix.endswith("}"):
            return prefix[:-1] + "," + self._target + "}"
        return prefix + "{" + self._target + "}"

    def add_render(self, text: str, lo: int, hi: int) -> None:
        """One registry render (OpenMetrics text without timestamps) holds for scrapes [lo, hi)."""
        if hi <= lo:
            return
        fam: _Family | None = None
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("#"):
                if line == "# EOF":
                    break
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE", "UNIT"):
                    fam = self.families.get(parts[2])
                    if fam is None:
                        fam = self.families[parts[2]] = _Family([])
                    if len(fam.meta) < 3 and line not in fam.meta and not fam.series:
                        fam.meta.append(line)
                continue
            if fam is None:
                continue
            prefix, _, value = line.rpartition(" ")
            runs = fam.series.setdefault(self._with_target(prefix), [])
            if runs and runs[-1][1] == lo and runs[-1][2] == value:
                runs[-1][1] = hi  # same value continues: extend the run
            else:
                runs.append([lo, hi, value])

    def add_families(self, fams, lo: int, hi: int) -> None:
        """``add_render`` for :meth:`FamilyRender.families` (no text to parse): the samples hold for scrapes
        [lo, hi)."""
        if hi <= lo:
            return
        for name, meta, samples in fams:
            fam = self.families.get(name)
            if fam is None:
                fam = self.families[name] = _Family([])
            if not fam.meta and not fam.series:
                fam.meta.extend(meta.rstrip("\n").split("\n"))
            for series, value in samples:
                runs = fam.series.setdefault(self._with_target(series), [])
                if runs and runs[-1][1] == lo and runs[-1][2] == value:
                    runs[-1][1] = hi
                else:
                    runs.append([lo, hi, value])

    def timestamps(self) -> list[str]:
        """The grid's times as OpenMetrics timestamps (seconds, millisecond precision)."""
        return [f"{t // 1000}.{t % 1000:03d}" for t in self.times_ms]

    def write_up(self, out: IO[str], ts: list[str], up_range: tuple[int, int] | None = None) -> int:
        """The synthetic ``up`` series (1 at every scrape of ``up_range``, default all); returns its samples."""
        lo_up, hi_up = up_range or (0, len(ts))
        if hi_up <= lo_up:
            return 0
        out.write("# HELP up 1 if the target was scraped (backfilled: the exporter was up).\n# TYPE up gauge\n")
        prefix = "up{" + self._target + "} " + floatToGoString(1.0) + " "
        out.write("".join(prefix + ts[k] + "\n" for k in range(lo_up, hi_up)))
        return hi_up - lo_up

    def write(self, out: IO[str], up_range: tuple[int, int] | None = None) -> int:
        """Write the whole grid as one OpenMetrics document; returns the number of samples."""
        ts = self.timestamps()
        n = self.write_up(out, ts, up_range)
        for fam in self.families.values():
            if not fam.series:
                continue
            out.write("\n".join(fam.meta) + "\n")
            gauge = fam.is_gauge
            for prefix, runs in fam.series.items():
                stale = set(stale_points(runs, len(ts))) if gauge else set()
                for lo, hi, value in sorted(runs):
                    head = f"{prefix} {value} "
                    out.write("".join(head + ts[k] + "\n" for k in range(lo, hi)))
                    n += hi - lo
                    if hi in stale:  # in time order: before the series' next run
                        out.write(f"{prefix} NaN {ts[hi]}\n")
                        n += 1
        out.write("# EOF\n")
        return n


def stale_points(runs: list, scrapes: int) -> list[int]:
    """The scrapes at which a gauge series that was present at the scrape before is absent: where live Prometheus
    writes a staleness marker, so a query no longer sees the last value. A backfill cannot write one; the backtest
    writes NaN there instead, which every comparison and ratio of the rules treats as no value (a series that ends
    at a trainer restart, say the old MFU reference, must not be judged for 5 more minutes against the new window)."""
    starts = {lo for lo, _, _ in runs}
    return sorted({hi for _, hi, _ in runs if hi < scrapes and hi not in starts})


class FamilyRender:
    """The store's registry (``exposition.make_registry``: every collector the exporter registers for
    runs) as OpenMetrics text — what ``generate_latest`` writes — restricted to the families in ``keep``
    (None: all). The exporter's own collectors build the families; only the formatting is done here,
    without the per-character escaping that makes ``generate_latest`` the slowest part of a long
    backfill."""

    def __init__(self, store: RunStore, keep: set[str] | None = None):
        reg = make_registry(store)
        # the registry's collectors, in registration order (prometheus_client keeps them in this dict)
        self.collectors = list(getattr(reg, "_collector_to_names", {})) or [reg]
        self.keep = keep
        # owned families to find before the run collector can stop (passthrough verl_* families come after)
        self._owned_wanted = None if keep is None or any(k.startswith("verl_") for k in keep) \
            else OWNED_NAMES & keep
        self._labels: dict[tuple, str] = {}   # (sample name, label items) -> series text, bounded
        self._metas: dict[tuple, str] = {}    # (family, help) -> HELP/TYPE lines

    def families(self) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """(family name, its HELP/TYPE/UNIT lines, [(series, value text)]) of the kept families."""
        out = []
        labels, metas = self._labels, self._metas
        for col in self.collectors:
            stop = self._owned_wanted if isinstance(col, RunCollector) else None
            seen = 0
            gen = col.collect()
            for fam in gen:
                name = fam.name
                if self.keep is not None and name not in self.keep:
                    continue
                meta = metas.get((name, fam.documentation))
                if meta is None:
                    meta = metas[(name, fam.documentation)] = (
                        f"# HELP {name} {label_value(fam.documentation)}\n# TYPE {name} {fam.type}\n"
                        + (f"# UNIT {name} {fam.unit}\n" if fam.unit else ""))
                samples = []
                for s in fam.samples:
                    key = (s.name, tuple(s.labels.items()))
                    series = labels.get(key)
                    if series is None:
                        if s.labels:
                            lab = ",".join(f'{k}="{label_value(v)}"' for k, v in sorted(s.labels.items()))
                            series = f"{s.name}{{{lab}}}"
                        else:
                            series = s.name
                        if len(labels) < 1 << 16:
                            labels[key] = series
                    samples.append((series, floatToGoString(s.value)))
                out.append((name, meta, samples))
                if stop is not None:
                    seen += 1
                    if seen >= len(stop):
                        gen.close()  # what the rules read is rendered; skip the passthrough families
                        break
        return out

    def text(self) -> str:
        parts = []
        for _name, meta, samples in self.families():
            parts.append(meta)
            parts.extend(f"{series} {value}\n" for series, value in samples)
        parts.append("# EOF\n")
        return "".join(parts)
