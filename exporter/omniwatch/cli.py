"""The ``omniwatch`` command. Each area registers its subcommands through ``add_commands(sub)`` in its
own module; AREAS lists them, so the CLI grows without one file holding it all."""
from __future__ import annotations

import argparse
import logging
import sys

from . import (__version__, agents, backtest, compose, dashboards, demo, discovery, docsgen, export, generated, relay,
               report, rules, server, stack)
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
    agents,      # agent, agents start|status|stop
    export,      # export rules|dashboards|k8s
    compose,     # compose render|check|secrets
    generated,   # generate [--check]: every generated file at once
)


class Parser(argparse.ArgumentParser):
    """A bad flag is one line naming the flag and the help to read, not the whole usage (every
    subcommand's parser is this class too: argparse makes subparsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="omniwatch", description="Observability for VeRL-Omni diffusion RL training: the "
                                "exporter, a native Prometheus/Alertmanager stack, alert rules, dashboards and reports.")
    p.add_argument("--version", action="version", version=f"omniwatch {__version__}")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for area in AREAS:
        area.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError
    try:
        return _main(argv)
    except ValidationError as e:  # a setting from OMNIWATCH_* or the settings file that does not parse
        bad = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:3])
        print(f"omniwatch: bad setting (OMNIWATCH_* environment or settings file): {bad}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
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
