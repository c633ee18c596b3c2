"""What the knowledge and web worlds share when `ambiguity` > 0: which entities get confusable
rivals, fresh names for the rivals, and the careful reader that the gold traces follow.

At `ambiguity` a, each entity (knowledge) or organisation (web) is *confusable* with probability
a, drawn from a random stream of its own (`Random(f"{world}-ambiguity:{seed}")`), so the base
world, its tasks and their draws are the same at every a, and at 0 nothing is drawn or added.
A confusable entity gets rivals in the corpus (a namesake told apart by a second attribute, a
near-namesake, an outdated page); a task that meets one says so in the question's wording.

The gold traces search the way a careful agent does: read the results, and when the one meant is
not among them, search again with the attribute that tells it apart. `careful_search` runs the
same BM25 the search tool runs, so the trace only ever acts on what the tool will show.

    >>> from agent_envs.retrieval import BM25Backend
    >>> docs = [{"id": "a", "title": "Bela Tramor", "text": "Bela Tramor is a pilot."},
    ...         {"id": "b", "title": "Bela Tramor", "text": "Bela Tramor is a painter."}]
    >>> careful_search(BM25Backend(docs), ["Bela Tramor", "Bela Tramor painter"], "b", topk=1)
    (['Bela Tramor', 'Bela Tramor painter'], ['b'])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from random import Random

from agent_envs.retrieval.backend import SearchBackend
from agent_envs.retrieval.corpus import normalize_query
from agent_envs.worlds.names import NameMaker

AMBIGUITY_HELP = (
    "share of entities with confusable rivals (namesakes, outdated pages, cut snippets) that the "
    "questions' wording tells apart; 0 keeps the world exactly as without the setting"
)
# The search tool's defaults in both worlds (`make_tools`): what a gold trace can read.
TOPK = 3
RESULT_CHARS = 300


def confusable(rng: Random, share: float) -> bool:
    """One world-level draw: is the next entity confusable? (Always draws, so the rivals of one
    entity do not depend on the share, only whether it has them.)"""
    return rng.random() < share


def fresh_names(rng: Random, taken: Iterable[str]) -> NameMaker:
    """A `NameMaker` that never returns a word of the names already in the world."""
    names = NameMaker(rng)
    names.used.update(word.lower() for name in taken for word in name.split())
    return names


def ranked_ids(backend: SearchBackend, query: str, topk: int = TOPK) -> list[str]:
    """The passage ids the search tool shows for `query`, best first."""
    return [hit.id for hit in backend.search_sync([normalize_query(query)], topk=topk)[0]]


def careful_search(
    backend: SearchBackend, queries: Sequence[str], target: str, topk: int = TOPK
) -> tuple[list[str], list[str]]:
    """Issue `queries` in order until `target` is among the results; return the queries issued
    and the last results. Raises RuntimeError when no query finds it (a world-building bug)."""
    issued: list[str] = []
    for query in queries:
        issued.append(query)
        ids = ranked_ids(backend, query, topk)
        if target in ids:
            return issued, ids
    raise RuntimeError(f"no query of {list(queries)} finds passage {target!r} in the top {topk}")


def change_years(rng: Random) -> tuple[int, int]:
    """(a year an old page was written, a later year the fact changed)."""
    listed = rng.randint(1995, 2012)
    return listed, rng.randint(listed + 3, 2023)
