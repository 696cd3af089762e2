"""omniwatch: Prometheus/Grafana observability for VeRL-Omni diffusion RL training."""
__version__ = "0.1.0"
