"""Turn the exporter's registry, rendered at simulated scrape times, into OpenMetrics text with
timestamps that ``promtool tsdb create-blocks-from openmetrics`` turns into TSDB blocks.

The exporter's state only changes when a step is ingested, so the registry is rendered once per step
(prometheus_client's own OpenMetrics exposition: same escaping and float formatting as live) and the
samples are repeated at every scrape timestamp until the next step: exactly what live scraping of an
unchanged exporter records. The writer groups samples per family and per series (OpenMetrics wants a
family's samples together and each series' points in time order) and adds what Prometheus attaches to
every scraped sample: the target labels ``job``/``instance`` and the synthetic ``up`` series.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.utils import floatToGoString

DEFAULT_JOB = "omniwatch"  # the scrape job of the native stack (alerts use up{job="omniwatch"})
DEFAULT_INSTANCE = "backfill"  # distinct from any live target, so a backfill never collides with it


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass
class _Family:
    meta: list[str]  # "# HELP ..." / "# TYPE ..." lines as prometheus_client wrote them
    # series prefix (name{labels}) -> [start index, end index (exclusive), value text] runs
    series: dict[str, list[list]] = field(default_factory=dict)


class SampleGrid:
    """Samples of one target on a grid of scrape timestamps (milliseconds)."""

    def __init__(self, times_ms: list[int], job: str = DEFAULT_JOB, instance: str = DEFAULT_INSTANCE):
        self.times_ms = times_ms
        self.families: dict[str, _Family] = {}
        self._target = f'instance="{_label_value(instance)}",job="{_label_value(job)}"'
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

    def add_render_of(self, registry, lo: int, hi: int) -> None:
        if hi > lo:
            self.add_render(generate_latest(registry).decode("utf-8"), lo, hi)

    def write(self, out: IO[str], up_range: tuple[int, int] | None = None) -> int:
        """Write the whole grid as one OpenMetrics document; returns the number of samples."""
        ts = [f"{t // 1000}.{t % 1000:03d}" for t in self.times_ms]
        n = 0
        lo_up, hi_up = up_range or (0, len(ts))
        if hi_up > lo_up:
            out.write("# HELP up 1 if the target was scraped (backfilled: the exporter was up).\n# TYPE up gauge\n")
            prefix = "up{" + self._target + "} " + floatToGoString(1.0) + " "
            out.write("".join(prefix + ts[k] + "\n" for k in range(lo_up, hi_up)))
            n += hi_up - lo_up
        for fam in self.families.values():
            if not fam.series:
                continue
            out.write("\n".join(fam.meta) + "\n")
            for prefix, runs in fam.series.items():
                for lo, hi, value in runs:
                    head = f"{prefix} {value} "
                    out.write("".join(head + ts[k] + "\n" for k in range(lo, hi)))
                    n += hi - lo
        out.write("# EOF\n")
        return n
