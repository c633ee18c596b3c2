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


def test_progress_in_a_log_file_is_plain_lines_at_the_first_step_then_sparse_and_at_the_last(tmp_path, capsys):
    """Output that is not a terminal (a log file, a pipe) would show a rich bar only when it ends."""
    log = RunLogger(tmp_path, config={}, total_steps=5, tensorboard=False, progress=True)
    for step in range(1, 6):
        log.log(step, {"reward_mean": step / 10, "entropy": 0.25})
    log.close(plot=False)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" elapsed")[0] for line in lines] == ["train 1/5 (20%)", "train 5/5 (100%)"]
    assert lines[0].endswith("reward=0.1 H=0.25") and lines[1].endswith("reward=0.5 H=0.25")


def test_sft_progress_shows_its_loss(tmp_path, capsys):
    """An SFT step logs loss and lr, no reward: the line shows the loss going down."""
    log = RunLogger(tmp_path, config={}, total_steps=2, tensorboard=False, progress=True)
    log.log(1, {"loss": 2.5, "lr": 1e-4})
    log.log(2, {"loss": 1.25, "lr": 1e-4})
    log.close(plot=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("loss=2.5") and lines[-1].endswith("loss=1.25"), lines


def test_progress_lines_come_every_so_often_with_the_time_left_from_this_run_s_own_rate():
    import io

    from algorithms.base.progress import Progress

    now, out = [100.0], io.StringIO()
    bar = Progress("train", total=10, completed=4, stream=out, every_s=30, clock=lambda: now[0])
    for _ in range(4):  # resumed at step 4; 20 s a step from here
        now[0] += 20
        bar.advance()
    bar.close()  # stopped at 8 of 10, between two lines: the last line says where
    assert out.getvalue().splitlines() == [
        "train 5/10 (50%) elapsed 20s, left ~1m40s",
        "train 7/10 (70%) elapsed 1m00s, left ~1m00s",
        "train 8/10 (80%) elapsed 1m20s, left ~40s",
    ]


def test_progress_gives_no_time_left_before_a_tenth_of_the_work_is_done():
    """Episodes finish in batches: the first one, minutes in, says little of the other 255."""
    import io

    from algorithms.base.progress import Progress

    now, out = [0.0], io.StringIO()
    bar = Progress("episodes", total=256, stream=out, every_s=30, clock=lambda: now[0])
    now[0] = 285
    bar.advance()
    now[0] = 517
    bar.advance(79)
    bar.close()
    assert out.getvalue().splitlines() == ["episodes 1/256 (0%) elapsed 4m45s",
                                           "episodes 80/256 (31%) elapsed 8m37s, left ~18m57s"]


def test_progress_says_it_is_still_going_when_no_work_finishes_for_a_while():
    """A batch of episodes can take minutes to finish: a log still gets a line every so often."""
    import io
    import time

    from algorithms.base.progress import Progress

    out = io.StringIO()
    bar = Progress("episodes", total=8, stream=out, every_s=0.05)
    deadline = time.monotonic() + 10
    while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("episodes 0/8 (0%) elapsed ") for line in lines)
    time.sleep(0.2)  # closed: no more lines
    assert out.getvalue().splitlines() == lines
