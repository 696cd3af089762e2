#!/usr/bin/env python3
"""The benchmark figures quoted by docs/benchmarks.md and docs/scaling.md, rendered from
``benchmarks/results.json`` alone: every block between

    <!-- BEGIN GENERATED: NAME (benchmarks/run.py --docs) -->
    <!-- END GENERATED: NAME -->

is replaced by ``BLOCKS[NAME]`` applied to the results. A block says when and where its section was
measured (the section's ``meta``) and sets each figure against the baseline or target measured in the
same run. Rounding is fixed, so the same results.json always gives the same bytes: ``--check`` (run by
``make check``) fails when a doc differs from what the committed results.json renders. Nothing here
runs a benchmark; ``benchmarks/run.py`` calls this after writing results.json.

    .venv/bin/python benchmarks/run.py --docs            # rewrite the blocks
    .venv/bin/python benchmarks/run.py --docs --check    # drift check
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results.json"
BEGIN = "<!-- BEGIN GENERATED: {name} (benchmarks/run.py --docs) -->"
END = "<!-- END GENERATED: {name} -->"
BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: (?P<name>[\w-]+) \(benchmarks/run\.py --docs\) -->\n"
                      r"(?P<body>.*?)<!-- END GENERATED: (?P=name) -->", re.S)
SCRAPE_TARGET_SERIES = 5  # Prometheus adds up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling and scrape_series_added to every target
BYTES_PER_SAMPLE = 1.3  # on-disk planning figure for compressed TSDB samples (not measured here)


# --- formatting: fixed rounding so a render is byte-stable -----------------------------------------------
def _ok(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x, nd: int = 1, unit: str = "") -> str:
    return f"{x:,.{nd}f}{unit}" if _ok(x) else "n/a"


def ratio(a, b, nd: int = 2) -> str:
    """``a / b`` as ``0.89x``."""
    return f"{a / b:.{nd}f}x" if _ok(a) and _ok(b) and b else "n/a"


def ms_or_s(ms) -> str:
    return "n/a" if not _ok(ms) else f"{ms / 1000:,.1f} s" if ms >= 1000 else f"{ms:,.1f} ms"


def mib(b) -> str:
    return num(b / 2**20, 0, " MiB") if _ok(b) else "n/a"


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


COMMANDS = {"gpu_idle": "benchmarks/gpu_idle_validation.py", "gpu_fleet": "benchmarks/gpu_fleet_validation.py"}


def measured(name: str, sec: dict) -> str:
    """One line: when, on what, under which load, by which command."""
    m = sec.get("meta") or {}
    if not m:
        return f"*When and where this was measured was not recorded; `benchmarks/run.py --only {name}` records it.*"
    load = m.get("load_avg_at_start") or []
    cmd = " ".join([COMMANDS.get(name, "benchmarks/run.py"), *m.get("argv", [])])
    return (f"*Measured {m.get('when', '?')} on {m.get('cpus', '?')} CPUs ({m.get('machine', '?')}), load average "
            f"{' / '.join(num(x, 2) for x in load) or '?'} at its start, Python {m.get('python', '?')}; "
            f"`{cmd}`, {num(m.get('section_wall_s'), 0, ' s')}.*")


def _missing(name: str, sec: dict | None) -> list[str] | None:
    """The block's text when the section has no figures (not run, failed, or not applicable here)."""
    cmd = f"`{COMMANDS.get(name, 'benchmarks/run.py --only ' + name)}`"
    if sec is None:
        return [f"*Not measured yet: {cmd} records it in benchmarks/results.json.*"]
    if "error" in sec:
        return [f"*The last run of {cmd} failed ({sec['error'][:120]}); no figures.*", "", measured(name, sec)]
    if sec.get("status") not in (None, "ok"):
        return [f"*Not measured ({sec.get('status')}: {sec.get('why', '')[:120]}).*", "", measured(name, sec)]
    return None


# --- one renderer per section ------------------------------------------------------------------------------
def ingest(r: dict) -> list[str]:
    t = r["target_steps_per_s"]
    head = [f"path ({r['steps']:,} verl-shaped lines, {r['runs']} runs, mean {num(r['keys_per_line'])} keys)",
            "steps/s", "values/s", f"/ target ({t:,} steps/s)", "/ parse alone"]
    rows = [["`parse_jsonl_line` alone", num(r["parse_steps_per_s"], 0), "—", ratio(r["parse_steps_per_s"], t), "1.00x"],
            ["`parse_jsonl_line` + `RunStore.ingest` (analytics included)", num(r["ingest_steps_per_s"], 0),
             num(r["ingest_values_per_s"], 0), ratio(r["ingest_steps_per_s"], t),
             ratio(r["ingest_steps_per_s"], r["parse_steps_per_s"])],
            [f"`FileSource.poll_once` over {r['runs']} real files", num(r["file_source_steps_per_s"], 0),
             num(r.get("file_source_values_per_s"), 0), ratio(r["file_source_steps_per_s"], t),
             ratio(r["file_source_steps_per_s"], r["parse_steps_per_s"])]]
    out = table(head, rows)
    if r.get("clock") == "process_time":
        out += ["", f"*Rates from CPU seconds of the benchmark process (`time.process_time`), the best of "
                    f"{r.get('rounds', 1)} interleaved rounds per path: the machine is shared, and the ratio to parse "
                    f"alone in the same run is the figure that compares across machines.*"]
    if r.get("profile_top"):
        n = r.get("profile_lines")
        head = [f"self time, cProfile of parse + ingest{f' ({n:,} lines)' if n else ''}", "calls", "self s",
                *(["µs per line"] if n else []), "share"]
        rows = [[f"`{p['function']}`", f"{p['calls']:,}", num(p["tottime_s"], 3),
                 *([num(p["tottime_s"] / n * 1e6, 1)] if n else []), f"{p['share_of_total']:.0%}"]
                for p in r["profile_top"][:6]]
        out += ["", *table(head, rows)]
    return out


