"""``omniwatch report DIR -o index.html``: every run under a ``VERL_FILE_LOGGER_ROOT`` at once.

All runs are replayed and backtested in ONE temporary Prometheus (:func:`.gather.facts_of_runs`), then
one page per run is written to ``<out dir>/runs/<project>/<experiment>.html`` (pages are independent:
built by worker processes, one per core) and ``index.html`` ranks the runs by the GPU-hours their
bottlenecks cost, linking each page.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
from pathlib import Path

from ..sources.tail import inside
from .facts import HOUR, RunFacts
from ..config import DEFAULT, Config
from .html import index_page, run_page
from .verdict import lost_gpu_hours, verdict

_JOBS: list = []  # (facts, verdict, path, back link) for forked workers


def find_runs(root: str | Path, refused: list[Path] | None = None) -> list[Path]:
    """verl file-logger files under ``root`` (``<root>/<project>/<experiment>.jsonl``, any depth). A file
    that resolves outside ``root`` (a symlink out of the log root) is not a run of it: left out and added to
    ``refused`` — as the live exporter refuses it (``--follow-symlinks`` is the live opt-in)."""
    real_root = os.path.realpath(root)
    out = []
    for p in sorted(Path(root).rglob("*.jsonl")):
        if not p.is_file():
            continue
        if not inside(real_root, str(p)):
            if refused is not None:
                refused.append(p)
            continue
        out.append(p)
    return out


def safe(part: str) -> str:
    """A file name part for ``part``: ASCII letters, digits and ``-_.~`` kept, anything else ``_`` (a
    128-character label stays under every file system's 255-byte name limit)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_.~" else "_" for c in part) or "_"


def _tag(part: str) -> str:
    return hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def page_path(out_dir: Path, f: RunFacts) -> Path:
    """``runs/<project>/<experiment>.html``; a name :func:`safe` had to change gets ``-<8 hex of its
    SHA-256>``, so ``a b`` and ``a_b`` are two pages (:func:`page_paths` settles what is left: names that
    differ in case only, on a case-insensitive file system)."""
    def part(x: str) -> str:
        s = safe(x)
        return s if s == x else f"{s}-{_tag(x)}"
    return out_dir / "runs" / part(f.project) / f"{part(f.experiment)}.html"


def page_paths(out_dir: Path, facts: list[RunFacts]) -> list[Path]:
    """One page per run, never two runs on one page (compared case-insensitively)."""
    taken: set[str] = set()
    out = []
    for f in facts:
        path, n = page_path(out_dir, f), 2
        while str(path).casefold() in taken:
            path = path.with_name(f"{path.stem}~{n}.html")
            n += 1
        taken.add(str(path).casefold())
        out.append(path)
    return out


def _write(k: int) -> int:
    f, bs, path, back, cfg = _JOBS[k]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_page(f, bs, back_link=back, cfg=cfg), encoding="utf-8")
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


def end_text(f: RunFacts) -> str:
    """How the run ended, for the index: a stalled or crashed run is never shown as a clean short run."""
    if f.open_stall_s > 0 and f.stall_end and f.last_step_at:
        what = "crashed" if f.end_state == "crashed" else "stalled"
        return f"{what}: no step for {(f.stall_end - f.last_step_at) / 60:,.0f} min"
    return {"finished": "finished", "crashed": "crashed", "unfinished": "unfinished (no finish seen)",
            "running": "running"}.get(f.end_state, f.end_state or "–")


def build_index(facts: list[RunFacts], out: Path, root: str, progress=None, workers: int | None = None,
                cfg: Config = DEFAULT) -> list[dict]:
    out_dir = out.parent
    jobs, rows = [], []
    for f, path in zip(facts, page_paths(out_dir, facts)):
        bs = verdict(f, cfg)
        if not f.source_name and f.source in ("jsonl", "console"):
            real_root = os.path.realpath(root)
            f.source_name = os.path.relpath(os.path.realpath(f.run), real_root) if inside(real_root, f.run) \
                else os.path.basename(f.run)
        back = os.path.relpath(out, path.parent)
        jobs.append((f, bs, path, back, cfg))
        rows.append({"name": f"{f.project}/{f.experiment}", "href": os.path.relpath(path, out_dir),
                     "steps": f.n_steps, "gpus": f.gpus, "gpu_hours": f.total_gpu_seconds / HOUR,
                     "lost": lost_gpu_hours(bs), "top": bs[0].alertname if bs and bs[0].gpu_seconds else "",
                     "alerts": sorted({a.alertname for a in f.alerts}), "run": f.run, "page": str(path),
                     "note": f.label_note, "state": end_text(f)})
    if progress:
        progress.phase("write run pages", len(jobs))
    write_pages(jobs, workers, progress)
    rows.sort(key=lambda r: (-r["lost"], r["name"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(index_page(rows, root), encoding="utf-8")
    return rows
