"""The report as JSON (``--json``: the same facts as the page, for scripts) and as a terminal summary."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .facts import HOUR, RunFacts
from .verdict import Bottleneck, lost_gpu_hours


def _r(x: float | None, nd: int = 6):
    return None if x is None else round(x, nd)


def facts_json(f: RunFacts, bs: list[Bottleneck]) -> dict:
    hours = f.gpu_hours()
    per_k = f.gpu_hours_per_1k_images()
    return {
        "run": f.run, "project": f.project, "experiment": f.experiment, "source": f.source,
        "steps": f.n_steps, "gpus": f.gpus, "gpus_source": f.gpus_source, "modes": f.modes,
        "median_step_seconds": _r(f.median_step_seconds, 3), "images_per_gpu_second": _r(f.images_per_gpu_second),
        "images": f.images,
        # unknown GPUs: per GPU (= wall hours); "gpus" is null then
        "gpu_hours": {"total": _r(sum(hours.values())), "buckets": {b: _r(h) for b, h in hours.items()}},
        "wall_hours": {"total": _r(sum(f.wall_hours().values())), "buckets": {b: _r(h) for b, h in f.wall_hours().items()}},
        "gpu_hours_per_1k_images": None if per_k is None else {"total": _r(sum(per_k.values())),
                                                                "buckets": {b: _r(h) for b, h in per_k.items()}},
        "pools": {"gpus": f.pools, "source": f.pools_source or None,
                  "gpu_hours": {p: _r(h) for p, h in f.pool_gpu_hours().items()}},
        "fleet_gpu_seconds": {"nodes": {node: {b: _r(v) for b, v in bs_.items()} for node, bs_ in f.fleet_nodes.items()},
                              "cluster": {b: _r(sum(x.get(b, 0.0) for x in f.fleet_nodes.values()))
                                          for b in sorted({b for x in f.fleet_nodes.values() for b in x})}},
        "lost_gpu_hours": _r(lost_gpu_hours(bs)),
        "verdict": [b.as_json() for b in bs],
        "alerts": [a.as_json() for a in f.alerts],
        "alerts_source": f.alerts_source,
        "not_evaluated": f.not_evaluated,
        "trainer_config": f.trainer_config,
        "assumed": f.assumed,
        "lines": f.lines, "skipped": dict(f.skipped),
    }


def print_facts(f: RunFacts, bs: list[Bottleneck], con: Console) -> None:
    con.print(f"[bold]{escape(f'{f.project}/{f.experiment}')}[/]  {escape(f.run)}", highlight=False)
    gpus = f"{f.gpus} GPUs ({f.gpus_source})" if f.gpus else "GPUs unknown (--gpus N): GPU-hours per GPU"
    m = f.modes
    med = f"{f.median_step_seconds:.1f} s" if f.median_step_seconds else "-"
    ips = f"{f.images_per_gpu_second:.3f}" if f.images_per_gpu_second else "-"
    con.print(f"trainer {m.get('trainer', '?')}, reward {m.get('reward', '?')}, {m.get('async_mode', '?')}; {gpus}; "
              f"{f.n_steps} steps, median step {med}, {ips} images/GPU/s", highlight=False, markup=False)
    if f.trainer_config:
        c = f.trainer_config
        con.print(f"trainer config ({c['source']}): total steps {c['total_steps'] or '?'}, save_freq {c['save_freq']}, "
                  f"test_freq {c['test_freq']}, SP {c['sp'] or '?'}, engine {c['engine'] or '?'}, "
                  f"LoRA {c['lora']}, GPUs {c['gpus'] or '?'}", highlight=False, markup=False)
    for a in f.assumed:
        con.print(f"[yellow]assumed:[/] {escape(a)}", highlight=False)
    if f.skipped:
        con.print(f"[yellow]input:[/] {f.skipped_text}", highlight=False)
    t = Table(title=f"Where the GPU-hours went ({f.total_gpu_seconds / HOUR:.2f} GPU-h)", title_justify="left")
    t.add_column("bucket")
    t.add_column("GPU-h", justify="right")
    t.add_column("share", justify="right")
    total = f.total_gpu_seconds / HOUR or 1.0
    for b, h in f.gpu_hours().items():
        t.add_row(b, f"{h:.2f}", f"{h / total * 100:.1f}%")
    con.print(t)
    if "*" in f.not_evaluated:
        con.print(f"No verdict: {f.not_evaluated['*']}.", highlight=False, markup=False)
    elif not bs:
        con.print("[green]No bottleneck alert fired.[/]")
    for k, b in enumerate(bs, 1):
        spans = ", ".join(f"{a}-{z}" for a, z in b.steps) or "live"
        cost = f"{b.gpu_hours:.2f} GPU-h" if b.gpu_seconds else (b.note or "0 GPU-h")
        if b.firing_at_end:
            cost += f"; firing at the last step, costing ≈ {b.now_per_day:.1f} GPU-h/day now"
        elif b.per_day:
            cost += f" (≈ {b.per_day:.1f} GPU-h/day at its last firing step's rate)"
        con.print(f"{k}. [red]{escape(b.alertname)}[/] {escape(cost)}, steps {spans}", highlight=False)
        if b.action:
            con.print(f"   Do: {b.action}", highlight=False, markup=False)
        if b.rule:
            priced = ", ".join(f"{a}-{z}" for a, z in b.priced)
            con.print(f"   priced: {b.rule}" + (f"; steps {priced}" if priced else ""), highlight=False, markup=False)
        con.print(f"   {b.remedy}", highlight=False, markup=False)