def render(r: dict) -> list[str]:
    rows = [["omniwatch registry (`generate_latest`)", num(r["omniwatch_p50_ms"], 1, " ms"), num(r["omniwatch_p99_ms"], 1, " ms")],
            ["plain registry, same series", num(r["plain_p50_ms"], 1, " ms"), num(r["plain_p99_ms"], 1, " ms")],
            ["ratio omniwatch / plain", f"**{ratio(r['omniwatch_p50_ms'], r['plain_p50_ms'])}** (target <= "
             f"{r['target_ratio']:.1f}x: {met(r['omniwatch_p50_ms'] / r['plain_p50_ms'] <= r['target_ratio'])})",
             ratio(r["omniwatch_p99_ms"], r["plain_p99_ms"])],
            ["omniwatch collect only (model -> families, no text)", num(r["collect_only_p50_ms"], 1, " ms"), ""]]
    if "http_p50_ms" in r:
        what = f", {r['http_series']:,} series: no GPU sampler" if "http_series" in r else ""
        rows.append([f"GET /metrics over HTTP (the exporter app, uvicorn, loopback{what})", num(r["http_p50_ms"], 1, " ms"),
                     num(r["http_p99_ms"], 1, " ms")])
    rows.append([f"p99 target < {num(r['target_p99_ms'], 0, ' ms')}", "",
                 f"omniwatch {met(r['omniwatch_p99_ms'] < r['target_p99_ms'])}, plain {met(r['plain_p99_ms'] < r['target_p99_ms'])}"])
    fmt = r["omniwatch_p50_ms"] - r["collect_only_p50_ms"]
    return [f"{r['series_omniwatch']:,} series ({num(r['bytes'] / 1000, 0, ' kB')}) in omniwatch's text, "
            f"{r['series_plain']:,} in the plain registry's; {r['iterations']} interleaved renders of each.", "",
            *table(["", "p50", "p99"], rows), "",
            f"Text formatting (render minus collect, p50) is {num(100 * fmt / r['omniwatch_p50_ms'], 0, ' %')} of the "
            f"render: {num(fmt / r['series_omniwatch'] * 1000, 1, ' µs')} per series."]


def memory(r: dict) -> list[str]:
    s, k = r["steps"], r["keys"]
    return table(["scenario", "RSS growth", "tracemalloc (model)", "held"], [
        [f"{s['steps']:,} steps across {s['runs']} runs", f"+{num(s['rss_growth_mib'], 1, ' MiB')} ({num(s['rss_mib'], 1, ' MiB')} total)",
         num(s["tracemalloc_current_mib"], 1, " MiB"), f"{s['keys_held']:,} passthrough keys"],
        [f"{k['keys_offered']:,} distinct keys offered to one run", f"+{num(k['rss_growth_mib'], 1, ' MiB')}",
         num(k["tracemalloc_current_mib"], 2, " MiB"),
         f"{k['keys_held']:,} keys (cap {k['cap']:,}: {'held' if k['keys_held'] <= k['cap'] else '**exceeded**'}); "
         f"{k['cardinality_cap_errors']:,} counted as `cardinality_cap`"]])


def backtest(r: dict) -> list[str]:
    alerts = r.get("alerts")
    return table(["run", "wall", "target", "alerts found"], [
        [f"{r['steps']:,} steps (reward 5x slower from step {r.get('fault_from_step', r['steps'] // 2):,})",
         num(r["wall_s"], 1, " s"), f"< {r.get('target_s', 60)} s: {met(r['wall_s'] < r.get('target_s', 60))} "
         f"({ratio(r['wall_s'], r.get('target_s', 60))})",
         ", ".join(alerts) if isinstance(alerts, list) else str(alerts)]])


def report(r: dict) -> list[str]:
    target = r.get("target_s", 120)
    out = table(["runs x steps", "wall", "CPU (process + children)", "load avg before -> after", "target"], [
        [f"{r['runs']} x {r['steps']}", num(r["wall_s"], 1, " s"), num(r["cpu_s"], 1, " s"),
         f"{num(r['load_avg_before'])} -> {num(r.get('load_avg_after'))}",
         f"< {target} s: {met(r['wall_s'] < target)} ({ratio(r['wall_s'], target)})"]])
    if r.get("phases"):
        out += ["", *table(["phase", "wall", "CPU"], [[p["phase"], num(p["s"], 1, " s"), num(p["cpu_s"], 1, " s")]
                                                      for p in r["phases"]])]
    out += ["", f"Pages: {num(r.get('pages_mb'), 1, ' MB')} in all, the largest {num(r.get('largest_page_mb'), 2, ' MB')}; "
            f"alerts across the runs: {', '.join(r.get('alerts') or []) or 'none'}."]
    return out


