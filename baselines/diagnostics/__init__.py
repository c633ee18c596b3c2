"""Diagnostics of runs: `runs` reads run folders (learner, evaluate, compare), `analyze` draws the
figures and tables of `agent-envs analyze` (docs/diagnostics.md)."""
