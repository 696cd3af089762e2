#!/usr/bin/env python3
"""``make bench``: omniwatch's benchmarks, each against a baseline or target measured in the same run.

Sections (``--only``/``--skip`` pick): ingest (parse + analytics throughput, with a cProfile), render
(/metrics vs a plain prometheus_client registry), memory (100k steps; 50k distinct keys), backtest
(``omniwatch backtest`` of 2,000 steps), report (``omniwatch report DIR`` of 50 runs x 500 steps), push (POST /api/v1/push load on a real ``omniwatch serve``),
alert (end-to-end alert latency on the real stack with default intervals; slow: a minute or two per
trial), files (5,000 watched files under ``prlimit --nofile=1024``: descriptors, CPU per poll, against one
descriptor per file), tail (one in-process ``FileSource`` poll over 5,000 idle files, against the code
before issue 14), connections (/metrics latency while 1,000 idle connections are held, against no
load), prometheus (a real Prometheus scraping 64 and 512 GPUs x 10 runs of omniwatch series: head series,
ingest, RSS), queries (every dashboard panel as a range query over 24 h of backfilled 64-GPU data), raytasks
(one Ray task-event poll at 8, 64 and 512 workers x 10 phases against a stand-in of Ray's state API),
raytasks_overhead (a verl worker-group loop on a real Ray 2.60 cluster with and without the poller: step-time
ratio; skipped with a note where Ray / verl are not installed), soak (issue 35: a real ``omniwatch serve`` beside
64 runs stepping every 2 s and a Ray state API of 512 workers for --soak-seconds, 600 by default: exporter CPU,
RSS growth once the windows fill, failed scrapes).
Prints a table and writes ``benchmarks/results.json`` (sections not run keep their last results; each
section records when and where it ran under its own ``meta``), then re-renders the generated figures of
docs/benchmarks.md and docs/scaling.md from it (``benchmarks/docs.py``). Nothing here is a pass/fail test.

    .venv/bin/python benchmarks/run.py                          # all, short push run, 1 alert trial
    .venv/bin/python benchmarks/run.py --only push --push-duration 60 --push-rate 1000
    .venv/bin/python benchmarks/run.py --only alert --alert-trials 5
    .venv/bin/python benchmarks/run.py --only files connections
    .venv/bin/python benchmarks/run.py --docs [--check]       # only re-render the docs from results.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

SECTIONS = ("ingest", "render", "memory", "backtest", "report", "push", "alert", "files", "tail", "idle", "connections",
            "prometheus", "queries", "raytasks", "raytasks_overhead", "soak")
RESULTS = HERE / "results.json"


def where(argv: list[str]) -> dict:
    """When and on what a section ran: stored under the section's ``meta`` (docs/benchmarks.md quotes it)."""
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "argv": argv}


def _f(x, unit: str = "", nd: int = 1) -> str:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return f"{x:,.{nd}f}{unit}"
    return "n/a"


