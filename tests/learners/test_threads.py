"""`threads: auto` picks the free cores; integers win; bad values are errors naming the field."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from agent_envs.base.config import build_config
from algorithms.core import threads
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.threads import apply_threads, available_cores, busy_cores, choose_threads, current_load
from algorithms.sft import SFTConfig


@pytest.mark.parametrize(
    ("cores", "load", "expected"),
    [
        (2, 0.0, 2),  # idle machine: every core
        (2, 0.4, 2),  # a little background work rounds away
        (2, 0.6, 1),  # most of a core busy elsewhere
        (2, 1.0, 1),
        (2, 5.5, 1),  # overloaded: never below one
        (16, 3.4, 13),
        (16, 0.0, 16),
        (1, 0.0, 1),
    ],
)
def test_auto_is_cores_minus_load(cores, load, expected):
    assert choose_threads("auto", cores=cores, load=load) == expected


def test_auto_splits_the_free_cores_over_local_processes(monkeypatch):
    assert choose_threads("auto", cores=16, load=0.0, processes=2) == 8
    assert choose_threads("auto", cores=2, load=0.0, processes=2) == 1
    assert choose_threads("auto", cores=2, load=0.0, processes=4) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # what accelerate launch / torchrun set
    assert choose_threads("auto", cores=16, load=0.0) == 4


def test_explicit_count_wins_and_none_leaves_torch_alone():
    assert choose_threads(3, cores=2, load=9.0) == 3
    assert choose_threads(None, cores=2, load=0.0) is None


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True])
def test_bad_values_name_the_field(bad):
    with pytest.raises(ValueError, match="'threads'"):
        choose_threads(bad, cores=2, load=0.0)


def test_auto_reads_this_machine():
    n = choose_threads("auto")
    assert 1 <= n <= available_cores() <= (os.cpu_count() or 1)


def test_a_lagging_load_average_is_checked_against_the_cores_busy_now(monkeypatch):
    def must_not_sample(interval: float = 0.1) -> float:
        raise AssertionError("an idle load average needs no second look")

    monkeypatch.setattr(threads, "busy_cores", must_not_sample)
    monkeypatch.setattr(threads, "load_average", lambda: 0.2)
    assert current_load() == 0.2
    # a job that just ended: the average still says 1.9, the cores are idle now
    monkeypatch.setattr(threads, "load_average", lambda: 1.9)
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.1: 0.1)
    assert current_load() == 0.1 and choose_threads("auto", cores=2) == 2
    # a busy machine stays busy; the average wins when it is the smaller
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.1: 2.0)
    assert current_load() == 1.9 and choose_threads("auto", cores=2) == 1
    monkeypatch.setattr(threads, "busy_cores", lambda interval=0.1: None)  # no /proc/stat
    assert current_load() == 1.9


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="busy_cores reads Linux's /proc/stat")
def test_busy_cores_sees_a_spinning_process():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 5\nwhile time.time() < end: pass"])
    try:
        busy = busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.5 <= busy <= (os.cpu_count() or 1) + 0.01


def test_apply_sets_torch_threads(monkeypatch):
    before = torch.get_num_threads()
    # what a vLLM CPU engine does to torch.set_num_threads once it starts in this process
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    try:
        assert apply_threads(1) == 1 and torch.get_num_threads() == 1
        assert apply_threads(None) is None and torch.get_num_threads() == 1
        assert apply_threads(2) == 2 and torch.get_num_threads() == 2
    finally:
        torch._C.set_num_threads(before)


@pytest.mark.parametrize("cls", [LearnerConfig, SFTConfig])
def test_configs_default_to_auto_and_validate(cls, tmp_path):
    assert cls().threads == "auto"
    preset = tmp_path / "preset.yaml"
    preset.write_text("threads: 2\n")
    assert build_config(cls, preset).threads == 2
    assert build_config(cls, None, ["threads=auto"]).threads == "auto"
    with pytest.raises(ValueError, match="'threads'"):
        build_config(cls, None, ["threads=0"])