def push(r: dict) -> list[str]:
    req, ok = r["requests"], r["ok"]
    per_core = 1000 / r["server_cpu_ms_per_request"] if r.get("server_cpu_ms_per_request") else float("nan")
    errors = ", ".join(f"{k} {v}" for k, v in sorted((r.get("errors") or {}).items())) or "none"
    return table(["", ""], [
        ["schedule", f"{r['target_rate_per_s']:,.0f} POST/s for {r['duration_s']:,.0f} s ({req:,} requests), "
                     f"{r['clients']} client processes x {r['concurrency_per_client']} in flight"],
        ["held rate", f"**{num(r['held_rate_per_s'], 0, ' req/s')}** ({ratio(r['held_rate_per_s'], r['target_rate_per_s'])} "
                      f"of the target rate)"],
        ["answers", f"{ok:,} ok of {req:,}; errors: {errors}; {r['steps_applied']:,} steps applied; "
                    f"{r['sent_late']:,} requests sent late"],
        ["latency from schedule p50 / p99", f"{ms_or_s(r['p50_ms'])} / {ms_or_s(r['p99_ms'])}"],
        ["service latency (send -> answer) p50 / p99", f"{ms_or_s(r['service_p50_ms'])} / {ms_or_s(r['service_p99_ms'])}"],
        ["server CPU per request", f"{num(r['server_cpu_ms_per_request'], 2, ' ms')} (-> {num(per_core, 0)} req/s per dedicated core)"],
        ["client CPU", f"{num(r['client_cpu_s'], 1, ' s')} ({num(r['client_cpu_s'] / req * 1000, 2, ' ms')}/request)"],
        ["server RSS after", num(r["server_rss_mib"], 0, " MiB")]])


def alert(r: dict) -> list[str]:
    rows = [[f"`{name}`", num(v["median_s"], 1, " s"), num(v["max_s"], 1, " s"), str(v["missed"])]
            for name, v in sorted(r.items()) if isinstance(v, dict) and "median_s" in v]
    extra = r.get("extra_alerts")
    tail = [] if extra is None else ["", f"Other notifications at the webhook for these runs (false or uninhibited "
                                         f"alerts): {', '.join(f'`{e}`' for e in extra) if extra else 'none'}."]
    target = f" Target: at most {r['target_s']:g} s." if "target_s" in r else ""
    return [f"{r['trials']} trial(s), profile {r.get('profile', 'default')}.{target}", "",
            *table(["alert", "median", "max", "missed"], rows), *tail]


def files(r: dict) -> list[str]:
    a, b = r["pooled"], r["one_fd_per_file"]
    return table([f"{r['files']:,} files, poll every {r['poll_interval_s']} s", f"pooled (default, nofile={a['nofile']})",
                  f"one fd per file (nofile={b['nofile']})", "pooled / one fd per file"], [
        ["descriptors held by the process, idle", f"**{a['fds_idle']:,}**", f"{b['fds_idle']:,}", ratio(a["fds_idle"], b["fds_idle"], 3)],
        ["descriptors, 1 % growing", f"{a['fds_busy']:,}", f"{b['fds_busy']:,}", ratio(a["fds_busy"], b["fds_busy"], 3)],
        [f"all {r['files']:,} runs ingested after start", num(a["ingest_s"], 1, " s"), num(b["ingest_s"], 1, " s"),
         ratio(a["ingest_s"], b["ingest_s"])],
        ["CPU per poll, idle", f"{num(a['cpu_ms_per_poll_idle'], 1, ' ms')} ({num(100 * a['cpu_share_idle'], 1)} % of a core)",
         f"{num(b['cpu_ms_per_poll_idle'], 1, ' ms')} ({num(100 * b['cpu_share_idle'], 1)} %)",
         ratio(a["cpu_ms_per_poll_idle"], b["cpu_ms_per_poll_idle"])],
        [f"CPU per poll, {a['growing_files']} files growing", num(a["cpu_ms_per_poll_1pct_growing"], 1, " ms"),
         num(b["cpu_ms_per_poll_1pct_growing"], 1, " ms"),
         ratio(a["cpu_ms_per_poll_1pct_growing"], b["cpu_ms_per_poll_1pct_growing"])],
        ["SIGTERM to exit", num(a["sigterm_s"], 2, " s"), num(b["sigterm_s"], 2, " s"), ""]])


def tail(r: dict) -> list[str]:
    a, b = r["now"], r["before"]
    return table([f"{a['files']:,} idle one-line files, one `FileSource`", f"before issue 14 ({r['before_rev']})", "now",
                  "now / before"], [
        ["first pass (everything ingested), CPU", num(b["first_pass_cpu_ms"], 0, " ms"), num(a["first_pass_cpu_ms"], 0, " ms"),
         ratio(a["first_pass_cpu_ms"], b["first_pass_cpu_ms"])],
        ["idle poll, CPU", num(b["idle_poll_cpu_ms"], 1, " ms"), f"**{num(a['idle_poll_cpu_ms'], 1, ' ms')}**",
         f"**{ratio(a['idle_poll_cpu_ms'], b['idle_poll_cpu_ms'])}**"],
        ["descriptors held", f"{b['descriptors']:,}", f"{a['descriptors']:,}", ratio(a["descriptors"], b["descriptors"], 3)]])


