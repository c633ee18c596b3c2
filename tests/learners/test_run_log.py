"""Curves of a run: raw per-step values are noisy, so plots draw a moving average over them."""

from __future__ import annotations

import pytest

from algorithms.core.run_log import RunLogger, moving_average, plot_curves, plot_line, smoothing_window


def test_moving_average_is_trailing_and_shorter_at_the_start():
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([2.0, 4.0], 5) == [2.0, 3.0]
    assert moving_average([], 3) == []
    assert smoothing_window(200) == 20 and smoothing_window(9) == 1


def test_plot_draws_the_average_solid_over_the_faint_raw_values(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    values = [(s % 2) * 0.5 + s / 40 for s in range(1, 41)]
    fig, ax = plt.subplots()
    plot_line(ax, list(range(1, 41)), values)
    smooth, raw = ax.lines
    assert list(smooth.get_ydata()) == pytest.approx(moving_average(values, 4))
    assert list(raw.get_ydata()) == values and raw.get_alpha() < 0.5 and smooth.get_alpha() is None
    plt.close(fig)

    log = RunLogger(tmp_path, config={}, total_steps=40, tensorboard=False, progress=False)
    for step, value in enumerate(values, 1):
        log.log(step, {"reward_mean": value})
    out = log.close(plot=True)
    assert out == plot_curves(tmp_path) and out.stat().st_size > 0
