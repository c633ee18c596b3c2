"""Looking into runs after (or while) they train: the trajectory viewer (`agent-envs view`)."""
