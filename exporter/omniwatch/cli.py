"""The ``omniwatch`` command. Each area registers its subcommands through ``add_commands(sub)``
in its own module (listed in COMMAND_MODULES), so the CLI grows without one file holding it all."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .redact import install_log_redaction

COMMAND_MODULES = [
    "omniwatch.server",      # serve
    "omniwatch.stack",       # up, down, status
    "omniwatch.demo",        # demo
    "omniwatch.rules",       # rules sync / rules check
    "omniwatch.docsgen",     # docs
    "omniwatch.relay",       # alerts
    "omniwatch.dashboards",  # dashboards generate|check|verify|render
    "omniwatch.backtest",    # replay, backfill, backtest
    "omniwatch.report",      # report, compare
    "omniwatch.discovery",   # discover
    "omniwatch.agents",      # agent, agents start|status|stop
    "omniwatch.export",      # export rules|dashboards|k8s
    "omniwatch.compose",     # compose render|check|secrets
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omniwatch", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=f"omniwatch {__version__}")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for modname in COMMAND_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue  # area not built yet
            raise
        mod.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    install_log_redaction()  # no handler writes a credential (serve installs it again on uvicorn's)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