def idle(r: dict) -> list[str]:
    a, b = r["now"], r["before"].get("large") or {}
    small, large = a["small"], a["large"]
    before = f"before issue 25 ({r.get('before_rev', '?')}), {r['large_files']:,} files"
    return table([f"one `FileSource`, idle one-line files, 0.5 s poll", f"{r['small_files']:,} files",
                  f"{r['large_files']:,} files", f"{r['large_files']:,} / {r['small_files']:,}", before], [
        ["CPU, idle 30 s (looked at every 4th poll)", f"{num(100 * small['cpu_share_idle'], 2)} % of a core",
         f"{num(100 * large['cpu_share_idle'], 1)} %", ratio(large["cpu_share_idle"], small["cpu_share_idle"], 0),
         f"{num(100 * b.get('cpu_share_idle', float('nan')), 1)} %"],
        ["CPU, idle 2.5 min (every 16th poll)", f"{num(100 * small['cpu_share_long_idle'], 2)} % of a core",
         f"**{num(100 * large['cpu_share_long_idle'], 1)} %**",
         f"**{ratio(large['cpu_share_long_idle'], small['cpu_share_long_idle'], 0)}**",
         f"{num(100 * b.get('cpu_share_long_idle', float('nan')), 1)} % (no second tier)"],
        ["first pass (everything read), CPU", num(small["first_pass_cpu_s"], 2, " s"), num(large["first_pass_cpu_s"], 1, " s"),
         ratio(large["first_pass_cpu_s"], small["first_pass_cpu_s"], 0), num(b.get("first_pass_cpu_s"), 1, " s")]])


def raytasks(r: dict) -> list[str]:
    return table(["workers x 10 phases per step", "state-API calls / poll", "bytes / poll", "exporter CPU / poll, median",
                  "max", "wall / poll, median"],
                 [[f"{x['workers']:,}", str(x["calls_per_poll"]), num(x["kbytes_per_poll"], 0, " KiB"),
                   f"**{num(x['cpu_ms_median'], 1, ' ms')}**", num(x["cpu_ms_max"], 1, " ms"), num(x["wall_ms_median"], 0, " ms")]
                  for x in r["workers"]])


def soak(r: dict) -> list[str]:
    cpu_ok = r["cpu_share_after_fill"] <= r["target_cpu_share"]
    return table([f"{r['runs']} runs stepping every {r['step_s']:g} s + Ray state API of {r['workers']} workers, "
                  f"{num(r['duration_s'], 0, ' s')}", "measured", "target (issue 35)"], [
        [f"exporter CPU after {num(r['fill_s'], 0, ' s')}",
         f"**{num(100 * r['cpu_share_after_fill'], 1)} %** of a core ({num(100 * r['cpu_share_total'], 1)} % overall)",
         f"<= {num(100 * r['target_cpu_share'], 0)} % ({met(cpu_ok)})"],
        ["CPU by minute", " / ".join(num(x, 1) for x in r["cpu_percent_per_minute"]) + " %", ""],
        [f"RSS after {num(r['fill_s'], 0, ' s')}", f"{num(r['rss_mib_at_fill'], 1, ' MiB')} -> {num(r['rss_mib_end'], 1, ' MiB')} "
         f"(**{num(r['rss_growth_after_fill_mib'], 1, ' MiB')}**, slope {num(r['rss_slope_after_fill_mib_per_min'], 2, ' MiB/min')}; "
         f"max {num(r['rss_mib_max'], 1, ' MiB')})", "flat"],
        ["RSS at the minute marks sampled", " / ".join(num(x, 0) for x in r["rss_mib_per_minute"]) + " MiB", ""],
        [f"scrapes (every {num(r['scrape_interval_s'], 0, ' s')}, 10 s timeout)",
         f"**{r['scrapes_failed']} failed** of {r['scrapes']}; p50 {ms_or_s(r['scrape_p50_ms'])}, p99 "
         f"{ms_or_s(r['scrape_p99_ms'])}, max {ms_or_s(r['scrape_max_ms'])}; {num(r['metrics_kib'], 0, ' KiB')}",
         f"none failed ({met(r['scrapes_failed'] == 0)})"],
        ["steps written / runs exported / Ray polls / state-API calls",
         f"{r['steps_written']:,} / {num(r['runs_exported'], 0)} / {num(r['ray_polls'], 0)} / {num(r['state_api_calls'], 0)}", ""]])


def raytasks_overhead(r: dict) -> list[str]:
    rows = [[f"{x['interval_s']:g} s", str(x["polls"]), num(1000 * x["step_s_off_median"], 0, " ms"),
             num(1000 * x["step_s_on_median"], 0, " ms"), f"**{num(x['ratio_median_of_pairs'], 3)}**",
             num(x["ratio_total"], 3), f"{min(x['pair_ratios']):.2f}-{max(x['pair_ratios']):.2f}",
             num(1000 * x["poller_cpu_s"] / max(1, x["polls"]), 1, " ms"), num(1000 * x["head_cpu_s_per_poll"], 0, " ms")]
            for x in r["intervals"]]
    return [f"{r['workers']} ranks of a colocated `WorkerDict`, {len(r['phases'])} ONE_TO_ALL dispatches per step; "
            f"{r['pairs']} pairs of {r['steps_per_block']}-step blocks, poller off / on in ABBA order.", "",
            *table(["poll interval", "polls", "step, poller off (median)", "step, poller on (median)",
                    "on / off, median of pairs", "on / off, total", "pair ratios", "poller CPU / poll",
                    "Ray head CPU / poll (on - off)"], rows)]


def connections(r: dict) -> list[str]:
    closed = r.get("closed_by_guard") or {}
    why = ", ".join(f"{k} {v:,.0f}" for k, v in closed.items() if _ok(v) and v)
    return [f"{r['scrapes']} scrapes with no other client, {r['loaded_scrapes']} while "
            f"{r['idle_connections_opened']:,} idle connections were held (opening them took {num(r['opening_s'], 1, ' s')}).", "",
            *table(["", "no other client", f"{r['idle_connections_opened']:,} idle connections", "loaded / no load"], [
                ["/metrics p50", num(r["baseline_p50_ms"], 1, " ms"), num(r["loaded_p50_ms"], 1, " ms"),
                 f"**{ratio(r['loaded_p50_ms'], r['baseline_p50_ms'])}**"],
                ["/metrics p99", num(r["baseline_p99_ms"], 1, " ms"), num(r["loaded_p99_ms"], 1, " ms"),
                 ratio(r["loaded_p99_ms"], r["baseline_p99_ms"])],
                ["descriptors held by the process", f"{r['fds_before']:,}", f"{r['fds_loaded']:,}", ""],
                ["connections held", "–", f"{r['connections_held']:,.0f}; closed by the guard: {why or 'none'}", ""],
                ["server CPU while loaded", "", f"{num(100 * r['server_cpu_share_while_loaded'], 1)} % of a core", ""],
                ["SIGTERM to exit", "", num(r["sigterm_s"], 2, " s"), ""]])]


