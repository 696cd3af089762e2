"""Alert rules as code: one typed configuration (``config.py``), the rules and their prose (``spec.py``),
the remedy per run layout (``remedies.py``), the promtool tests (``promtests.py``), rendered into
``alerts/`` by ``omniwatch rules generate`` (``generate.py``)."""
