"""The ``omniwatch`` command. Each area registers its subcommands through ``add_commands(sub)`` in its
own module; AREAS lists them, so the CLI grows without one file holding it all."""
from __future__ import annotations

import argparse
import logging
import sys

from . import (__version__, agents, backtest, compose, dashboards, demo, discovery, docsgen, export, generated, relay,
               report, rules, server, stack)
from .discovery import ps as raytasks
from .redact import install_log_redaction

AREAS = (
    server,      # serve
    stack,       # up, down, status
    demo,        # demo
    rules,       # rules generate|sync|check
    docsgen,     # docs
    relay,       # alerts
    dashboards,  # dashboards generate|check|verify|render
    backtest,    # replay, backfill, backtest
    report,      # report, compare
    discovery,   # discover
    raytasks,    # ps
    agents,      # agent, agents start|status|stop
    export,      # export rules|dashboards|k8s
    compose,     # compose render|check|secrets
    generated,   # generate [--check]: every generated file at once
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omniwatch", description="Observability for VeRL-Omni diffusion RL training: the "
                                "exporter, a native Prometheus/Alertmanager stack, alert rules, dashboards and reports.")
    p.add_argument("--version", action="version", version=f"omniwatch {__version__}")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for area in AREAS:
        area.add_commands(sub)
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
