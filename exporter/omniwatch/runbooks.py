"""``GET /runbooks``: docs/runbooks.md as one HTML page, served by the exporter itself, so every alert's
``runbook_url`` (``<runbook_base>#<alertname lower-cased>``, default the exporter's own address) opens
without internet. Headings get GitHub-style anchors; markdown is rendered by markdown-it-py (CommonMark
+ tables), raw HTML in the source is escaped."""
from __future__ import annotations

import html
import re
from functools import lru_cache

from markdown_it import MarkdownIt

from . import paths

STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
         "code,pre{background:#f4f4f4;border-radius:3px}pre{padding:.6rem;overflow:auto}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem}"
         "h2{border-top:1px solid #ddd;padding-top:1rem}:target{background:#fff6d5}")


def anchor(heading: str) -> str:
    """GitHub's heading anchor: lower-cased, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _heading_ids(md: MarkdownIt) -> None:
    def rule(state):
        toks = state.tokens
        for i, tok in enumerate(toks):
            if tok.type == "heading_open" and i + 1 < len(toks):
                tok.attrSet("id", anchor(toks[i + 1].content))
    md.core.ruler.push("heading_ids", rule)


@lru_cache(maxsize=1)
def render() -> str:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    _heading_ids(md)
    body = md.render(paths.docs_file("runbooks.md").read_text(encoding="utf-8"))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>omniwatch runbooks</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def page() -> str:
    try:
        return render()
    except OSError as e:
        return f"<!doctype html><p>runbooks not available: {html.escape(str(e))}</p>"
