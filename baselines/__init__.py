"""Baselines and how to read them: evaluating a model (`evaluation/`: episodes, pass@k), comparing
learners (`comparison/`: seeds x algorithms -> table and plots), prompting baselines
(`prompting.py`: no tool, CoT, ReAct-style) and the CPU quickstart (`quickstart.py`)."""