def gpu_idle(r: dict) -> list[str]:
    s, dev = r["sampler"], r.get("device") or {}
    pct = lambda v: "–" if v["error_pct"] is None else f"{v['error_pct']:+.2f} %"  # noqa: E731
    out = [f"{r.get('nvml_name')} ({num((r.get('nvml_memory_total_bytes') or 0) / 1e9, 1, ' GB')}; read as silicon "
           f"{r.get('silicon')}, peak {num(r.get('silicon_peak_tflops'), 0)} TFLOP/s), driver {r.get('driver')}, "
           f"torch {dev.get('torch')}; {r['steps']} steps, busy threshold {num(r.get('threshold'), 0)} %. NVML returned "
           f"one utilization sample every {num(s['median_sample_spacing_s'], 3, ' s')} (median spacing; "
           f"{s['samples']:,} samples in {num(s['wall_s'], 1, ' s')}).", "",
           "**Per-phase idle, pushed spans** (target: within 5 % or 0.3 s of the truth):", "",
           *table(["phase", "truth idle (s)", "measured (s)", "error (s)", "error", "target", "timing layout (s)"],
                  [[ph, num(v["truth_idle_s"], 3), num(v["measured_idle_s"], 3), f"{v['error_s']:+.3f}", pct(v),
                    met(v["within_target"]), num(v["timing_layout_idle_s"], 3)] for ph, v in r["per_phase"].items()]),
           "", "**Per gap kind** (each sleep as its own span):", "",
           *table(["gap", "gaps", "truth (s)", "measured (s)", "error", "target"],
                  [[k, str(sum(1 for g in r.get("gaps") or [] if g["kind"] == k)), num(v["truth_idle_s"], 3),
                    num(v["measured_idle_s"], 3), pct(v), met(v["within_target"])] for k, v in r["per_gap_kind"].items()]),
           ""]
    gaps = r.get("gaps") or []
    out.append(f"* Shortest gap detected (at least half its length measured idle): **{num(r['shortest_gap_detected_s'], 1, ' s')}**; "
               f"{sum(g['detected'] for g in gaps)} of {len(gaps)} gaps "
               f"({num(min((g['seconds'] for g in gaps), default=None), 1)}–{num(max((g['seconds'] for g in gaps), default=None), 1)} s) "
               f"detected; every gap >= 0.5 s detected: {'yes' if r['all_gaps_ge_0.5_detected'] else '**no**'}; "
               f"whole target: {met(r['pass'])}.")
    out.append(f"* Sampler CPU cost: {num(s['thread_cpu_s'], 3, ' s')} of thread CPU time over {num(s['wall_s'], 1, ' s')} "
               f"wall = **{num(100 * s['cpu_share'], 2, ' %')}** of one core ({s['polls']} polls).")
    if r.get("mfu"):
        peak = r.get("silicon_peak_tflops")
        out.append(f"* MFU the program achieved (FLOPs it counted), against the {r.get('silicon')} bf16 dense peak of "
                   f"{num(peak, 0)} TFLOP/s: " + ", ".join(
                       f"{ph} {num(v['achieved_tflops'], 1)} TFLOP/s ({num(v['mfu_vs_989'], 3)})"
                       for ph, v in sorted(r["mfu"].items())) + ".")
    return out


