"""Evaluation of a model on an env: greedy or sampled episodes, pass@k (`evaluate`, `passk`)."""
