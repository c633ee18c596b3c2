"""Drop training tasks whose question also appears in an evaluation set.

Questions are compared after normalisation (Unicode NFKC, lowercase, punctuation dropped,
whitespace collapsed), so trivial differences in quoting or spacing still match.

Evaluation sets are given as tasks or as benchmark names (every local split under
`$AGENT_ENVS_DATA_DIR`), e.g. `filter_contaminated(load_benchmark("arpo_rl"), ["hotpotqa"])`:

    >>> from agent_envs import Task
    >>> train = [Task("t0", "Who wrote 'Hamlet'?", ["Shakespeare"]), Task("t1", "Capital of Peru?", ["Lima"])]
    >>> kept, dropped = filter_contaminated(train, [Task("e0", "who wrote Hamlet", ["Shakespeare"])])
    >>> [t.id for t in kept], dropped
    (['t1'], 1)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from agent_envs.base.task import Task

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalize_question(text: str) -> str:
    """The comparison key of a question."""
    return " ".join(_NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).split())


def _eval_keys(evals: Iterable[Task | str]) -> set[str]:
    from agent_envs.data.loaders import load_benchmark, load_local_splits

    keys: set[str] = set()
    for item in evals:
        if isinstance(item, Task):
            keys.add(normalize_question(item.question))
            continue
        if not isinstance(item, str):
            raise TypeError(f"evaluation sets are Tasks or benchmark names, got {type(item).__name__}")
        splits = load_local_splits(item)  # a name means every local file of that benchmark
        tasks = [t for ts in splits.values() for t in ts] if splits else load_benchmark(item)
        keys.update(normalize_question(t.question) for t in tasks)
    return keys


def filter_contaminated(
    train_tasks: Sequence[Task], eval_tasks_or_names: Iterable[Task | str]
) -> tuple[list[Task], int]:
    """(training tasks whose normalised question is in none of the evaluation sets, number dropped).

    `eval_tasks_or_names` mixes Task objects and benchmark names; a name stands for every local
    split of that benchmark under $AGENT_ENVS_DATA_DIR (or its default source when none is local).
    """
    keys = _eval_keys(eval_tasks_or_names)
    kept = [t for t in train_tasks if normalize_question(t.question) not in keys]
    return kept, len(train_tasks) - len(kept)
