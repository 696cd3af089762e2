"""What ``omniwatch up`` and ``status`` say about the watched paths: a path that does not exist or holds
no run log yet (said loudly; the exporter keeps watching for it), and per watch path the files, runs and
skipped lines the running exporter reports (``GET /api/v1/sources``)."""
from __future__ import annotations

import glob
import os

import httpx

PATTERN = {"watch": "*.jsonl", "console": "*.log"}


def path_problem(path: str, kind: str = "watch") -> str | None:
    """Why ``path`` yields no run log now (None: it does)."""
    if glob.has_magic(path):
        return None if glob.glob(path) else "matches no file yet"
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        pat = PATTERN[kind]
        if not (glob.glob(os.path.join(path, pat)) or glob.glob(os.path.join(path, "*", pat))):
            return f"holds no run log yet (no {pat} in it or in a <project>/ dir under it)"
    return None


def warnings(watch: list[str], console: list[str]) -> list[str]:
    """Lines for stderr, one warning per path that yields no run log now."""
    out = []
    for kind, specs in (("watch", watch), ("console", console)):
        for spec in specs:
            why = path_problem(spec, kind)
            if why:
                out += [f"WARNING: --{kind} {spec}", f"  {why}. The exporter keeps watching for it (verl",
                        "  creates <root>/<project>/<experiment>.jsonl when the run starts). A typo?",
                        f"  Run omniwatch up --{kind} <the right path>: up restarts the exporter with it."]
    return out


def fetch(exporter_url: str, timeout: float = 3.0) -> list[dict] | None:
    """The running exporter's sources; None when it does not answer (or is older and has no endpoint)."""
    try:
        r = httpx.get(f"{exporter_url}/api/v1/sources", timeout=timeout)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def skipped_text(row: dict) -> str:
    """``5 of 8 lines skipped (malformed_json 5)``, or '' when none was."""
    n = sum(row.get("skipped", {}).values())
    if not n:
        return ""
    reasons = ", ".join(f"{r} {c}" for r, c in sorted(row["skipped"].items(), key=lambda x: -x[1]))
    return f"{n} of {row.get('lines', 0)} lines skipped ({reasons})"


def rows(sources: list[dict]) -> list[tuple[str, str]]:
    """(name, value) rows: per watch path the path alone (it may be long), then its state, then what it
    skipped."""
    out = []
    for r in sources:
        kind = "watch" if r["kind"] == "jsonl" else r["kind"]
        if not r["exists"]:
            state = "MISSING: does not exist yet (watched for)"
        elif not r["files"]:
            state = "no run log in it yet (watched for)"
        else:
            state = f"{r['runs']} run(s) with steps, {r['files']} file(s)"
        out += [(kind, r["spec"]), ("", state)]
        skipped = skipped_text(r)
        if skipped:
            out.append(("bad lines", skipped))
            first = r.get("first_bad") or []
            if first:
                out.append(("first bad", f"{first[0]['file']}:{first[0]['line']}"))
    return out
