"""Our envs handed to other trainers: `trl` gives any env id to TRL's GRPOTrainer."""
