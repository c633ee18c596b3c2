"""Comparison of learners: N algorithms x seeds -> one table and plots (`compare`, `report`)."""