def rows(results: dict) -> list[tuple[str, str, str]]:
    """(benchmark, measured, target/baseline) rows for the table."""
    out = []
    if (r := results.get("ingest")) and "error" not in r:
        target = f">= {r.get('target_steps_per_s', 15_000):,} steps/s"
        out += [("ingest: parse + RunStore.ingest", f"{_f(r['ingest_steps_per_s'], ' steps/s', 0)} "
                 f"({_f(r['ingest_values_per_s'], ' values/s', 0)}, {r['keys_per_line']} keys/line)", ""),
                ("ingest: FileSource.poll_once (real files, end to end)",
                 f"{_f(r['file_source_steps_per_s'], ' steps/s', 0)} "
                 f"({r['file_source_steps_per_s'] / r['parse_steps_per_s']:.2f}x parse alone)", target),
                ("ingest: parse_jsonl_line alone", _f(r["parse_steps_per_s"], " steps/s", 0), "")]
        if r.get("profile_top"):
            top = ", ".join(f"{p['function']} {p['share_of_total']:.0%}" for p in r["profile_top"][:3])
            out.append(("ingest: top self time (cProfile)", top, ""))
    if (r := results.get("render")) and "error" not in r:
        out += [("/metrics render (generate_latest)", f"p50 {_f(r['omniwatch_p50_ms'], ' ms')}, p99 {_f(r['omniwatch_p99_ms'], ' ms')} "
                 f"({r['series_omniwatch']} series)", "p99 < 20 ms"),
                ("/metrics vs plain registry, same series", f"{_f(r['ratio_p50'], 'x', 2)} (plain p50 {_f(r['plain_p50_ms'], ' ms')})", "<= 1.2x")]
        if "http_p99_ms" in r:
            out.append(("GET /metrics over HTTP", f"p50 {_f(r['http_p50_ms'], ' ms')}, p99 {_f(r['http_p99_ms'], ' ms')}", ""))
    if (r := results.get("memory")) and "error" not in r:
        s, k = r["steps"], r["keys"]
        out += [("memory: 100k steps, 10 runs", f"RSS +{_f(s['rss_growth_mib'], ' MiB')} (total {_f(s['rss_mib'], ' MiB')}), "
                 f"tracemalloc {_f(s['tracemalloc_current_mib'], ' MiB')}", "bounded"),
                ("memory: 50k distinct keys offered", f"{k['keys_held']} held (cap {k['cap']}), RSS +{_f(k['rss_growth_mib'], ' MiB')}, "
                 f"tracemalloc {_f(k['tracemalloc_current_mib'], ' MiB', 2)}", "<= cap")]
    if (r := results.get("backtest")) and "error" not in r:
        out.append(("backtest of a 2,000-step run", _f(r.get("wall_s"), " s") if r.get("status") == "ok" else r.get("status", "n/a"),
                    "" if r.get("status") == "ok" else r.get("why", r.get("stderr", ""))[:60]))
    if (r := results.get("report")) and "error" not in r:
        out.append((f"omniwatch report DIR: {r.get('runs')} runs x {r.get('steps')} steps",
                    f"{_f(r.get('wall_s'), ' s')} wall, {_f(r.get('cpu_s'), ' s')} CPU (load {_f(r.get('load_avg_before'))})"
                    if r.get("status") == "ok" else r.get("status", "n/a"), "< 120 s on 2 cores"))
    if (r := results.get("push")) and "error" not in r:
        out.append((f"push {r['target_rate_per_s']:.0f}/s for {r['duration_s']:.0f} s", f"held {_f(r['held_rate_per_s'], '/s', 0)}, "
                    f"errors {r['errors_total']}, p50 {_f(r['p50_ms'], ' ms')}, p99 {_f(r['p99_ms'], ' ms')}, "
                    f"server {_f(r['server_cpu_ms_per_request'], ' ms CPU/req', 2)}", f"{r['target_rate_per_s']:.0f}/s"))
    if (r := results.get("alert")) and "error" not in r:
        for name, v in r.items():
            if isinstance(v, dict) and "median_s" in v:  # (not the section's meta)
                out.append((f"alert latency {name}", f"median {_f(v['median_s'], ' s')}, max {_f(v['max_s'], ' s')}"
                            + (f", missed {v['missed']}" if v["missed"] else ""), f"{r['trials']} trial(s), default intervals"))
    if (r := results.get("files")) and "error" not in r:
        a, b = r["pooled"], r["one_fd_per_file"]
        out += [(f"{r['files']:,} watched files: descriptors (nofile=1024)",
                 f"{a['fds_idle']} idle, {a['fds_busy']} with 1 % growing; ingest {_f(a['ingest_s'], ' s')}",
                 f"one fd per file: {b['fds_idle']} (ratio {r['fd_ratio']:.3f})"),
                (f"{r['files']:,} watched files: CPU per {r['poll_interval_s']} s poll",
                 f"{_f(a['cpu_ms_per_poll_idle'], ' ms', 1)} idle, {_f(a['cpu_ms_per_poll_1pct_growing'], ' ms', 1)} with "
                 f"{a['growing_files']} growing", f"one fd per file: {_f(b['cpu_ms_per_poll_idle'], ' ms', 1)} idle, "
                 f"{_f(b['cpu_ms_per_poll_1pct_growing'], ' ms', 1)} growing")]
    if (r := results.get("tail")) and "error" not in r and r.get("status") == "ok":
        a, b = r["now"], r["before"]
        out.append((f"FileSource poll over {a['files']:,} idle files (in-process)",
                    f"idle poll {_f(a['idle_poll_cpu_ms'], ' ms CPU')}, first pass {_f(a['first_pass_cpu_ms'], ' ms', 0)}, "
                    f"{a['descriptors']} fds", f"before issue 14 ({r['before_rev']}): {_f(b['idle_poll_cpu_ms'], ' ms CPU')} "
                    f"(ratio {r['idle_poll_ratio']:.2f})"))
    if (r := results.get("idle")) and "error" not in r and r.get("status") == "ok":
        a, b = r["now"], r["before"].get("large", {})
        out.append((f"--watch over {r['large_files']:,} idle files (in-process)",
                    f"{_f(100 * a['large']['cpu_share_idle'], ' %')} of a core idle 30 s, "
                    f"{_f(100 * a['large']['cpu_share_long_idle'], ' %')} idle 2.5 min; "
                    f"x{r['ratio_large_small_long_idle']:.0f} the {r['small_files']:,}-file cost",
                    f"before issue 25: {_f(100 * b.get('cpu_share_idle', float('nan')), ' %')}"))
    if (r := results.get("connections")) and "error" not in r:
        out.append((f"/metrics with {r['idle_connections_opened']:,} idle connections (nofile=1024)",
                    f"p50 {_f(r['loaded_p50_ms'], ' ms', 2)}, p99 {_f(r['loaded_p99_ms'], ' ms', 2)}; "
                    f"{r['connections_held']:.0f} held, {r['fds_loaded']} fds",
                    f"no load: p50 {_f(r['baseline_p50_ms'], ' ms', 2)}, p99 {_f(r['baseline_p99_ms'], ' ms', 2)} "
                    f"(x{r['p50_ratio']:.2f}, x{r['p99_ratio']:.2f})"))
    if (r := results.get("prometheus")) and "error" not in r:
        for load in r["loads"]:
            out.append((f"Prometheus: {load['gpus']} GPUs x {load['runs']} runs{', rules' if load['rules'] else ''}",
                        f"{load['head_series']:,.0f} head series, {_f(load['samples_per_s'], ' samples/s', 0)} "
                        f"(scrape {load['scrape_interval']}), RSS peak {_f(load['rss_bytes_peak'] / 2**20, ' MiB', 0)}", ""))
    if (r := results.get("queries")) and "error" not in r:
        out.append((f"{r['range_queries']} panel queries over {r['hours']:.0f} h of {r['gpus']} GPUs",
                    f"{_f(r['range_total_s'], ' s', 1)} in all, slowest {_f(r['slowest'][0][0], ' s', 2)}; "
                    f"create-blocks {_f(r['create_blocks_s'], ' s', 0)}", f"{r['samples'] / 1e6:.2f} M samples"))
    if (r := results.get("raytasks")) and "error" not in r:
        for x in r["workers"]:  # benchmarks/raytasks_poll.py
            out.append((f"Ray task-event poll, {x['workers']} workers x 10 phases", f"{x['calls_per_poll']} calls, "
                        f"{_f(x['kbytes_per_poll'], ' KiB', 0)}, CPU p50 {_f(x['cpu_ms_median'], ' ms', 1)} "
                        f"(max {_f(x['cpu_ms_max'], ' ms', 1)})", "3 calls; < 1 % of a core at 5 s"))
    if (r := results.get("raytasks_overhead")) and "error" not in r:
        if r.get("status") == "skipped":
            out.append(("trainer-side overhead of the task-event poller", "skipped", r.get("why", "")[:80]))
        for x in r.get("intervals", []):  # benchmarks/raytasks_overhead.py
            out.append((f"worker-group step time, poller on / off at {x['interval_s']:g} s",
                        f"{_f(x['ratio_median_of_pairs'], 'x', 3)} (median of {len(x['pair_ratios'])} pairs; "
                        f"total {_f(x['ratio_total'], 'x', 3)})", "<= 1.01"))
    if (r := results.get("soak")) and "error" not in r:
        out += [(f"soak {r['duration_s']:.0f} s: {r['runs']} runs / {r['step_s']:g} s + Ray {r['workers']} workers",
                 f"exporter CPU {_f(100 * r['cpu_share_after_fill'], ' %')} of a core after {r['fill_s']:.0f} s "
                 f"({_f(100 * r['cpu_share_total'], ' %')} overall)", f"<= {100 * r['target_cpu_share']:.0f} %"),
                ("soak: RSS after the windows fill", f"{_f(r['rss_mib_at_fill'], ' MiB')} -> {_f(r['rss_mib_end'], ' MiB')} "
                 f"({_f(r['rss_slope_after_fill_mib_per_min'], ' MiB/min', 2)})", "flat"),
                ("soak: scrapes", f"{r['scrapes_failed']} of {r['scrapes']} failed, p50 {_f(r['scrape_p50_ms'], ' ms')}, "
                 f"max {_f(r['scrape_max_ms'], ' ms')}", "none failed")]
    for name, r in results.items():
        if isinstance(r, dict) and "error" in r:
            out.append((name, "ERROR", r["error"][:80]))
    return out


