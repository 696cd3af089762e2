"""Each backtested alert's annotations, rendered by Prometheus' own rule engine and template functions:
what Prometheus would have sent to Alertmanager when the alert first fired.

Prometheus renders annotations only while it evaluates rules, and a server evaluates at the present;
``promtool test rules`` runs the same rule manager over series given to it, and when a test expects no
alert but gets some it prints the alerts it got, labels and rendered annotations (Go ``%q`` quoted). So
for every (alert, first firing time) this builds one promtool test: the series the backfill scraped in
a window before that time (long enough for the alert's ``for:`` and Prometheus' 5-minute lookback),
shifted so promtool's clock starts at 0 (series whose *values* are unix times, ``*_timestamp_seconds``,
shifted too, so ``time() - omniwatch_last_step_timestamp_seconds`` is unchanged), written in promtool's
expanding notation (``v`` repeated: ``vxN``; no sample: ``_xN``), and one ``alert_rule_test`` at the
firing time with no expected alerts. The rule files are the backtest's, evaluated in full (recording
rules included), on the backtest's evaluation grid.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from .openmetrics import SampleGrid
from .tsdb import ToolError, promtool

LOOKBACK = 300.0  # Prometheus' default query lookback: a series last scraped this long ago is still seen
TIMESTAMP_SUFFIX = "_timestamp_seconds"
TIMEOUT = 600.0
PROCESSES = 4             # promtool runs at once (their test groups are independent)
MIN_TESTS_PER_PROCESS = 8  # fewer: one process (its start-up costs more than the split saves)


@dataclass
class Request:
    """Render the annotations of ``alertname`` as it fired at ``t`` (unix seconds, on the eval grid)."""
    alertname: str
    t: float
    hold: float


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _values(runs: list[list], lo: int, hi: int, shift: float | None) -> str | None:
    """promtool's expanding notation for grid indices [lo, hi] of one series (None: no sample there)."""
    cells: list[str | None] = [None] * (hi - lo + 1)
    for a, b, value in runs:
        for k in range(max(a, lo), min(b, hi + 1)):
            cells[k - lo] = value if shift is None else repr(float(value) - shift)
    if all(c is None for c in cells):
        return None
    out, i = [], 0
    while i < len(cells):
        j = i
        while j + 1 < len(cells) and cells[j + 1] == cells[i]:
            j += 1
        n = j - i + 1
        if cells[i] is None:
            out.append("_" if n == 1 else f"_x{n}")
        else:
            v = _promtool_number(cells[i])
            out.append(v if n == 1 else f"{v}x{n - 1}")
        i = j + 1
    return " ".join(out)


def _promtool_number(text: str) -> str:
    """An OpenMetrics sample value as promtool's series notation reads it (``+Inf`` -> ``Inf``)."""
    return {"+Inf": "Inf", "-Inf": "-Inf", "NaN": "NaN"}.get(text, text)


