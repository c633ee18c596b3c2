"""Looking into runs after (or while) they train: `runs` reads run folders (learner, evaluate,
compare), `analyze` draws the figures and tables of `agent-envs analyze`, `view` serves the
trajectory viewer of `agent-envs view` (docs/diagnostics.md)."""
