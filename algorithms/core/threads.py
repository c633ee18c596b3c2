"""How many torch CPU threads a run uses: `threads: auto` follows the machine.

    >>> from algorithms.core.threads import choose_threads
    >>> choose_threads("auto", cores=2, load=0.1)   # two idle cores
    2
    >>> choose_threads("auto", cores=2, load=1.2)   # another process keeps one core busy
    1
    >>> choose_threads(3, cores=2, load=5.0)        # an explicit count always wins
    3

`auto` takes the cores this process may run on (`os.sched_getaffinity`, so `taskset` and
container CPU sets count) minus the machine's 1-minute load average (the runnable processes of
everyone else), split evenly over the processes of this run on this machine (`LOCAL_WORLD_SIZE`,
set by `accelerate launch` / torchrun), rounded half up and kept between 1 and the core count.
On a shared machine this keeps a run from oversubscribing cores that another job already uses;
on an idle one it uses them all. The choice is made once, when the run starts.
"""

from __future__ import annotations

import math
import os
from typing import Literal

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
        load = load_average() if load is None else load
        processes = local_processes() if processes is None else processes
        return max(1, min(cores, math.floor((cores - load) / processes + 0.5)))
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"config field 'threads': use an integer >= 1, 'auto' or null, got {setting!r}")
    return setting


def apply_threads(setting: int | str | None) -> int | None:
    """Set torch's intra-op thread count from a `threads` config value; returns the count set."""
    n = choose_threads(setting)
    if n is not None:
        import torch

        torch.set_num_threads(n)
    return n


__all__ = ["AUTO", "THREADS_HELP", "Threads", "apply_threads", "available_cores", "choose_threads", "load_average", "local_processes"]
