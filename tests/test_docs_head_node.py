"""What the README and docs tell a newcomer on a head node (issue 27 items 4, 6, 10): the verl override keeps
W&B, the first screen says what omniwatch is, no page sends the reader to files outside the repository,
and no page advertises a URL that shows no page."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = {p.relative_to(REPO).as_posix(): p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}

# VeRL-Omni's default trainer.logger (diffusion_trainer.yaml L139 at a1139baf; docs/verl-source.md E16)
VERL_OMNI_DEFAULT_LOGGER = ["console", "wandb"]


def test_every_logger_override_keeps_the_default_backends_and_adds_file():
    overrides = [(page, m.group(1)) for page, text in DOCS.items()
                 if page != "docs/verl-source.md"  # it quotes the override that turns W&B off
                 for m in re.finditer(r"trainer\.logger='?=?'?\[([a-z_,]+)\]", text)]
    assert overrides, "no trainer.logger override in the docs"
    first = {page: backends for page, backends in reversed(overrides)}  # each page's first override
    for page, backends in first.items():
        names = backends.split(",")
        assert "file" in names and all(b in names for b in VERL_OMNI_DEFAULT_LOGGER), (page, backends)
    assert "`logger: [\"console\", \"wandb\"]`" in DOCS["docs/verl-source.md"]


def test_the_first_screen_is_the_two_commands_then_what_omniwatch_is_then_timings():
    lines = README.splitlines()
    # the first block is the two commands, and each is a target of the Makefile (what they do is the Makefile's)
    assert lines[:3] == ["# omniwatch", "", "```bash"] and lines[5] == "```", lines[:6]
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))
    assert [line.split()[:2] for line in lines[3:5]] == [["make", "demo"], ["make", "test"]] and {"demo", "test"} <= targets
    first_screen = "\n".join(lines[:24])
    assert "omniwatch watches **VeRL-Omni diffusion RL training**" in first_screen
    assert "minutes" not in first_screen  # the test timings come later (## Tests)
    assert README.index("## Tests") > README.index("## Beside a real run")


def test_no_page_cites_files_outside_the_repository():
    for page, text in DOCS.items():
        assert "shared/reference" not in text and "shared/seeds" not in text, page
        assert not re.search(r"\((endpoints|metrics)\.md §", text), page


def test_no_page_advertises_the_alertmanager_web_page():
    """Debian's prometheus-alertmanager serves the API but no web UI: the docs name `omniwatch alerts`."""
    for page, text in DOCS.items():
        for m in re.finditer(r"http://127\.0\.0\.1:19093(/[^\s`)]*)?", text):
            assert (m.group(1) or "").startswith("/api/"), (page, m.group(0))
    assert "omniwatch alerts" in README
