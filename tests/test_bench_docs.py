"""The benchmark figures in docs/benchmarks.md and docs/scaling.md are rendered from benchmarks/results.json
(benchmarks/docs.py): the committed docs match the committed results, a changed result changes the docs (and
fails the drift check until re-rendered), every benchmark section has its block, and a section that failed or
was never run says so instead of keeping an old figure."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
DOCS = ("docs/benchmarks.md", "docs/scaling.md")


def _docs(*args: str, root: Path = REPO, results: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(BENCH / "docs.py"), "--root", str(root), "--results", str(results or BENCH / "results.json")]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path):
    for doc in DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / doc, tmp_path / doc)
    results = json.loads((BENCH / "results.json").read_text())
    return tmp_path, results


def test_committed_docs_match_committed_results():
    r = _docs("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_changed_result_changes_the_docs_and_fails_the_check(tree):
    root, results = tree
    assert "ingest" in results and "parse_steps_per_s" in results["ingest"]
    results["ingest"]["parse_steps_per_s"] = 123456.0
    path = root / "results.json"
    path.write_text(json.dumps(results))
    r = _docs("--check", root=root, results=path)
    assert r.returncode == 1 and "drift" in r.stderr
    assert "123,456" not in (root / "docs/benchmarks.md").read_text()  # --check writes nothing
    r = _docs(root=root, results=path)
    assert r.returncode == 0, r.stderr
    assert "123,456" in (root / "docs/benchmarks.md").read_text()
    assert _docs("--check", root=root, results=path).returncode == 0


def test_a_failed_or_missing_section_says_so(tree):
    root, results = tree
    results["render"] = {"error": "RuntimeError: prometheus did not start"}
    results.pop("push", None)
    path = root / "results.json"
    path.write_text(json.dumps(results))
    assert _docs(root=root, results=path).returncode == 0
    text = (root / "docs/benchmarks.md").read_text()
    assert "failed (RuntimeError: prometheus did not start)" in text
    assert "Not measured yet: `benchmarks/run.py --only push`" in text


def test_every_benchmark_section_has_a_block():
    sys.path.insert(0, str(BENCH))
    try:
        import docs as bench_docs
        import run as bench_run
    finally:
        sys.path.remove(str(BENCH))
    sections = {s for _, s, _ in bench_docs.SECTION_BLOCKS.values()}
    assert set(bench_run.SECTIONS) <= sections, set(bench_run.SECTIONS) - sections
    text = "".join((REPO / d).read_text() for d in DOCS)
    for name in bench_docs.SECTION_BLOCKS:
        assert text.count(bench_docs.BEGIN.format(name=name)) == 1, name


def test_a_block_missing_from_a_doc_is_an_error(tree):
    root, _ = tree
    doc = root / "docs/scaling.md"
    doc.write_text(doc.read_text().replace("GENERATED: queries", "GENERATED: q"))
    r = _docs("--check", root=root)
    assert r.returncode == 2 and "queries" in r.stderr and "Traceback" not in r.stderr
