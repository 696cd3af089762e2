"""The CLI's shape (issue 27 item 9): the help groups commands into run / inspect / maintain, `--help`
imports no area (fast), each command is registered by the area the table names, and commands take no flag
they ignore (`down` and `status` read the pid files and stack.json: no port flags)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from omniwatch import cli


def _choices(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


def test_the_table_names_every_command_the_areas_register_and_nothing_else():
    assert set(_choices(cli.build_parser("*"))) == set(cli.COMMANDS)
    for name, (area, group, _) in cli.COMMANDS.items():
        assert name in _choices(cli.build_parser(name)), (name, area)
        assert group in cli.GROUPS


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser(name).parse_args([name, "--help"])
    assert e.value.code == 0 and f"usage: omniwatch {name}" in capsys.readouterr().out


def test_top_level_help_is_grouped_and_imports_no_area():
    code = ("import sys\nfrom omniwatch import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', sorted(m for m in sys.modules if m.startswith(('omniwatch.', 'fastapi', 'pydantic', "
            "'httpx', 'rich', 'numpy'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "MODULES ['omniwatch.cli']", r.stdout.splitlines()[-1]
    text = r.stdout
    for group in ("run:", "inspect:", "maintain:"):
        assert f"\n{group} " in text, text
    assert text.index("\nrun:") < text.index("  up ") < text.index("\ninspect:") < text.index("  report ") \
        < text.index("\nmaintain:") < text.index("  generate ")


@pytest.mark.parametrize("command", ["down", "status"])
def test_down_and_status_take_no_port_flags(command):
    r = subprocess.run([sys.executable, "-m", "omniwatch", command, "--exporter-port", "19195"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --exporter-port 19195" in r.stderr, r.stderr