def gpu_fleet(r: dict) -> list[str]:
    pct = lambda v: "–" if v is None else f"{v:+.2f} %"  # noqa: E731
    live, rep, old = r["live"], r["replay"], r["replay_poll_time_view"]
    names = {"productive": "productive (busy in a compute call)", "overhead": "overhead (every second of an overhead "
             "call; busy outside any call)", "idle": "idle inside compute calls"}
    rows = []
    for k in ("productive", "overhead", "idle"):
        lv, rv, ov = live["buckets"][k], rep["buckets"][k], old["buckets"][k]
        ok = lv["error_pct"] is not None and abs(lv["error_pct"]) <= 2.0
        rows.append([names[k], num(lv["truth_s"], 3), num(lv["measured_s"], 3), pct(lv["error_pct"]), met(ok),
                     num(rv["measured_s"], 3), f"{num(ov['measured_s'], 3)} ({pct(ov['error_pct'])})"])
    tp, mp = live["truth_per_phase"], live["measured_per_phase"]
    led, rec, cost = r["ledger"], r["recovery"], r["poll_cost"]
    return [f"{', '.join(r.get('gpu') or ['?'])}; Python {r.get('python')}; {r['steps']} steps + init_model; task-event "
            f"poll every {num(r['poll_interval_s'], 1, ' s')} (the default), call observer every "
            f"{num(r['observer_interval_s'], 2, ' s')}, sampler drains every 1 s; attributed window "
            f"{num(live['window'][1] - live['window'][0], 1, ' s')}.", "",
            "**Per bucket** (target: each within 2 % of the truth; *replay* = the committed recording through the "
            "accountant, as CI runs it; *poll-time view* = the same recording with calls closed at the poll that no "
            "longer sees them and no observer: what the accountant did before):", "",
            *table(["bucket", "truth (s)", "measured (s)", "error", "target", "replay (s)", "poll-time view (s)"], rows),
            "", "**Per fleet / phase** (seconds the call held the GPU):", "",
            *table(["fleet / phase", "truth (s)", "measured (s)", "error (s)"],
                   [[k, num(v, 3), num(mp.get(k, 0.0), 3), f"{mp.get(k, 0.0) - v:+.3f}"] for k, v in tp.items()]),
            "",
            f"* Calls longer than 0.2 s: **{live.get('calls')}**, each charged to its own fleet and phase for at least "
            f"**{num(100 * (live.get('calls_min_share') or 0), 2, ' %')}** of its span (poll-time view: "
            f"{num(100 * (old.get('calls_min_share') or 0), 1, ' %')}).",
            f"* Boundaries: {led['finals_exact']} calls closed by a poll got Ray's recorded end (by task id), "
            f"{led['finals_estimated']} kept the poll's estimate; {led['recovered']} calls no poll saw were found by the "
            f"observer and recovered from {rec['pages']} finished-task pages ({rec['cut_pages']} cut, "
            f"{rec['observed_only']} left with the observer's boundaries); GPU busy outside any call "
            f"{num(live['busy_no_call_s'], 3, ' s')}.",
            f"* Cost per poll (median of {cost['polls']}): {cost['calls_median']} state-API calls (at most "
            f"{cost['calls_max']}), {num((cost['bytes_median'] or 0) / 1024, 1, ' KiB')}, "
            f"{num(1000 * (cost['wall_s_median'] or 0), 1, ' ms')} wall, {num(1000 * (cost['cpu_s_median'] or 0), 1, ' ms')} "
            f"CPU; observer {r['observer']['samples']:,} samples; sampler {num(r['sampler_cpu_s'], 2, ' s')} CPU over the run."]


def _cluster_rows(c: dict) -> list[list[str]]:
    rows = []
    for gpus in (8, 64, 512, 4096):
        nodes = gpus // 8
        runs = 10
        series = runs * c["per_run_total"] + gpus * c["per_gpu"] + c["exporter_global"] + (nodes + 1) * SCRAPE_TARGET_SERIES
        rows.append([f"{gpus:,} GPUs ({nodes:,} node{'s' if nodes > 1 else ''}) x {runs} runs", f"{series:,.0f}",
                     f"{series / 15:,.0f}", f"{series / 15 * 86_400 * BYTES_PER_SAMPLE / 1e6:,.0f} MB"])
    return rows


def prometheus_series(r: dict) -> list[str]:
    load = r["loads"][0]
    c = load["series_counts"]
    return [*table(["unit", "series", "what"], [
        ["per run", f"**{c['per_run_total']:,.0f}**", f"{c['per_run_omniwatch']:,.0f} omniwatch_* + {c['per_run_verl']:,.0f} "
                                                       f"`verl_*` passthrough keys ({r.get('verl_keys', 150)} verl keys per line)"],
        ["per GPU", f"**{c['per_gpu']:,.0f}**", "device series + phase-attributed busy/idle counters"],
        [f"per node ({r.get('gpus_per_node', 8)} GPUs)", f"**{c['per_node']:,} + {SCRAPE_TARGET_SERIES}**",
         "GPU series + Prometheus' own `up`/`scrape_*` for the agent target"],
        ["exporter, global", f"{c['exporter_global']:,.0f} + {SCRAPE_TARGET_SERIES}", "build info, runs, ... + the target's `up`/`scrape_*`"]]),
        "", "Computed from those counts for a 15 s scrape interval (disk at ~"
        f"{BYTES_PER_SAMPLE} bytes per compressed sample, a planning figure):", "",
        *table(["cluster", "series", "samples/s @15 s", "disk per day"], _cluster_rows(c))]


def prometheus(r: dict) -> list[str]:
    rows = [[f"{x['gpus']:,} GPUs x {x['runs']} runs{', rules on' if x['rules'] else ''}", f"{x['head_series']:,.0f}",
             num(x["samples_per_s"], 0), mib(x["rss_bytes_end"]), mib(x["rss_bytes_peak"]), mib(x["go_heap_inuse_bytes"])]
            for x in r["loads"]]
    out = table(["load", "head series", f"ingest (samples/s, {r['loads'][0]['scrape_interval']} scrape)", "RSS at the end",
                 "RSS peak", "Go heap in use"], rows)
    if len(r["loads"]) >= 2:
        a, b = r["loads"][0], r["loads"][-1]
        ds = b["head_series"] - a["head_series"]
        if ds > 0:
            per = (b["rss_bytes_peak"] - a["rss_bytes_peak"]) / ds
            out += ["", f"Between the two loads: {mib(b['rss_bytes_peak'] - a['rss_bytes_peak'])} more peak RSS for "
                        f"{ds:,.0f} more head series, about {num(per / 1024, 1, ' KiB')} per head series at this head age."]
    return out


def queries(r: dict) -> list[str]:
    slow = r.get("slowest") or []
    return [*table(["resolution", "samples", "create-blocks", f"{r['range_queries']} panel queries, total", "slowest panel",
                    "errors"], [
        [f"{r['resolution_s']} s", f"{r['samples'] / 1e6:,.2f} M", num(r["create_blocks_s"], 0, " s"), num(r["range_total_s"], 1, " s"),
         f"{num(slow[0][0], 2, ' s')} ({slow[0][2]})" if slow else "n/a", str(r["range_query_errors"])]]),
        "", f"Range step {r['range_step_s']} s over {num(r['hours'], 0, ' h')} of {r['gpus']} GPUs x {r['runs']} runs; "
            f"Prometheus RSS after the queries {mib(r['rss_bytes_after'])}."]


