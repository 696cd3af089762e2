"""The package layout the maintainers agreed on (docs/architecture.md): a module name means one thing in the whole
package. The three per-area roles (an area's HTTP routes, CLI subcommands, configuration) may repeat; any other
name that appears in two folders is a reader's trap (``spec.py`` once meant rule specs in one folder and panel
specs in another)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import omniwatch

PER_AREA_ROLES = {"__init__.py", "__main__.py", "api.py", "commands.py", "config.py"}
PKG = Path(omniwatch.__file__).parent


def test_every_module_name_means_one_thing():
    where = defaultdict(list)
    for p in PKG.rglob("*.py"):
        where[p.name].append(str(p.parent.relative_to(PKG)) or ".")
    clashes = {name: dirs for name, dirs in where.items() if len(dirs) > 1 and name not in PER_AREA_ROLES}
    assert not clashes, f"module names used in several folders: {clashes}"


def test_the_demo_is_its_own_subpackage():
    assert (PKG / "demo" / "__init__.py").is_file()
    top = sorted(p.name for p in PKG.glob("demo*.py"))
    assert top == [], f"demo modules outside omniwatch/demo/: {top}"
    assert (PKG / "demo" / "raytasks_rows").is_dir()


# --- the floors (issue 34 item 2): the live path imports nothing of rule authoring, dashboards, backtest or report ---
LIVE = ("server", "app", "web", "core", "remedy_info", "sources", "discovery", "gpu", "agents", "relay",
        "push")   # modules, or subpackages (every module in them)
UPSTAIRS = ("alerting", "dashboards", "backtest", "report", "scorecard", "demo")


def _module(p: Path) -> str:
    parts = ("omniwatch",) + p.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the omniwatch modules it imports, at module level or inside a function, with the packages
    an import runs (their __init__) and ``from pkg import submodule``."""
    import ast
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for m, p in mods.items():
        base = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                mod = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                    else node.module or ""
                names = [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mod, names = "", [a.name for a in node.names]
            else:
                continue
            for target in [mod, *names]:
                parts = target.split(".")
                deps.update(".".join(parts[:k]) for k in range(2, len(parts) + 1) if ".".join(parts[:k]) in mods)
        graph[m] = deps - {m}
    return graph


def reached(graph: dict[str, set[str]], roots) -> dict[str, str | None]:
    """Every module ``roots`` import, transitively -> the module that imports it first (None for a root)."""
    parent, stack = {r: None for r in roots}, list(roots)
    while stack:
        m = stack.pop()
        for d in sorted(graph[m] - parent.keys()):
            parent[d] = m
            stack.append(d)
    return parent


def chain(parent: dict[str, str | None], m: str) -> str:
    """``m <- the module importing it <- ... <- a root``."""
    out = [m]
    while parent[out[-1]] is not None:
        out.append(parent[out[-1]])
    return " <- ".join(out)


def test_the_live_path_imports_nothing_upstairs():
    graph = import_graph()
    roots = [m for m in graph if any(m == f"omniwatch.{r}" or m.startswith(f"omniwatch.{r}.") for r in LIVE)]
    parent = reached(graph, roots)
    bad = [chain(parent, m) for m in parent if m.split(".")[1] in UPSTAIRS]
    assert not bad, "the live path reaches upstairs:\n" + "\n".join(sorted(bad))


# What core/ (parsed steps -> step records and window stats -> the run store -> its series) stands on: the ground
# floor it imports today, transitively, listed one by one.
CORE_FLOOR = ("names", "config", "periodic", "redact", "runlabel", "trainer_config", "yamlio", "remedy_info",
              "prosetext")


def test_core_is_the_inner_floor():
    """Every module of omniwatch.core imports (transitively, inside functions too) only core modules and the ground
    floor above: no source, HTTP area, web layer or app, and nothing upstairs. A new edge out fails here; an edge
    that goes away fails too, so the list shrinks with it."""
    graph = import_graph()
    core = sorted(m for m in graph if m == "omniwatch.core" or m.startswith("omniwatch.core."))
    assert len(core) == 13  # __init__ and the twelve modules of the step chain
    parent = reached(graph, core)
    floor = {f"omniwatch.{g}" for g in CORE_FLOOR}
    bad = [chain(parent, m) for m in sorted(parent.keys() - set(core) - floor)]
    assert not bad, "core reaches past its floor:\n" + "\n".join(bad)
    assert floor <= parent.keys(), f"CORE_FLOOR names modules core no longer imports: {sorted(floor - parent.keys())}"


def test_the_ground_floor_imports_nothing_above_it():
    """names.py and config.py (pure data: metric names, thresholds and the step counts) import no other module of
    the package, so every floor can stand on them (config once imported its step counts from core/analytics.py)."""
    graph = import_graph()
    for g in ("omniwatch.names", "omniwatch.config"):
        assert graph[g] <= {"omniwatch"}, f"{g} imports {sorted(graph[g] - {'omniwatch'})}"


def test_no_import_cycle_between_the_live_areas():
    """gpu reads discovery (the phase vocabulary, the Ray task ledger), not the other way round (app.py wires the
    fleet after both); a node agent serves with httpguard's server, not the exporter's server.py."""
    graph = import_graph()

    def reaches(a: str, b: str) -> list[str]:
        return sorted(f"{m} -> {d}" for m, ds in graph.items() if m.startswith(a) for d in ds if d.startswith(b))
    assert not reaches("omniwatch.discovery", "omniwatch.gpu")
    assert not reaches("omniwatch.agents", "omniwatch.server")


def test_alert_and_rule_classes_have_one_name_each():
    """A rule spec (alerting.rule.AlertSpec), a rule loaded from a rule file (rules.LoadedAlert), the backtest's rule
    (backtest.ruleset.AlertRule, now rules.LoadedAlert too), a webhook's alert (relay.payload.WebhookAlert) and the Alertmanager model's
    (scorecard.amsim.AmAlert) were three ``Alert``s and an ``AlertRule``; and no name left from spec.py's rename."""
    import ast
    where = defaultdict(list)
    for p in PKG.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        assert "spec.py" not in text.replace("rulespec.py", ""), f"{p.relative_to(PKG)} names spec.py"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and ("Alert" in node.name or "Rule" in node.name):
                where[node.name].append(str(p.relative_to(PKG)))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                assert all(a.asname != "spec" for a in node.names), f"{p.relative_to(PKG)} imports a module as spec"
    assert not {c: ps for c, ps in where.items() if len(ps) > 1}
    assert "Alert" not in where and "AlertRule" not in where
