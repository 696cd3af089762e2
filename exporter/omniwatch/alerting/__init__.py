"""Alert rules as code: one typed configuration (``config.py``), the rules and their prose (``rulespec.py``),
the remedy per run layout (``remedies.py``), rendered into ``alerts/`` by ``omniwatch rules generate``
(``rulegen.py``, YAML by ``rulefiles.py``). The promtool tests in ``alerts/tests/`` are hand-written literal YAML, not rendered here."""
