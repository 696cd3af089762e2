"""The one Prometheus HTTP API client: the backtest's temporary Prometheus, ``omniwatch report
--prometheus``, dashboard verification/rendering and the tests read Prometheus through it.

Requests are POSTed as forms (long PromQL fits), bounded by a timeout, never through a proxy from the
environment (``trust_env=False``: the servers are local). Any failure — connection, HTTP status, a body
that is not JSON, ``status != "success"`` — is one :class:`PromError` naming the path and the query.
"""
from __future__ import annotations

from typing import Any

import httpx

MAX_POINTS = 10_000  # per series per range request; Prometheus refuses more than 11,000


class PromError(RuntimeError):
    """A Prometheus API call that did not succeed."""


class PromAPI:
    def __init__(self, url: str, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "PromAPI":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ready(self, timeout: float = 2.0) -> bool:
        try:
            return self._client.get("/-/ready", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def data(self, path: str, params: dict | None = None, method: str = "POST") -> Any:
        """``data`` of a successful API response (POST as a form, or GET for GET-only endpoints)."""
        params = params or {}
        what = f"Prometheus {self.url}{path}"
        if params.get("query"):
            what += f" {str(params['query'])[:80]!r}"
        try:
            if method == "GET":
                r = self._client.get(path, params=params)
            else:
                r = self._client.post(path, data=params)
        except httpx.HTTPError as e:
            raise PromError(f"{what}: {type(e).__name__}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            raise PromError(f"{what}: HTTP {r.status_code}: {r.text[:200]}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise PromError(f"{what}: {err or f'HTTP {r.status_code}'}")
        return body.get("data")

    def query_data(self, expr: str, t: float | None = None) -> dict:
        """The instant query's ``data`` (``resultType`` and ``result``)."""
        params = {"query": expr} if t is None else {"query": expr, "time": f"{t:.3f}"}
        return self.data("/api/v1/query", params)

    def query(self, expr: str, t: float | None = None) -> list[dict]:
        return self.query_data(expr, t)["result"]

    def query_range_data(self, expr: str, start: float, end: float, step: float) -> dict:
        """One range request's ``data`` (at most MAX_POINTS points per series)."""
        return self.data("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """Matrix over [start, end] at ``step``, fetched in chunks Prometheus accepts; series merged by
        label set, points in time order."""
        merged: dict[tuple, dict] = {}
        t = start
        while t <= end:
            chunk_end = min(end, t + step * (MAX_POINTS - 1))
            for s in self.query_range_data(expr, t, chunk_end, step)["result"]:
                key = tuple(sorted(s["metric"].items()))
                merged.setdefault(key, {"metric": s["metric"], "values": []})["values"].extend(s["values"])
            t = chunk_end + step
        return list(merged.values())

    def label_values(self, label: str, match: str) -> list[str]:
        return self.data(f"/api/v1/label/{label}/values", {"match[]": match}, method="GET")

    def get(self, path: str) -> Any:
        """``data`` of a GET-only endpoint (``/api/v1/alerts``, ``/api/v1/rules``, ``/api/v1/targets``)."""
        return self.data(path, method="GET")
