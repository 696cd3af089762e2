"""``omniwatch report DIR -o index.html``: every run under a ``VERL_FILE_LOGGER_ROOT`` at once.

All runs are replayed and backtested in ONE temporary Prometheus (:func:`.gather.facts_of_runs`), then
one page per run is written to ``<out dir>/runs/<project>/<experiment>.html`` (pages are independent:
built by worker processes, one per core) and ``index.html`` ranks the runs by the GPU-hours their
bottlenecks cost, linking each page.
"""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from .facts import HOUR, RunFacts
from .html import index_page, run_page
from .verdict import lost_gpu_hours, verdict

_JOBS: list = []  # (facts, verdict, path, back link) for forked workers


def find_runs(root: str | Path) -> list[Path]:
    """verl file-logger files under ``root`` (``<root>/<project>/<experiment>.jsonl``, any depth)."""
    return sorted(p for p in Path(root).rglob("*.jsonl") if p.is_file())


def safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.~" else "_" for c in part) or "_"


def page_path(out_dir: Path, f: RunFacts) -> Path:
    return out_dir / "runs" / safe(f.project) / f"{safe(f.experiment)}.html"


def _write(k: int) -> int:
    f, bs, path, back = _JOBS[k]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_page(f, bs, back_link=back), encoding="utf-8")
    return k


def write_pages(jobs: list, workers: int | None = None, progress=None) -> None:
    """Write every run page; in ``workers`` forked processes when there are several pages."""
    global _JOBS
    _JOBS = jobs
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    try:
        if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
            for k in range(len(jobs)):
                _write(k)
                if progress:
                    progress.advance()
            return
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for _ in pool.imap_unordered(_write, range(len(jobs))):
                if progress:
                    progress.advance()
    finally:
        _JOBS = []


def build_index(facts: list[RunFacts], out: Path, root: str, progress=None, workers: int | None = None) -> list[dict]:
    out_dir = out.parent
    jobs, rows = [], []
    for f in facts:
        bs = verdict(f)
        path = page_path(out_dir, f)
        back = os.path.relpath(out, path.parent)
        jobs.append((f, bs, path, back))
        rows.append({"name": f"{f.project}/{f.experiment}", "href": os.path.relpath(path, out_dir),
                     "steps": f.n_steps, "gpus": f.gpus, "gpu_hours": f.total_gpu_seconds / HOUR,
                     "lost": lost_gpu_hours(bs), "top": bs[0].alertname if bs and bs[0].gpu_seconds else "",
                     "alerts": sorted({a.alertname for a in f.alerts}), "run": f.run, "page": str(path)})
    if progress:
        progress.phase("write run pages", len(jobs))
    write_pages(jobs, workers, progress)
    rows.sort(key=lambda r: (-r["lost"], r["name"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(index_page(rows, root), encoding="utf-8")
    return rows