# --- the overview: one line per section ---------------------------------------------------------------------
def _summary_row(name: str, r: dict) -> list[str] | None:
    """(key figure, baseline or target measured/stated in the same run, ratio)."""
    if name == "ingest":
        return [f"{num(r['file_source_steps_per_s'], 0)} steps/s end to end (file tail), "
                f"{ratio(r['file_source_steps_per_s'], r['parse_steps_per_s'])} parse alone",
                f"target {r['target_steps_per_s']:,} steps/s", ratio(r["file_source_steps_per_s"], r["target_steps_per_s"])]
    if name == "render":
        return [f"/metrics render p50 {num(r['omniwatch_p50_ms'], 1, ' ms')}", f"plain registry {num(r['plain_p50_ms'], 1, ' ms')}",
                ratio(r["omniwatch_p50_ms"], r["plain_p50_ms"])]
    if name == "memory":
        k = r["keys"]
        return [f"{k['keys_held']:,} of {k['keys_offered']:,} offered keys held, RSS +{num(k['rss_growth_mib'], 1, ' MiB')}",
                f"cap {k['cap']:,}", ratio(k["keys_held"], k["cap"])]
    if name == "backtest":
        return [f"{r['steps']:,}-step backtest {num(r['wall_s'], 1, ' s')}", f"target {r.get('target_s', 60)} s",
                ratio(r["wall_s"], r.get("target_s", 60))]
    if name == "report":
        return [f"report of {r['runs']} x {r['steps']} steps {num(r['wall_s'], 1, ' s')}", f"target {r.get('target_s', 120)} s",
                ratio(r["wall_s"], r.get("target_s", 120))]
    if name == "push":
        return [f"push held {num(r['held_rate_per_s'], 0, ' req/s')}", f"offered {r['target_rate_per_s']:,.0f} req/s",
                ratio(r["held_rate_per_s"], r["target_rate_per_s"])]
    if name == "alert":
        worst = max((v["max_s"] for v in r.values() if isinstance(v, dict) and _ok(v.get("max_s"))), default=None)
        if "target_s" not in r:
            return [f"slowest alert to the webhook {num(worst, 1, ' s')}", "–", "–"]
        return [f"slowest alert to the webhook {num(worst, 1, ' s')}", f"at most {r['target_s']:g} s",
                ratio(worst, r["target_s"]) if worst is not None else "–"]
    if name == "files":
        a, b = r["pooled"], r["one_fd_per_file"]
        return [f"{a['fds_idle']:,} descriptors for {r['files']:,} files", f"one fd per file: {b['fds_idle']:,}",
                ratio(a["fds_idle"], b["fds_idle"], 3)]
    if name == "tail":
        return [f"idle poll {num(r['now']['idle_poll_cpu_ms'], 1, ' ms')} CPU", f"before issue 14: {num(r['before']['idle_poll_cpu_ms'], 1, ' ms')}",
                ratio(r["now"]["idle_poll_cpu_ms"], r["before"]["idle_poll_cpu_ms"])]
    if name == "idle":
        a, b = r["now"]["large"], r["before"].get("large") or {}
        return [f"{r['large_files']:,} idle files: {num(100 * a['cpu_share_long_idle'], 1)} % of a core "
                f"({num(100 * a['cpu_share_idle'], 1)} % the first 2.5 min)",
                f"before issue 25: {num(100 * b.get('cpu_share_idle', float('nan')), 1)} %",
                ratio(a["cpu_share_long_idle"], b.get("cpu_share_idle"))]
    if name == "soak":
        return [f"soak ({r['runs']} runs, Ray {r['workers']} workers): exporter CPU {num(100 * r['cpu_share_after_fill'], 1)} %, "
                f"RSS {num(r['rss_growth_after_fill_mib'], 1, ' MiB')} after the windows fill, {r['scrapes_failed']} failed scrapes",
                f"<= {num(100 * r['target_cpu_share'], 0)} % of a core", ratio(r["cpu_share_after_fill"], r["target_cpu_share"])]
    if name == "connections":
        return [f"/metrics p50 {num(r['loaded_p50_ms'], 1, ' ms')} under {r['idle_connections_opened']:,} idle connections",
                f"no load: {num(r['baseline_p50_ms'], 1, ' ms')}", ratio(r["loaded_p50_ms"], r["baseline_p50_ms"])]
    if name == "gpu_idle":
        v = r["per_phase"].get("inter_stage", {})
        return [f"GPU inter-stage idle measured {num(v.get('measured_idle_s'), 2, ' s')}",
                f"truth {num(v.get('truth_idle_s'), 2, ' s')}", ratio(v.get("measured_idle_s"), v.get("truth_idle_s"), 3)]
    if name == "gpu_fleet":
        worst = max(r["live"]["buckets"].items(), key=lambda kv: abs(kv[1]["error_pct"] or 0))
        return [f"per-fleet GPU time at 5 s polls, worst bucket ({worst[0]}) {worst[1]['error_pct']:+.2f} %",
                "target ±2 %", ratio(abs(worst[1]["error_pct"] or 0), 2.0)]
    if name == "prometheus":
        x = r["loads"][-1]
        return [f"Prometheus RSS peak {mib(x['rss_bytes_peak'])} at {x['gpus']:,} GPUs", f"{x['head_series']:,.0f} head series", "–"]
    if name == "queries":
        return [f"{r['range_queries']} panel queries over {num(r['hours'], 0, ' h')}: {num(r['range_total_s'], 1, ' s')}", "–", "–"]
    return None


