"""The ``omniwatch`` command. Each area registers its subcommands through ``add_commands(sub)`` in its
own module; AREAS lists them, so the CLI grows without one file holding it all.

Imports are lazy: ``omniwatch --help`` imports no area (the grouped list below is all it prints), and
``omniwatch COMMAND`` imports only the area that registers COMMAND. COMMANDS names, for each command, its
area, its group in the help and its one-line help; ``tests/test_cli_shape.py`` checks it against what
the areas register."""
from __future__ import annotations

import argparse
import logging
import sys

from . import __version__

# area modules, each with add_commands(sub)
AREAS = ("server", "stack", "demo", "rules", "docsgen", "relay", "dashboards", "backtest", "report", "discovery",
         "raytasks", "agents", "export", "compose", "generated", "scorecard")

GROUPS = {
    "run": "run omniwatch beside training",
    "inspect": "look at runs and alerts",
    "maintain": "maintain omniwatch itself (generated files, exports)",
}
# command -> (area, group, help)
COMMANDS = {
    "up": ("stack", "run", "start Prometheus, Alertmanager and the exporter here (make up)"),
    "status": ("stack", "run", "what runs, what is watched, runs and bad lines per watched path"),
    "down": ("stack", "run", "stop what `omniwatch up` and `omniwatch demo` started"),
    "demo": ("demo", "run", "the stack + simulated FlowGRPO runs that trip every core alert (make demo)"),
    "serve": ("server", "run", "the exporter alone, in the foreground (up runs it for you)"),
    "agents": ("agents", "run", "cluster: start/status/stop one node agent per Ray node"),
    "agent": ("agents", "run", "cluster: run one node agent on this node (what `agents start` places)"),
    "alerts": ("relay", "inspect", "alerts received and their delivery to Slack/Feishu/webhooks"),
    "report": ("report", "inspect", "a run's GPU-hours ledger and verdict as a shareable HTML page"),
    "compare": ("report", "inspect", "two runs side by side: did the fix pay off?"),
    "backtest": ("backtest", "inspect", "which alerts would have fired on a finished run, at which steps"),
    "backfill": ("backtest", "inspect", "load a finished run into Prometheus for the dashboards"),
    "replay": ("backtest", "inspect", "feed a recorded run to the live stack"),
    "discover": ("discovery", "inspect", "what Ray discovery finds (TransferQueue, vLLM-Omni, reward, nodes)"),
    "ps": ("raytasks", "inspect", "who holds the step: phase in progress, slowest worker, replicas, dead actors (Ray task events)"),
    "generate": ("generated", "maintain", "write every generated file (--check: fail on drift)"),
    "scorecard": ("scorecard", "maintain", "how well the alerts detect: backtest the public corpus, count notifications per fault (make scorecard)"),
    "rules": ("rules", "maintain", "alert rules: generate | sync | check"),
    "dashboards": ("dashboards", "maintain", "dashboards: generate | check | verify | render"),
    "docs": ("docsgen", "maintain", "regenerate the generated docs tables"),
    "export": ("export", "maintain", "PrometheusRule / ConfigMaps for Kubernetes"),
    "compose": ("compose", "maintain", "docker compose configs: render | check | secrets"),
}

DESCRIPTION = ("Observability for VeRL-Omni diffusion RL training: the exporter, a native Prometheus/Alertmanager "
               "stack, alert rules, dashboards and reports.")


class Parser(argparse.ArgumentParser):
    """A bad flag is one line naming the flag and the help to read, not the whole usage (every
    subcommand's parser is this class too: argparse makes subparsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def grouped_help() -> str:
    out = []
    for group, title in GROUPS.items():
        out.append(f"{group}: {title}")
        out += [f"  {name:<11} {hlp}" for name, (_, g, hlp) in COMMANDS.items() if g == group]
        out.append("")
    out.append("`omniwatch COMMAND --help` shows a command's flags.")
    return "\n".join(out)


def _area(name: str):
    """The area module ``name``, imported only now (an explicit import per area: no module by name)."""
    if name == "server":
        from . import server as area
    elif name == "stack":
        from . import stack as area
    elif name == "demo":
        from . import demo as area
    elif name == "rules":
        from . import rules as area
    elif name == "docsgen":
        from . import docsgen as area
    elif name == "relay":
        from . import relay as area
    elif name == "dashboards":
        from . import dashboards as area
    elif name == "backtest":
        from . import backtest as area
    elif name == "report":
        from . import report as area
    elif name == "discovery":
        from . import discovery as area
    elif name == "raytasks":
        from .discovery import ps as area
    elif name == "agents":
        from . import agents as area
    elif name == "export":
        from . import export as area
    elif name == "compose":
        from . import compose as area
    elif name == "generated":
        from . import generated as area
    elif name == "scorecard":
        from . import scorecard as area
    else:
        raise KeyError(name)
    return area


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The parser with every area's commands (``command`` "*"), with only the area of ``command``, or, for
    an unknown or absent command, with the command names alone (no area imported)."""
    p = Parser(prog="omniwatch", description=DESCRIPTION, epilog=grouped_help(),
               usage="omniwatch [-h] [--version] [--log-level LEVEL] COMMAND ...",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"omniwatch {__version__}")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog="omniwatch")
    if command == "*":
        for area in AREAS:
            _area(area).add_commands(sub)
    elif command in COMMANDS:
        _area(COMMANDS[command][0]).add_commands(sub)
    else:
        for name, (_, _, hlp) in COMMANDS.items():
            sub.add_parser(name, help=hlp)
    return p


def command_in(argv: list[str]) -> str | None:
    """The command word of ``argv`` (the first word that is not a top-level flag or its value)."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--log-level":
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except Exception as e:
        if type(e).__name__ == "ConfigFileError":  # config.load (imported lazily)
            print(f"omniwatch: {e}", file=sys.stderr)
            return 2
        if type(e).__name__ != "ValidationError" or not type(e).__module__.startswith("pydantic"):
            raise
        # a setting from OMNIWATCH_* or the settings file that does not parse (pydantic imported lazily)
        bad = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:3])
        print(f"omniwatch: bad setting (OMNIWATCH_* environment or settings file): {bad}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_in(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from .redact import install_log_redaction
    install_log_redaction()  # no handler writes a credential (serve installs it again on uvicorn's)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
