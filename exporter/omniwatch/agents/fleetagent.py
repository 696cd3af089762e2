"""A node agent's per-fleet GPU time (issue 33 item 3): its own GPUs' seconds attributed to the fleets and phases
of the cluster's worker calls, from a mirror of the exporter's task ledger (one poller per cluster), and reported
to the exporter, which sums the nodes (gpu/fleetnodes.py).

Started by the agent when it samples GPUs and knows its exporter. The mirror (discovery/taskshare.py) fetches the
ledger's changes every few seconds; the accountant (gpu/fleet.py) runs after each sampler poll, with the call
observer on (this node's workers' process titles); the report (its cumulative totals and the time they cover)
goes to ``POST /api/v1/agents/fleet`` every ``report_s``. Nothing here blocks the agent: each part has its own
thread, failures are logged once per change and retried with backoff.
"""
from __future__ import annotations

import logging

import httpx

from ..periodic import Periodic

log = logging.getLogger(__name__)
DEFAULT_REPORT_S = 5.0


class AgentFleet:
    def __init__(self, sampler, exporter_url: str, token: str | None, node_id: str = "",
                 report_s: float = DEFAULT_REPORT_S, mirror_s: float = 2.0, observe: bool | float = True):
        from ..discovery.taskshare import TaskMirror
        from ..gpu.fleet import FleetAccountant
        self.url = exporter_url.rstrip("/")
        self.mirror = TaskMirror(self.url, token, interval=mirror_s)
        self.accountant = FleetAccountant(sampler, self.mirror, self.mirror.run_labels, None, addresses=set(),
                                          node_id=node_id or None, observe=observe)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.reports = 0
        self.last_error: str | None = None
        self._report = Periodic(report_s, self.report, name="omniwatch-agent-fleet", what="fleet report",
                                wait_first=True)

    def report(self) -> bool:
        from ..gpu.fleetnodes import report_body
        body = report_body(self.accountant)
        if not body["gpus"] or body["until"] <= 0:
            return False   # nothing attributed yet
        try:
            with httpx.Client(timeout=5.0, trust_env=False) as c:
                r = c.post(f"{self.url}/api/v1/agents/fleet", json=body, headers=self._headers)
            err = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            err = f"{type(e).__name__}: {str(e)[:200]}"
        if err != self.last_error:
            (log.warning if err else log.info)("per-fleet GPU time report to %s: %s", self.url, err or "ok")
        self.last_error = err
        self.reports += err is None
        return err is None

    def start(self) -> "AgentFleet":
        self.mirror.start()
        self._report.start()
        return self

    def stop(self) -> None:
        self._report.stop()
        self.report()   # the last seconds
        self.mirror.stop()
        self.accountant.close()
