"""Issue 34 item 3: one vocabulary each. The phase table (omniwatch/core/phasetable.py) holds every phase and Ray
worker method once; analytics' ``K_*`` each verl key. Any other module computes from them: no module spells a
verl key that has its ``K_*`` constant, and none holds a literal list naming most of the phases or methods (a copy
of the table). Static (AST of the package's source), no clock."""
from __future__ import annotations

import ast
from pathlib import Path

import omniwatch
from omniwatch import palette
from omniwatch.core import analytics, ledger, phasetable
from omniwatch.discovery import phases as discovery
from omniwatch.gpu import fleet

PKG = Path(omniwatch.__file__).parent
KEYS = {v: k for k, v in vars(analytics).items() if k.startswith("K_") and isinstance(v, str)}
PHASE_NAMES = {p.name for p in phasetable.PHASES}
METHOD_NAMES = {m.name for m in phasetable.METHODS}


def _trees():
    for path in sorted(PKG.rglob("*.py")):
        yield path.relative_to(PKG).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_each_verl_key_is_spelled_once():
    spelled: dict[str, list[str]] = {}
    for rel, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in KEYS:
                spelled.setdefault(node.value, []).append(f"{rel}:{node.lineno}")
    twice = {k: where for k, where in spelled.items()
             if len(where) > 1 or not where[0].startswith("core/analytics.py:")}
    assert not twice, f"verl keys spelled outside analytics.K_* (import the constant): {twice}"


def test_no_module_copies_the_phase_or_method_list():
    copies = []
    for rel, tree in _trees():
        if rel == "core/phasetable.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                words = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if 2 * len(words & PHASE_NAMES) > len(PHASE_NAMES) or 2 * len(words & METHOD_NAMES) > len(METHOD_NAMES):
                    copies.append(f"{rel}:{node.lineno}")
    assert not copies, f"literal lists of the phase table's phases or methods (derive them from phasetable): {copies}"


def test_the_table_is_whole():
    assert all(p.cause in phasetable.CAUSES or p.cause is None for p in phasetable.PHASES)
    assert all((m.phase in phasetable.PHASE) != bool(m.colour) for m in phasetable.METHODS), \
        "a method runs a phase (its colour) or has a neutral colour of its own"
    assert len(METHOD_NAMES) == len(phasetable.METHODS) and len(PHASE_NAMES) == len(phasetable.PHASES)
    assert {m.fleet for m in phasetable.METHODS} <= set(fleet.FLEETS)
    assert {p.bucket for p in phasetable.PHASES if p.bucket} <= set(ledger.NON_PHASE)
    assert all(p.key == f"timing_s/{p.name}" for p in phasetable.PHASES)


def test_every_vocabulary_is_computed_from_the_table():
    timed = [p.name for p in phasetable.PHASES if p.timed]
    assert analytics.PHASE_ORDER == tuple(timed)
    assert set(ledger.PHASE_BUCKETS) | set(ledger._BUCKET_OF) == PHASE_NAMES
    assert all(palette.color(p.name) == p.colour and palette.color(ledger.bucket_of(p.name)) == p.colour
               for p in phasetable.PHASES)
    assert all(palette.color(m.name) == (phasetable.PHASE[m.phase].colour if m.phase else m.colour)
               for m in phasetable.METHODS)
    assert discovery.PHASES == (*(m.name for m in phasetable.METHODS), "other")  # the lanes' codes: order kept
    assert fleet.ROLLOUT_PHASES == {"generate_sequences", "generate", "wake_up", "sleep"}
    assert fleet.OVERHEAD_PHASES >= {m.name for m in phasetable.METHODS if m.phase in ("update_weights", "save_checkpoint")}