def _order(key: str) -> int:
    """meta first, then the sections in SECTIONS order, then anything else (gpu_idle)."""
    return -1 if key == "meta" else SECTIONS.index(key) if key in SECTIONS else len(SECTIONS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=SECTIONS)
    p.add_argument("--skip", nargs="+", choices=SECTIONS, default=[])
    p.add_argument("--ingest-steps", type=int, default=20_000)
    p.add_argument("--render-iterations", type=int, default=300)
    p.add_argument("--memory-steps", type=int, default=100_000)
    p.add_argument("--memory-keys", type=int, default=50_000)
    p.add_argument("--backtest-steps", type=int, default=2_000)
    p.add_argument("--report-runs", type=int, default=50)
    p.add_argument("--report-steps", type=int, default=500)
    p.add_argument("--push-rate", type=float, default=1000)
    p.add_argument("--push-duration", type=float, default=10, help="seconds")
    p.add_argument("--push-clients", type=int, default=4, help="client processes sharing the rate")
    p.add_argument("--push-concurrency", type=int, default=8, help="in-flight requests per client")
    p.add_argument("--alert-trials", type=int, default=1)
    p.add_argument("--alert-timeout", type=float, default=240, help="seconds to wait for all alerts per trial")
    p.add_argument("--files", type=int, default=5000, help="watched files for the files section")
    p.add_argument("--idle-connections", type=int, default=1000, help="held connections for the connections section")
    p.add_argument("--prometheus-seconds", type=float, default=20, help="measured seconds per load (after warm-up)")
    p.add_argument("--overhead-pairs", type=int, default=16, help="raytasks_overhead: off/on block pairs per interval")
    p.add_argument("--overhead-steps", type=int, default=6, help="raytasks_overhead: steps per block")
    p.add_argument("--soak-seconds", type=float, default=600, help="soak: seconds (the issue's soak is 600)")
    p.add_argument("--soak-fill", type=float, default=None,
                   help="soak: seconds before RSS growth is measured (default 180: the step windows; the 512-worker "
                        "task ledger fills its bounds in ~13 min)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--docs", action="store_true", help="run nothing: re-render the docs' generated figures from --out")
    p.add_argument("--check", action="store_true", help="with --docs: fail on drift instead of writing")
    args = p.parse_args(argv)
    import docs
    if args.docs:
        return docs.main(["--results", args.out] + (["--check"] if args.check else []))
    chosen = [s for s in (args.only or SECTIONS) if s not in args.skip]

    import alert_latency, backtest_bench, idle_files, ingest, load_prometheus, memory, pressure, push_load, render, report_bench, tail_idle_poll  # noqa: E401
    import raytasks_overhead, raytasks_poll, soak  # noqa: E401
    runners = {
        "ingest": lambda: ingest.run(args.ingest_steps),
        "render": lambda: render.run(args.render_iterations),
        "memory": lambda: memory.run(args.memory_steps, args.memory_keys),
        "backtest": lambda: backtest_bench.run(args.backtest_steps),
        "report": lambda: report_bench.run(args.report_runs, args.report_steps),
        "push": lambda: push_load.run(args.push_rate, args.push_duration, args.push_concurrency, args.push_clients),
        "alert": lambda: alert_latency.run(args.alert_trials, args.alert_timeout),
        "files": lambda: pressure.files(args.files),
        "tail": lambda: tail_idle_poll.compare(args.files),
        "idle": lambda: idle_files.compare(),
        "connections": lambda: pressure.connections(args.idle_connections),
        "prometheus": lambda: load_prometheus.sizing(args.prometheus_seconds),
        "queries": lambda: load_prometheus.queries(),
        "raytasks": lambda: {"workers": raytasks_poll.run(20)},
        "raytasks_overhead": lambda: raytasks_overhead.run(args.overhead_pairs, args.overhead_steps),
        "soak": lambda: soak.run(args.soak_seconds, args.soak_fill),
    }
    con = Console()
    run_argv = list(sys.argv[1:] if argv is None else argv)
    results: dict = {"meta": where(run_argv)}
    try:  # sections not run this time keep their last results
        kept = {k: v for k, v in json.loads(Path(args.out).read_text()).items() if k not in chosen and k != "meta"}
    except (OSError, ValueError):
        kept = {}

    def save() -> None:  # after every section: a later failure (or Ctrl-C) never loses what was measured
        merged = {**kept, **results}
        Path(args.out).write_text(json.dumps({k: merged[k] for k in sorted(merged, key=_order)}, indent=2,
                                             default=str) + "\n")

    for name in chosen:
        con.print(f"[bold]running {name}[/] ...")
        meta = where(run_argv)
        t0 = time.perf_counter()
        try:
            results[name] = runners[name]()
        except Exception as e:  # one broken section must not hide the others
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        results[name]["meta"] = {**meta, "section_wall_s": round(time.perf_counter() - t0, 1)}
        save()
    con.print(f"results written to {args.out}")
    if Path(args.out).resolve() == RESULTS:  # the committed results: the docs quote them
        docs.main(["--results", args.out])
    table = Table(title=f"omniwatch benchmarks ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    for col in ("benchmark", "measured", "target / baseline"):
        table.add_column(col)
    for row in rows({**kept, **results}):
        table.add_row(*row)
    con.print(table)
    if (r := results.get("ingest")) and r.get("profile_top"):
        prof = Table(title="ingest profile (parse + ingest, cProfile, by self time)")
        for col in ("function", "calls", "self s", "cum s", "share"):
            prof.add_column(col)
        for x in r["profile_top"]:
            prof.add_row(x["function"], str(x["calls"]), f"{x['tottime_s']:.3f}", f"{x['cumtime_s']:.3f}", f"{x['share_of_total']:.0%}")
        con.print(prof)
    return 1 if any(isinstance(r, dict) and "error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
