"""docs/architecture.md's package map names every module of the package (a new module gets a row)."""
from __future__ import annotations

import re
from pathlib import Path

import omniwatch

PKG = Path(omniwatch.__file__).resolve().parent
DOCS = PKG.parents[1] / "docs"


def test_the_package_map_names_every_module_and_package():
    text = (DOCS / "architecture.md").read_text()
    table = text[text.index("## Package map"):text.index("## Configuration and generated files")]
    named = set(re.findall(r"`([a-z_]+(?:\.py|/))`", table))
    have = {p.name for p in PKG.glob("*.py") if not p.name.startswith("__")}
    have |= {p.name + "/" for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert have - named == set(), f"modules missing from docs/architecture.md's package map: {sorted(have - named)}"
    stale = {x for x in named - have if not any(PKG.rglob(x.rstrip("/")))}
    assert stale == set(), f"the package map names modules that do not exist: {sorted(stale)}"


def test_the_configuration_page_is_linked_and_names_the_precedence():
    text = (DOCS / "configuration.md").read_text()
    text = text[text.index("Precedence"):]
    order = [text.index(x) for x in ("command-line flags", "environment variables", "a settings file", "the defaults")]
    assert order == sorted(order)
    assert "configuration.md" in (DOCS / "architecture.md").read_text()
    assert "configuration.md" in (PKG.parents[1] / "README.md").read_text()
