"""The training gateway: train any agent that speaks the OpenAI API (`agent-envs gateway`)."""
