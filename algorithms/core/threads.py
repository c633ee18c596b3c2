"""How many torch CPU threads a run uses: `threads: auto` follows the machine.

    >>> from algorithms.core.threads import choose_threads
    >>> choose_threads("auto", cores=2, load=0.1)   # two idle cores
    2
    >>> choose_threads("auto", cores=2, load=1.2)   # another process keeps one core busy
    1
    >>> choose_threads(3, cores=2, load=5.0)        # an explicit count always wins
    3

`auto` takes the cores this process may run on (`os.sched_getaffinity`, so `taskset` and
container CPU sets count) minus the machine's load (`current_load`: the runnable processes of
everyone else), split evenly over the processes of this run on this machine (`LOCAL_WORLD_SIZE`,
set by `accelerate launch` / torchrun), rounded half up and kept between 1 and the core count.
On a shared machine this keeps a run from oversubscribing cores that another job already uses;
on an idle one it uses them all. The choice is made once, when the run starts.

The 1-minute load average lags: a job that ended 30 s ago still reads as most of a core, so a
run started right after `make install` would take one thread of two idle cores. When it reads
busy, the cores actually in use over the last 0.1 s (`/proc/stat`) are measured too, and the
smaller of the two counts.
"""

from __future__ import annotations

import math
import os
import time
from typing import Literal

from algorithms.rollout.engine import hold_threads

# The `threads` setting of the learner and SFT configs: "auto", an integer, or None (torch's own).
Threads = int | Literal["auto"] | None
THREADS_HELP = ("torch CPU threads: auto (free cores: usable cores minus the 1-min load), an integer, or "
                "null (leave as is)")

AUTO = "auto"


def available_cores() -> int:
    """Cores this process may be scheduled on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def busy_cores(interval: float = 0.1) -> float | None:
    """Cores kept busy by all processes over the next `interval` seconds, from the kernel's CPU
    time counters (None where there is no /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            # cpu  user nice system idle iowait irq softirq steal ...: the sum over all cores
            ticks = [int(x) for x in f.readline().split()[1:9]]
        return sum(ticks), ticks[3] + ticks[4]

    try:
        total0, idle0 = sample()
        time.sleep(interval)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / (total1 - total0))


def current_load(idle_below: float = 0.5) -> float:
    """Cores others keep busy: the 1-minute load average, or, when that reads busy, the smaller of
    it and the cores busy right now (the average still counts jobs that just ended)."""
    load = load_average()
    if load < idle_below:
        return load
    now = busy_cores()
    return load if now is None else min(load, now)


def local_processes() -> int:
    """Processes of this run on this machine (1 unless a launcher says otherwise)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def choose_threads(
    setting: int | str | None,
    *,
    cores: int | None = None,
    load: float | None = None,
    processes: int | None = None,
) -> int | None:
    """The thread count for a `threads` config value: an integer as given, `auto` from the
    free cores (see the module docstring), None to leave torch's own default.

    `cores`, `load` and `processes` default to this machine's and this launch's; tests pass them.
    """
    if setting is None:
        return None
    if setting == AUTO:
        cores = available_cores() if cores is None else cores
        load = current_load() if load is None else load
        processes = local_processes() if processes is None else processes
        return max(1, min(cores, math.floor((cores - load) / processes + 0.5)))
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"config field 'threads': use an integer >= 1, 'auto' or null, got {setting!r}")
    return setting


def apply_threads(setting: int | str | None) -> int | None:
    """Set torch's intra-op thread count from a `threads` config value; returns the count set."""
    n = choose_threads(setting)
    if n is not None:
        hold_threads(n)  # also past a started vLLM CPU engine's no-op torch.set_num_threads
    return n


__all__ = ["AUTO", "THREADS_HELP", "Threads", "apply_threads", "available_cores", "busy_cores", "choose_threads",
           "current_load", "load_average", "local_processes"]
