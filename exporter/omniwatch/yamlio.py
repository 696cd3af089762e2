"""YAML read with libyaml's safe loader (``CSafeLoader``) when PyYAML's wheel has it, else PyYAML's pure-Python
``SafeLoader``: the same safe tag set, ~10x less CPU. A 1,500-rule file took 0.35 s per read with SafeLoader; the
rule model, the drift check and the promtool mutation tests read it many times. Writing stays with ``yaml.safe_dump``
(its output is what the generated files are drift-checked against)."""
from __future__ import annotations

import yaml

SafeLoader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


def load(stream):
    """``yaml.safe_load`` with the fastest safe loader there is."""
    return yaml.load(stream, Loader=SafeLoader)   # noqa: S506 (a safe loader)
