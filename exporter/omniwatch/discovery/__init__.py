"""Discovery of the endpoints a VeRL-Omni run exposes besides the trainer log: the TransferQueue
controller (and storage units), vLLM-Omni rollout and vLLM reward-model servers, and Ray's node
metrics agents — served to Prometheus through HTTP service discovery (``GET /api/v1/sd``).

Exposes ``router`` and ``init(app)`` (app.py AREAS) and ``add_commands(sub)``
(cli.AREAS: ``omniwatch discover``).
"""
from .api import init, router
from .command import add_commands
from .config import DiscoveryConfig, add_arguments, from_args
from .scrape import scrape_configs

__all__ = ["router", "init", "add_commands", "DiscoveryConfig", "add_arguments", "from_args", "scrape_configs"]
