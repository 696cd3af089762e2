"""The live path's step chain: parsed steps (``parse``) -> per-step records and window statistics (``analytics``,
``shift``, ``signals``, ``phasetable``) -> the run store (``model``, ``ledger``, ``planned``) and its checkpoint
(``state``, ``statefile``, ``statelock``) -> its series (``exposition``).

The floor: core imports other core modules and the ground floor only (``names``, ``config``, ``periodic``,
``redact``, ``runlabel``, ``trainer_config``, ...; tests/test_layout.py lists them), never a source, an HTTP area,
the web layer or anything upstairs (rule authoring, dashboards, backtest, report, scorecard, demo)."""
