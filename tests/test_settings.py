"""One typed settings object: flags over OMNIWATCH_* environment (and *_FILE secrets) over a settings file
over defaults, and no module but settings.py reads the process environment."""
from __future__ import annotations

import ast

from omniwatch.settings import DEFAULT_EXPORTER_PORT, Settings

from conftest import REPO


def test_precedence_flag_over_environment_over_file_over_default(tmp_path, monkeypatch):
    f = tmp_path / "omniwatch.yml"
    f.write_text("port: 20001\nwindow_steps: 5\npoll_seconds: 2.5\nrun_dir: /from/file\n")
    monkeypatch.setenv("OMNIWATCH_CONFIG", str(f))
    assert Settings().port == 20001 and Settings().window_steps == 5                     # file over default
    monkeypatch.setenv("OMNIWATCH_PORT", "20002")
    monkeypatch.setenv("OMNIWATCH_WINDOW_STEPS", "7")
    s = Settings()
    assert (s.port, s.window_steps, s.poll_seconds) == (20002, 7, 2.5)                   # environment over file
    s = Settings.load(port=20003, window_steps=None)
    assert (s.port, s.window_steps) == (20003, 7)                                        # a flag over all; unset flags do not count
    assert Settings.load().max_keys == Settings.model_fields["max_keys"].default          # default
    monkeypatch.delenv("OMNIWATCH_CONFIG")
    monkeypatch.delenv("OMNIWATCH_PORT")
    assert Settings().port == DEFAULT_EXPORTER_PORT


def test_secrets_come_from_the_environment_or_a_file_never_needing_argv(tmp_path, monkeypatch):
    tok = tmp_path / "push.token"
    tok.write_text("from-file\n")
    monkeypatch.setenv("OMNIWATCH_PUSH_TOKEN_FILE", str(tok))
    assert Settings().push_token == "from-file"
    monkeypatch.setenv("OMNIWATCH_PUSH_TOKEN", "from-env")
    assert Settings().push_token == "from-env"                                          # the plain variable wins
    monkeypatch.setenv("OMNIWATCH_GRAFANA_ADMIN_PASSWORD", "s3cret")
    assert "s3cret" not in repr(Settings())                                              # never printed


def test_the_exporter_port_and_its_old_spelling():
    assert Settings.load(exporter_port=20010).port == 20010
    assert Settings.load(port=20011).port == 20011


def test_no_module_but_settings_reads_the_environment():
    """os.environ / os.getenv / os.putenv appear only in omniwatch/settings.py."""
    bad = []
    for path in sorted((REPO / "exporter" / "omniwatch").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "omniwatch":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb"):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                    any(a.name in ("environ", "getenv", "putenv") for a in node.names):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, bad
