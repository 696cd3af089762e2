"""Explicit wiring: the app and the CLI list their areas as imports; nothing in the package loads one of its own
modules by name (importlib) or hides a missing one behind an ImportError guard. Only optional third-party
packages (Ray in the discovery probe, NVML's binding) may be missing at run time."""
from __future__ import annotations

import ast
from pathlib import Path

import omniwatch
from omniwatch import app, cli

PKG = Path(omniwatch.__file__).resolve().parent
OPTIONAL = {"ray", "pynvml", "matplotlib"}  # the [ray], [gpu] and [preview] extras (pyproject)


def _modules():
    for p in sorted(PKG.rglob("*.py")):
        yield p, ast.parse(p.read_text())


def test_no_module_is_loaded_by_name():
    found = [f"{p.relative_to(PKG)}:{n.lineno}" for p, t in _modules() for n in ast.walk(t)
             if isinstance(n, (ast.Import, ast.ImportFrom))
             and "importlib" in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])]
    assert not found, found


def test_import_guards_only_around_optional_third_party_packages():
    bad = []
    for p, t in _modules():
        for n in ast.walk(t):
            if not isinstance(n, ast.Try):
                continue
            catches = {getattr(h.type, "id", None) for h in n.handlers} | {
                e.id for h in n.handlers if isinstance(h.type, ast.Tuple) for e in h.type.elts if isinstance(e, ast.Name)}
            if not catches & {"ImportError", "ModuleNotFoundError"}:
                continue
            for s in ast.walk(ast.Module(body=n.body, type_ignores=[])):
                if isinstance(s, ast.ImportFrom) and (s.level or (s.module or "").split(".")[0] not in OPTIONAL):
                    bad.append(f"{p.relative_to(PKG)}:{s.lineno} from {'.' * s.level}{s.module}")
                elif isinstance(s, ast.Import) and any(a.name.split(".")[0] not in OPTIONAL for a in s.names):
                    bad.append(f"{p.relative_to(PKG)}:{s.lineno} import {[a.name for a in s.names]}")
    assert not bad, bad


def test_the_app_and_the_cli_list_their_areas():
    assert {a.__name__.rsplit(".", 2)[-2] if a.__name__.endswith(".api") else a.__name__.rsplit(".", 1)[-1]
            for a in app.AREAS} == {"push", "relay", "gpu", "discovery", "agents"}
    parser = cli.build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    assert {"serve", "up", "down", "status", "demo", "rules", "alerts", "dashboards", "backtest", "report", "compare",
            "discover", "agents", "export", "compose", "docs", "replay", "backfill"} <= commands
