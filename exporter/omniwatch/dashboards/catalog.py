"""The dashboards omniwatch ships, in the order they are listed and rendered."""
from __future__ import annotations

from . import bottlenecks, factory, gpus, lanes, overview, rollout, transferqueue
from .panels import Dashboard, dashboard_ids

DASHBOARDS: tuple[Dashboard, ...] = (
    overview.DASHBOARD, bottlenecks.DASHBOARD, rollout.DASHBOARD, transferqueue.DASHBOARD, gpus.DASHBOARD,
    lanes.DASHBOARD,
)
dashboard_ids(DASHBOARDS)  # import-time: unique uids and panel titles
# A run's data links lead to that run on the other dashboards.
factory.LINK_TARGETS.update({d.uid: d.title.split(" / ")[-1] for d in DASHBOARDS})


def by_uid(uid: str) -> Dashboard:
    for d in DASHBOARDS:
        if d.uid == uid:
            return d
    raise KeyError(f"no dashboard {uid!r}; known: {', '.join(d.uid for d in DASHBOARDS)}")