def build_tests(grid: SampleGrid, requests: list[Request], scrape_interval: float, eval_interval: float,
                rule_files: list[str]) -> tuple[dict, list[list[int]]]:
    """The promtool test document and, per test group (named ``a<k>``), the indices of the requests it
    answers: requests at the same time with the same ``for:`` share one group (the same window, so one
    evaluation of the rules answers them all), one ``alert_rule_test`` per alert name."""
    scrape_ms, eval_ms = round(scrape_interval * 1000), round(eval_interval * 1000)
    step_ms = _lcm(scrape_ms, eval_ms)
    times = grid.times_ms
    tests = []
    by_window: dict[tuple[int, float], list[int]] = {}
    for i, req in enumerate(requests):
        by_window.setdefault((round(req.t * 1000), req.hold), []).append(i)
    groups = list(by_window.values())
    for k, idxs in enumerate(groups):
        req = requests[idxs[0]]
        t_ms = round(req.t * 1000)
        window_ms = round((req.hold + LOOKBACK) * 1000) + 2 * max(scrape_ms, eval_ms)
        t0 = ((t_ms - window_ms) // step_ms) * step_ms
        # grid indices covering [t0, t]: the grid is every scrape_ms from times[0]
        lo = (t0 - times[0]) // scrape_ms
        hi = (t_ms - times[0]) // scrape_ms
        series = []
        shift_s = t0 / 1000
        for name_prefix, up_values in _all_series(grid, lo, hi, shift_s):
            series.append({"series": name_prefix, "values": up_values})
        tests.append({
            "name": f"a{k}", "interval": f"{scrape_ms}ms",
            # promtool's input starts at its time 0: pad the series that start before the grid does
            "input_series": series,
            "alert_rule_test": [{"eval_time": f"{t_ms - t0}ms", "alertname": name}
                                for name in dict.fromkeys(requests[i].alertname for i in idxs)],
        })
    return ({"rule_files": [str(Path(f).resolve()) for f in rule_files], "evaluation_interval": f"{eval_ms}ms",
             "tests": tests}, groups)


def answers(got: dict, name: str, idxs: list[int], requests: list[Request]) -> dict[int, list]:
    """Request index -> the (labels, annotations) of its alert that test group ``name`` got."""
    alerts = got.get(name, [])
    out = {}
    for i in idxs:
        mine = [(labels, ann) for labels, ann in alerts if labels.get("alertname") == requests[i].alertname]
        if mine:
            out[i] = mine
    return out


def _all_series(grid: SampleGrid, lo: int, hi: int, shift: float):
    """(series, values) for every series with a sample in grid indices [lo, hi]; ``lo`` may be before
    the grid (negative): those slots hold no sample."""
    pad = max(0, -lo)
    lo_c = max(lo, 0)
    hi_c = min(hi, len(grid.times_ms) - 1)
    if hi_c < lo_c:
        return
    up = [[0, len(grid.times_ms), "1.0"]]
    fams = [("up", {"up{" + grid._target + "}": up})] + [(name, f.series) for name, f in grid.families.items()]
    for name, series in fams:
        for prefix, runs in series.items():
            metric = prefix.split("{", 1)[0]
            vals = _values(runs, lo_c, hi_c, shift if metric.endswith(TIMESTAMP_SUFFIX) else None)
            if vals is None:
                continue
            if pad:
                vals = ("_" if pad == 1 else f"_x{pad}") + " " + vals
            yield prefix, vals


# --- promtool's "got" output -----------------------------------------------------------------------------
_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"'}


def go_unquote(text: str, i: int) -> tuple[str, int]:
    """The Go double-quoted string literal starting at ``text[i]`` (a ``"``); returns (value, index
    after the closing quote). Handles Go's escapes, ``\\xNN`` bytes included (decoded as UTF-8)."""
    if text[i] != '"':
        raise ValueError(f"expected a quoted string at {i}: {text[i:i + 20]!r}")
    out = bytearray()
    i += 1
    while True:
        if i >= len(text):
            raise ValueError("unterminated quoted string")
        c = text[i]
        if c == '"':
            return out.decode("utf-8", "replace"), i + 1
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        e = text[i + 1]
        if e in _ESC:
            out += _ESC[e].encode()
            i += 2
        elif e == "x":
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        elif e in "uU":
            n = 4 if e == "u" else 8
            out += chr(int(text[i + 2:i + 2 + n], 16)).encode("utf-8")
            i += 2 + n
        elif e in "01234567":
            out.append(int(text[i + 1:i + 4], 8))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{e}")


_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def parse_map(text: str, i: int) -> tuple[dict[str, str], int]:
    """A ``{name="value", ...}`` map as promtool prints labels and annotations."""
    if text[i] != "{":
        raise ValueError(f"expected '{{' at {i}")
    i += 1
    out: dict[str, str] = {}
    while text[i] != "}":
        m = _NAME.match(text, i)
        if not m or text[m.end()] != "=":
            raise ValueError(f"expected name= at {i}: {text[i:i + 30]!r}")
        value, i = go_unquote(text, m.end() + 1)
        out[m.group()] = value
        if text.startswith(", ", i):
            i += 2
    return out, i + 1


def parse_got(output: str) -> dict[str, list[tuple[dict[str, str], dict[str, str]]]]:
    """Test name -> [(labels, annotations)] of the alerts promtool got where it expected none."""
    out: dict[str, list] = {}
    heads = list(re.finditer(r"^\s*name: (a\d+),\s*$", output, re.M))
    for k, h in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(output)
        part = output[h.end():end]
        got = out.setdefault(h.group(1), [])
        pos = 0
        while (j := part.find("Labels:{", pos)) >= 0:
            labels, pos = parse_map(part, j + len("Labels:"))
            a = part.find("Annotations:{", pos)
            if a < 0:
                raise ValueError("promtool printed labels without annotations")
            ann, pos = parse_map(part, a + len("Annotations:"))
            got.append((labels, ann))
    return out


def render(grid: SampleGrid, requests: list[Request], scrape_interval: float, eval_interval: float,
           rule_files: list[str]) -> dict[int, list[tuple[dict[str, str], dict[str, str]]]]:
    """Request index -> the alerts of that name firing at its time, (labels, annotations) each."""
    if not requests:
        return {}
    doc, groups = build_tests(grid, requests, scrape_interval, eval_interval, rule_files)
    got = run_tests(doc)
    out: dict[int, list] = {}
    for k, idxs in enumerate(groups):
        out.update(answers(got, f"a{k}", idxs, requests))
    return out


def run_tests(doc: dict, processes: int | None = None) -> dict[str, list[tuple[dict[str, str], dict[str, str]]]]:
    """Run a promtool test document built to fail (it expects no alerts) and read what promtool rendered:
    test name -> (labels, annotations) of the alerts firing there; {} when nothing fired. The test groups
    are independent: they are split over ``processes`` promtool runs at once (default: one per core, at
    most PROCESSES)."""
    tests = doc["tests"]
    n = max(1, min(processes or min(os.cpu_count() or 1, PROCESSES), len(tests) // MIN_TESTS_PER_PROCESS))
    if n == 1:
        return _run_tests(doc)
    chunks = [dict(doc, tests=tests[k::n]) for k in range(n)]
    out: dict[str, list] = {}
    with ThreadPoolExecutor(n) as pool:
        for got in pool.map(_run_tests, chunks):
            out.update(got)
    return out


def _run_tests(doc: dict) -> dict[str, list[tuple[dict[str, str], dict[str, str]]]]:
    with tempfile.TemporaryDirectory(prefix="omniwatch-annotations-") as tmp:
        path = Path(tmp) / "annotations.test.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10**9), encoding="utf-8")
        try:
            p = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                               timeout=TIMEOUT, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise ToolError(f"promtool test rules (annotations) took longer than {TIMEOUT:.0f} s") from None
    text = p.stdout + "\n" + p.stderr
    if p.returncode == 0:
        return {}
    if "got:[" not in text:
        tail = " | ".join(text.strip().splitlines()[-5:])
        raise ToolError(f"promtool test rules (annotations) failed (exit {p.returncode}): {tail}")
    try:
        got = parse_got(text)
    except (ValueError, IndexError) as e:
        raise ToolError(f"cannot read promtool's rendered alerts: {e}") from None
    return got
