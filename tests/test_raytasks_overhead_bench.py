"""benchmarks/raytasks_overhead.py (make bench, section raytasks_overhead): without Ray / verl in the bench's Python
it records a skip with the reason, and docs/benchmarks.md's block says so instead of showing figures."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_without_ray_the_bench_skips_with_a_note_the_docs_repeat(monkeypatch):
    import docs
    import raytasks_overhead as ov
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("ray", "verl") else real(name, *a))
    res = ov.run(pairs=1, steps=1)
    assert res["status"] == "skipped" and "install-ray-tq.sh" in res["why"]
    res["meta"] = {"when": "2026-01-01T00:00:00+0000", "cpus": 2, "argv": ["--only", "raytasks_overhead"]}
    block = docs.render_block("raytasks_overhead", {"raytasks_overhead": res})
    assert "Not measured (skipped: ray is not installed" in block and "|" not in block


def test_the_recorded_figures_render():
    import json

    import docs
    res = json.loads((BENCH / "results.json").read_text())["raytasks_overhead"]
    block = docs.render_block("raytasks_overhead", {"raytasks_overhead": res})
    for x in res["intervals"]:
        assert f"**{x['ratio_median_of_pairs']:.3f}**" in block
