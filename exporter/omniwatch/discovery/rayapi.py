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

Token auth (Ray >= 2.5x default): ``Authorization: Bearer <token>`` from ``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``. The token is never logged or returned.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import httpx

from ..settings import env

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


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
    """One HTTP client, one timeout, one page-size bound; ``cost`` accumulates per call."""

    def __init__(self, address: str | None = None, timeout: float = 5.0, limit: int = 2000):
        self.base = resolve_address(address)
        self.timeout = timeout
        self.limit = max(1, min(int(limit), 10000))  # RAY_MAX_LIMIT_FROM_API_SERVER default 10,000
        headers = {"Accept": "application/json"}
        tok = _token()
        if tok:
            headers["Authorization"] = "Bearer " + tok
        self._client = httpx.Client(base_url=self.base, timeout=timeout, headers=headers, trust_env=False)
        self.cost = Cost()

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def list(self, kind: str, filters: list[tuple[str, str, str]] = (), limit: int | None = None,
             detail: bool = False) -> Page:
        params: list[tuple[str, str]] = [("limit", str(limit or self.limit)), ("timeout", str(max(1, int(self.timeout)))),
                                         ("detail", "true" if detail else "false")]
        for k, p, v in filters:
            params += [("filter_keys", k), ("filter_predicates", p), ("filter_values", v)]
        t0 = time.monotonic()
        try:
            r = self._client.get(f"/api/v0/{kind}", params=params)
        except httpx.HTTPError as e:
            raise RayAPIError(f"Ray state API at {self.base} did not answer: {type(e).__name__}") from None
        finally:
            self.cost.calls += 1
            self.cost.seconds += time.monotonic() - t0
        self.cost.bytes += len(r.content)
        if r.status_code in (401, 403):
            raise RayAPIError(f"Ray state API at {self.base} refused the request (HTTP {r.status_code}): "
                              "token authentication is on; set RAY_AUTH_TOKEN or ~/.ray/auth_token")
        try:
            body = r.json()
        except ValueError:
            raise RayAPIError(f"Ray state API at {self.base}: HTTP {r.status_code}, not JSON") from None
        return parse_page(body, r.status_code, self.base)


def parse_page(body, status: int = 200, where: str = "Ray state API") -> Page:
    """The dashboard's list answer (``{"result": true, "data": {"result": {total, num_after_truncation,
    num_filtered, result: [...], warnings}}}``) -> Page; anything else raises RayAPIError."""
    data = (body.get("data") or {}).get("result") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, dict):
        msg = str(body.get("msg", ""))[:200] if isinstance(body, dict) else ""
        raise RayAPIError(f"Ray state API at {where}: HTTP {status} {msg}".rstrip())
    rows = data.get("result") or []
    try:
        return Page([x for x in rows if isinstance(x, dict)], int(data.get("total") or 0),
                    int(data.get("num_after_truncation") or 0), int(data.get("num_filtered") or 0),
                    [str(w)[:200] for w in (data.get("warnings") or [])])
    except (TypeError, ValueError):
        raise RayAPIError(f"Ray state API at {where}: counts are not numbers") from None
