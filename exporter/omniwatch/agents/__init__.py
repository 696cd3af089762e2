"""Per-node agents: the package in a node-local mode (``node``), placed one per Ray node by a
supervisor actor (``placement``), registered with the exporter's agent registry (``registry``,
``api``: ``POST /api/v1/agents``, ``GET /api/v1/agents/sd``).

Exposes ``router`` + ``init(app)`` (app.AREAS), ``add_commands(sub)`` (cli.AREAS:
``omniwatch agent``, ``omniwatch agents start|status|stop``) and ``start()/stop()`` for Python callers.
Importing this package never imports Ray.
"""
from .api import init, router
from .commands import add_commands

__all__ = ["add_commands", "init", "router", "start", "stop"]


def start(ray_address=None, exporter_url=None, **kw):
    """See ``placement.start``."""
    from .placement import start as _start
    return _start(ray_address, exporter_url, **kw)


def stop(ray_address=None, **kw):
    """See ``placement.stop``."""
    from .placement import stop as _stop
    return _stop(ray_address, **kw)
