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