SUMMARY_ORDER = ("ingest", "render", "memory", "backtest", "report", "push", "alert", "files", "tail", "idle", "connections", "soak",
                 "gpu_idle", "gpu_fleet", "prometheus", "queries")


def summary(results: dict) -> list[str]:
    rows = []
    for name in SUMMARY_ORDER:
        sec = results.get(name)
        if _missing(name, sec) is not None:
            rows.append([name, "not measured" if sec is None else "no figures (see its section)", "", "", ""])
            continue
        row = _summary_row(name, sec)
        m = sec.get("meta") or {}
        when = m["when"][:10] if m.get("when") else "not recorded"
        load = m.get("load_avg_at_start") or []
        rows.append([name, *row, f"{when}, {m.get('cpus', '?')} CPUs, load {num(load[0], 1) if load else '?'}"])
    return table(["section", "key figure", "baseline / target (same run)", "ratio", "measured"], rows)


# --- blocks: name -> (document, renderer of results[section]) -----------------------------------------------
SECTION_BLOCKS: dict[str, tuple[str, str, Callable[[dict], list[str]]]] = {
    # block name: (doc, results.json section, renderer)
    "ingest": ("docs/benchmarks.md", "ingest", ingest),
    "render": ("docs/benchmarks.md", "render", render),
    "memory": ("docs/benchmarks.md", "memory", memory),
    "backtest": ("docs/benchmarks.md", "backtest", backtest),
    "report": ("docs/benchmarks.md", "report", report),
    "push": ("docs/benchmarks.md", "push", push),
    "alert": ("docs/benchmarks.md", "alert", alert),
    "files": ("docs/benchmarks.md", "files", files),
    "tail": ("docs/benchmarks.md", "tail", tail),
    "idle": ("docs/benchmarks.md", "idle", idle),
    "connections": ("docs/benchmarks.md", "connections", connections),
    "raytasks": ("docs/benchmarks.md", "raytasks", raytasks),
    "raytasks_overhead": ("docs/benchmarks.md", "raytasks_overhead", raytasks_overhead),
    "soak": ("docs/benchmarks.md", "soak", soak),
    "gpu_idle": ("docs/benchmarks.md", "gpu_idle", gpu_idle),
    "gpu_fleet": ("docs/benchmarks.md", "gpu_fleet", gpu_fleet),
    "prometheus-series": ("docs/scaling.md", "prometheus", prometheus_series),
    "prometheus": ("docs/scaling.md", "prometheus", prometheus),
    "queries": ("docs/scaling.md", "queries", queries),
}
DOCS = ("docs/benchmarks.md", "docs/scaling.md")


def render_block(name: str, results: dict) -> str:
    """The text between a block's markers (each marker on its own line)."""
    if name == "summary":
        lines = summary(results)
    else:
        _, section, fn = SECTION_BLOCKS[name]
        sec = results.get(section)
        lines = _missing(section, sec)
        if lines is None:
            lines = [*fn(sec), "", measured(section, sec)]
    return "\n".join(["", *lines, ""]) + "\n"


def render_doc(text: str, results: dict, doc: str = "") -> str:
    """``text`` with every generated block re-rendered; unknown block names are an error."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name != "summary" and name not in SECTION_BLOCKS:
            raise ValueError(f"{doc}: unknown generated block {name!r} (benchmarks/docs.py SECTION_BLOCKS)")
        return BEGIN.format(name=name) + "\n" + render_block(name, results) + END.format(name=name)
    return BLOCK_RE.sub(sub, text)


def blocks_in(text: str) -> list[str]:
    return [m.group("name") for m in BLOCK_RE.finditer(text)]


def render_all(results: dict, root: Path = REPO) -> dict[Path, str]:
    """{doc path: rendered text}; every block of SECTION_BLOCKS must appear once, in its document."""
    out = {}
    for doc in DOCS:
        path = root / doc
        text = path.read_text()
        names = blocks_in(text)
        want = [n for n, (d, _, _) in SECTION_BLOCKS.items() if d == doc] + (["summary"] if doc == DOCS[0] else [])
        missing = sorted(set(want) - set(names))
        dup = sorted({n for n in names if names.count(n) > 1})
        if missing or dup:
            raise ValueError(f"{doc}: generated blocks missing {missing} or repeated {dup} (markers: {BEGIN.format(name='NAME')})")
        out[path] = render_doc(text, results, doc)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--root", default=str(REPO), help="repository root whose docs/ are rendered")
    ap.add_argument("--check", action="store_true", help="fail on drift instead of writing")
    a = ap.parse_args(argv)
    results = json.loads(Path(a.results).read_text())
    try:
        rendered = render_all(results, Path(a.root))
    except ValueError as e:  # a block missing, repeated or unknown: say which, no traceback
        print(f"benchmarks/docs.py: {e}", file=sys.stderr)
        return 2
    drift = []
    for path, new in rendered.items():
        old = path.read_text()
        if old == new:
            continue
        if a.check:
            drift.append(path)
            sys.stdout.writelines(list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path),
                                                            f"{path} (rendered from {a.results})", n=1))[:40])
        else:
            path.write_text(new)
            print(f"wrote {path}")
    if drift:
        print(f"drift in {', '.join(map(str, drift))}: the benchmark figures differ from {a.results}; "
              "run `make generate` (benchmarks/run.py --docs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
