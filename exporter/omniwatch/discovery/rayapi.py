"""Ray's state API over HTTP (the dashboard's ``/api/v0/tasks`` and ``/api/v0/actors``), bounded and costed.

Why HTTP and not ``ray.util.state``: the same endpoints, without importing Ray into the exporter (a Ray
driver whose cluster goes away blocks; see probe.py) and without a Ray install for ``omniwatch ps``.

Ray 2.58-2.60 filter task events only by ``=`` / ``!=`` (``StateDataSourceClient._build_task_events_request``):
there is no "newer than" filter, and the API server sorts by task id before applying ``limit``. A poll
therefore asks only for what can change — ``state=RUNNING`` (bounded by the workers and requests in
flight, not by the run's history) plus the small FAILED / DEAD sets — and the ledger (taskevents.py)
turns the difference between polls into ended calls. Every answer carries Ray's own count of task
events its GCS dropped (``total - num_after_truncation`` = ``num_status_task_events_dropped``) and
whether our ``limit`` cut the answer (``num_filtered > len(result)``); both are reported, never hidden.

Every call is bounded (issue 35 item 3): a total deadline (``timeout``: a watchdog shuts the call's socket when it
passes, so a dashboard trickling its answer a byte at a time cannot hold a poll), a byte cap (``max_bytes``, 16 MiB: nothing is parsed past it)
and a row cap (a Ray that ignores ``limit`` gets its answer cut at ``limit`` rows and the page is marked
truncated). An error text never carries what the server echoed unredacted (a proxy echoing the
``Authorization`` header): it goes through redact.py first.

Token auth (Ray >= 2.5x default): ``Authorization: Bearer <token>`` from ``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``. The token is never logged or returned.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import orjson

from ..redact import redact
from ..settings import env

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
MAX_ANSWER_BYTES = 16 << 20     # one state-API answer (512 running workers, detailed: ~0.9 MiB)


class RayAPIError(Exception):
    pass


def resolve_address(address: str | None) -> str:
    """``http(s)://host:port`` or ``host:port`` of the Ray dashboard; ``auto``/None: RAY_API_SERVER_ADDRESS,
    an http RAY_ADDRESS, else 127.0.0.1:8265 (``ray start --head``'s default dashboard)."""
    if address in (None, "", "auto"):
        for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
            v = env(var)
            if v and v.startswith(("http://", "https://")):
                return v.rstrip("/")
        v = env("RAY_API_SERVER_ADDRESS")
        return ("http://" + v) if v else DEFAULT_ADDRESS
    return address.rstrip("/") if address.startswith(("http://", "https://")) else "http://" + address


# Ray's CLI finds the dashboard (its API server) through the GCS: the dashboard writes its address into the GCS's
# internal KV (key "dashboard", namespace b"dashboard"), and ``ray.dashboard.utils.ray_address_to_api_server_url``
# reads it with a GcsClient after ``canonicalize_bootstrap_address_or_die`` (Ray 2.60; docs/who-holds-the-step.md).
# Run in a child: a GCS client is Ray's C++ core, and a GCS that does not answer must not hang ``omniwatch ps``.
_GCS_LOOKUP = """
import sys
from ray._private import services
from ray._raylet import GcsClient
addr = services.canonicalize_bootstrap_address_or_die(None if sys.argv[1] == "auto" else sys.argv[1])
v = GcsClient(address=addr).internal_kv_get(b"dashboard", namespace=b"dashboard", timeout=float(sys.argv[2]))
print(addr + " " + (v.decode() if v else ""))
"""


def is_dashboard(base: str, timeout: float = 3.0) -> bool:
    """Does ``base`` answer HTTP as Ray's dashboard does (``GET /api/version``; 401/403: token auth on)?"""
    try:
        with StateAPI(base, timeout=timeout) as api:
            status, raw = api.get("/api/version", max_bytes=64 << 10)
    except RayAPIError:
        return False
    if status in (401, 403):
        return True
    try:
        return status == 200 and isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return False


def dashboard_of(address: str | None, timeout: float = 10.0) -> tuple[str, str]:
    """(the dashboard's URL, how it was found) for any address a Ray user has: a dashboard (``http://…``, or a
    ``host:port`` that answers as one), or Ray's GCS address (what ``ray start`` prints, ``RAY_ADDRESS``), whose
    dashboard is looked up as Ray's CLI does (issue 35 item 15). Raises RayAPIError saying what was tried."""
    import subprocess
    import sys
    if address and address.startswith(("http://", "https://")):
        return address.rstrip("/"), "given"
    gcs = None
    if address in (None, "", "auto"):
        base = resolve_address(address)
        ray_addr = env("RAY_ADDRESS")
        if not env("RAY_API_SERVER_ADDRESS") and ray_addr and "://" not in ray_addr:
            gcs = ray_addr   # RAY_ADDRESS names the GCS, as for Ray's own CLI
        elif not env("RAY_API_SERVER_ADDRESS") and not ray_addr:
            gcs = "auto"     # Ray's autodetection of a local cluster, if the default dashboard does not answer
        if gcs is None or is_dashboard(base, min(timeout, 3.0)):
            return base, "auto"
    else:
        base = resolve_address(address)
        if is_dashboard(base, min(timeout, 3.0)):
            return base, "given"
        gcs = address
        host, _, port = address.rpartition(":")
        try:   # nothing listens there: neither a dashboard nor a GCS (said at once, not after a GCS client's retries)
            socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=min(timeout, 3.0)).close()
        except (OSError, ValueError):
            raise RayAPIError(f"nothing answers at {address} (neither a Ray dashboard nor Ray's GCS)") from None
    try:
        r = subprocess.run([sys.executable, "-c", _GCS_LOOKUP, gcs, str(max(1.0, timeout / 2))], capture_output=True,
                           text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        raise RayAPIError(f"{gcs} is not a Ray dashboard, and Ray's GCS there did not answer within {timeout:g} s") \
            from None
    if r.returncode != 0:
        if "No module named" in r.stderr:
            why = "ray is not installed here to ask it for the dashboard (pip install 'omniwatch[ray]')"
        else:
            why = "Ray's GCS did not name its dashboard: " + redact(" ".join(r.stderr.strip().splitlines()[-1:]))[:200]
        raise RayAPIError(f"{base if gcs == 'auto' else gcs} did not answer as a Ray dashboard; as a GCS address: {why}. "
                          "Pass the dashboard: --ray-address http://<head>:8265")
    got = r.stdout.strip().split()
    if len(got) < 2:
        raise RayAPIError(f"Ray's GCS at {got[0] if got else gcs} names no dashboard (started with "
                          "--include-dashboard=false?); pass --ray-address http://<head>:8265")
    return "http://" + got[1], f"the dashboard Ray's GCS at {got[0]} names"


def _shut(s) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _token() -> str | None:
    tok = env("RAY_AUTH_TOKEN")
    if tok:
        return tok.strip()
    path = env("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(4096).strip() or None
    except OSError:
        return None


@dataclass
class Page:
    rows: list[dict]
    total: int = 0              # Ray: rows at the source + events its GCS dropped
    after_truncation: int = 0   # rows the source returned
    filtered: int = 0           # rows after filtering, before our limit
    warnings: list[str] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return max(0, self.total - self.after_truncation)

    @property
    def truncated(self) -> bool:
        return self.filtered > len(self.rows)


@dataclass
class Cost:
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


class StateAPI:
    """One HTTP client, one total deadline per call, one page-size bound, one byte cap; ``cost`` accumulates
    per call."""

    def __init__(self, address: str | None = None, timeout: float = 5.0, limit: int = 2000,
                 max_bytes: int = MAX_ANSWER_BYTES):
        self.base = resolve_address(address)
        self.timeout = max(0.05, float(timeout))
        self.limit = max(1, min(int(limit), 10000))  # RAY_MAX_LIMIT_FROM_API_SERVER default 10,000
        self.max_bytes = max(1024, int(max_bytes))
        # identity: nothing to inflate (a compressed chunk is inflated whole before the cap sees it)
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        tok = _token()
        if tok:
            headers["Authorization"] = "Bearer " + tok
        # no kept-alive connections: every call connects, so its watchdog knows the socket it must shut
        self._client = httpx.Client(base_url=self.base, headers=headers, trust_env=False,
                                    timeout=httpx.Timeout(self.timeout),
                                    limits=httpx.Limits(max_keepalive_connections=0))
        self.cost = Cost()
        self.cut_answers = 0     # answers over the byte cap or past the deadline (given up)
        self.cut_rows = 0        # rows beyond ``limit`` a Ray ignoring it sent (dropped)

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get(self, path: str, params=None, timeout: float | None = None, max_bytes: int | None = None,
            cut: bool = False):
        """GET ``path`` within the total deadline and the byte cap: (status, body bytes). Raises RayAPIError when
        Ray does not answer in time (a watchdog shuts the connection's socket at the deadline, whatever stage the
        request is in: a head or a body trickled a byte at a time included), answers more than the cap (``cut``:
        its first ``max_bytes`` are returned instead, for text read whole only up to a bound), or not at all."""
        deadline = self.timeout if timeout is None else max(0.05, float(timeout))
        cap = self.max_bytes if max_bytes is None else int(max_bytes)
        t0 = time.monotonic()
        got = 0
        socks: list = []
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            for s in socks:
                _shut(s)

        def trace(name: str, info: dict) -> None:   # httpx's trace extension: the connection's socket
            if name == "connection.connect_tcp.complete" and info.get("return_value") is not None:
                s = info["return_value"].get_extra_info("socket")
                if s is not None:
                    socks.append(s)
                    if expired.is_set():
                        _shut(s)

        timer = threading.Timer(deadline, kill)
        timer.daemon = True
        timer.start()
        try:
            with self._client.stream("GET", path, params=params, extensions={"trace": trace},
                                     timeout=httpx.Timeout(deadline)) as r:
                chunks = []
                for chunk in r.iter_bytes():
                    got += len(chunk)
                    if got > cap and cut:
                        chunks.append(chunk[: len(chunk) - (got - cap)])
                        return r.status_code, b"".join(chunks)
                    if got > cap:
                        self.cut_answers += 1
                        raise RayAPIError(f"Ray at {self.base}: the answer to {path} is over {cap >> 10} KiB; "
                                          "given up (not parsed)")
                    chunks.append(chunk)
                if expired.is_set():
                    raise httpx.ReadError("deadline")
                return r.status_code, b"".join(chunks)
        except httpx.HTTPError as e:
            if expired.is_set():
                self.cut_answers += 1
                raise RayAPIError(f"Ray at {self.base} did not finish answering {path} within {deadline:g} s; "
                                  "given up") from None
            raise RayAPIError(f"Ray at {self.base} did not answer: {type(e).__name__}") from None
        finally:
            timer.cancel()
            self.cost.calls += 1
            self.cost.bytes += got
            self.cost.seconds += time.monotonic() - t0

    def list(self, kind: str, filters: list[tuple[str, str, str]] = (), limit: int | None = None,
             detail: bool = False) -> Page:
        limit = max(1, min(int(limit or self.limit), 10000))
        params: list[tuple[str, str]] = [("limit", str(limit)), ("timeout", str(max(1, int(self.timeout)))),
                                         ("detail", "true" if detail else "false")]
        for k, p, v in filters:
            params += [("filter_keys", k), ("filter_predicates", p), ("filter_values", v)]
        try:
            status, raw = self.get(f"/api/v0/{kind}", params)
        except RayAPIError as e:
            raise RayAPIError(str(e).replace("Ray at", "Ray state API at", 1)) from None
        if status in (401, 403):
            raise RayAPIError(f"Ray state API at {self.base} refused the request (HTTP {status}): "
                              "token authentication is on; set RAY_AUTH_TOKEN or ~/.ray/auth_token")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RayAPIError(f"Ray state API at {self.base}: HTTP {status}, not JSON") from None
        page = parse_page(body, status, self.base)
        if len(page.rows) > limit:   # a Ray (or a proxy) that ignores the page size: cut, and say the page was cut
            self.cut_rows += len(page.rows) - limit
            page.filtered = max(page.filtered, len(page.rows))
            del page.rows[limit:]
        return page


def parse_page(body, status: int = 200, where: str = "Ray state API") -> Page:
    """The dashboard's list answer (``{"result": true, "data": {"result": {total, num_after_truncation,
    num_filtered, result: [...], warnings}}}``) -> Page; anything else raises RayAPIError."""
    data = (body.get("data") or {}).get("result") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, dict):
        msg = body.get("msg", "") if isinstance(body, dict) else ""
        msg = " ".join(redact(str(msg)[:2000]).split())[:200]   # one line, no secret the server echoed
        raise RayAPIError(f"Ray state API at {where}: HTTP {status} {msg}".rstrip())
    rows = data.get("result") or []
    if not isinstance(rows, list):
        raise RayAPIError(f"Ray state API at {where}: the rows are not a list")
    try:
        return Page([x for x in rows if isinstance(x, dict)], int(data.get("total") or 0),
                    int(data.get("num_after_truncation") or 0), int(data.get("num_filtered") or 0),
                    [str(w)[:200] for w in (data.get("warnings") or [])])
    except (TypeError, ValueError):
        raise RayAPIError(f"Ray state API at {where}: counts are not numbers") from None
