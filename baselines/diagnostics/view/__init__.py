"""`agent-envs view RUN`: a local web page to browse a run's trajectories as branch trees."""

from baselines.diagnostics.view.server import add_cli, make_app, serve

__all__ = ["add_cli", "make_app", "serve"]
