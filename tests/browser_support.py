"""A real browser for the report pages: Debian's headless ``chromium`` driven over the DevTools protocol
(CDP) with the ``websockets`` client — no browser download, no driver.

:func:`check_page` opens a page from disk and returns what a person's browser would show and do: every
console error and uncaught exception, every network request the page made (a self-contained page makes
none), and how many of its charts drew (each Bokeh root holds at least one canvas with pixels on it).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import skip_optional

ENABLE = "apt-get install -y chromium"

# Counts the Bokeh roots (one per chart: the divs of bokeh.embed.components) whose subtree — shadow roots
# included — holds a canvas with at least two distinct pixel values (a drawn chart, not a blank box).
DRAWN_JS = r"""
(() => {
  const canvases = (node, out) => {
    if (!node) return out;
    if (node.tagName === 'CANVAS') out.push(node);
    if (node.shadowRoot) canvases(node.shadowRoot, out);
    for (const c of node.children || []) canvases(c, out);
    return out;
  };
  const drawn = (c) => {
    if (!c.width || !c.height) return false;
    let d;
    try { d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; } catch (e) { return false; }
    const first = d[0] + ',' + d[1] + ',' + d[2] + ',' + d[3];
    for (let i = 4; i < d.length; i += 4 * 7) {
      if (d[i] + ',' + d[i + 1] + ',' + d[i + 2] + ',' + d[i + 3] !== first) return true;
    }
    return false;
  };
  const roots = Array.from(document.querySelectorAll('[data-root-id]'));
  const meta = document.querySelector('meta[name="omniwatch-charts"]');
  return JSON.stringify({roots: roots.length, drawn: roots.filter(r => canvases(r, []).some(drawn)).length,
                         expected: meta ? parseInt(meta.content) : -1});
})()
"""


@dataclass
class PageCheck:
    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    charts_expected: int = -1
    charts_roots: int = 0
    charts_drawn: int = 0
    load_seconds: float = 0.0


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    if os.environ.get("OMNIWATCH_REQUIRE_CHROMIUM") == "1":  # .ci/run installs it: missing is a failure there
        import pytest
        pytest.fail(f"chromium is not on PATH (OMNIWATCH_REQUIRE_CHROMIUM=1): {ENABLE}")
    skip_optional("chromium is not installed (the report's browser tests need it)", ENABLE)


class Browser:
    """One headless chromium for a test session; ``check(path)`` opens a page in a fresh tab."""

    def __init__(self):
        from websockets.sync.client import connect
        self.tmp = tempfile.mkdtemp(prefix="omniwatch-chromium-")
        self.proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={self.tmp}", "--window-size=1100,1400", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        url = self._devtools_url()
        self._conn = connect(url, max_size=64 << 20, open_timeout=30)
        self.ws = self._conn.__enter__()
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def _devtools_url(self) -> str:
        deadline = time.monotonic() + 60
        buf = b""
        os.set_blocking(self.proc.stderr.fileno(), False)
        while time.monotonic() < deadline:
            chunk = self.proc.stderr.read() or b""
            buf += chunk
            m = re.search(rb"DevTools listening on (ws://\S+)", buf)
            if m:
                return m[1].decode()
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {buf[-500:].decode(errors='replace')}")
            time.sleep(0.1)
        raise RuntimeError("chromium did not print its DevTools URL within 60 s")

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        mid = next(self.ids)
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if m.get("id") == mid:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)
        raise TimeoutError(method)

    def _pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=max(0.05, deadline - time.monotonic()))))
            except TimeoutError:
                return

    def check(self, path: str | Path, timeout: float = 60) -> PageCheck:
        url = Path(path).resolve().as_uri()
        res = PageCheck(url)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            for m in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
                self.send(m, session=session)
            self.events.clear()
            t0 = time.monotonic()
            self.send("Page.navigate", {"url": url}, session=session)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if any(e.get("method") == "Page.loadEventFired" and e.get("sessionId") == session for e in self.events):
                    break
                self._pump(0.2)
            while time.monotonic() < deadline:  # charts draw after load
                r = self.send("Runtime.evaluate", {"expression": DRAWN_JS, "returnByValue": True}, session=session)
                d = json.loads(r["result"]["value"])
                res.charts_expected, res.charts_roots, res.charts_drawn = d["expected"], d["roots"], d["drawn"]
                if d["drawn"] >= max(1, d["expected"]) or d["expected"] == 0:
                    break
                self._pump(0.3)
            res.load_seconds = time.monotonic() - t0
            self._pump(0.5)
            for e in self.events:
                if e.get("sessionId") != session:
                    continue
                m, p = e.get("method"), e.get("params", {})
                if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    res.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
                elif m == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    res.console_errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
                elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    res.console_errors.append(p["entry"].get("text", ""))
                elif m == "Network.requestWillBeSent":
                    u = p.get("request", {}).get("url", "")
                    if u != url and not u.startswith(("data:", "blob:")):
                        res.requests.append(u)
        finally:
            self.send("Target.closeTarget", {"targetId": target})
        return res

    def close(self) -> None:
        try:
            self._conn.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - the browser may already be gone
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def screenshot(page: str | Path, png: str | Path, height: int = 2600, width: int = 1100) -> None:
    """What a person sees: ``chromium --headless=new --screenshot`` of the page (docs/img)."""
    subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", "--virtual-time-budget=15000",
                    f"--screenshot={Path(png).resolve()}", Path(page).resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
