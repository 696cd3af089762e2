"""The Prometheus ``scrape_configs`` that read omniwatch's HTTP service discovery: one job per kind,
so each keeps its own job name (the names verl and Ray use) and its own scrape health."""
from __future__ import annotations

from .targets import JOB_OF_KIND, KINDS


def scrape_configs(exporter: str, refresh_interval: str = "15s", scrape_interval: str | None = None,
                   scrape_timeout: str | None = None) -> list[dict]:
    """``exporter`` is host:port of the omniwatch exporter. Targets carry project, experiment, role
    and replica labels from discovery (TransferQueue storage units also ``storage_unit_id``, the key
    of the controller's per-unit series); a vLLM-Omni series that has its own ``replica`` label keeps
    it as ``exported_replica`` (honor_labels stays false)."""
    out = []
    for kind in KINDS:
        job: dict = {"job_name": JOB_OF_KIND[kind],
                     "http_sd_configs": [{"url": f"http://{exporter}/api/v1/sd?kind={kind}",
                                          "refresh_interval": refresh_interval}]}
        if scrape_interval:
            job["scrape_interval"] = scrape_interval
        if scrape_timeout:
            job["scrape_timeout"] = scrape_timeout
        out.append(job)
    return out
