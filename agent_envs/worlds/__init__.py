"""Procedural, seeded, offline worlds: the embedded default tasks of AgentMath, AgentQA, AgentSearch and AgentNotebook.

Each world is an indexable task source with gold tool-use traces, plus the tools its tasks need.

    >>> from agent_envs.worlds import ArithmeticWorld, ArithmeticConfig
    >>> w = ArithmeticWorld(ArithmeticConfig(seed=0, difficulty=1, size=1000))
    >>> len(w), w[0].metadata["world"]
    (1000, 'arithmetic')

| world | class | reward | tools |
|---|---|---|---|
| `arithmetic` | `ArithmeticWorld` | math | python |
| `knowledge` | `KnowledgeWorld` | qa | search (BM25 over `w.corpus`) |
| `web` | `WebWorld` | qa | search over home-page snippets, browse |
| `notebook` | `NotebookWorld` | math | python session (state kept across calls) |
"""

from agent_envs.worlds.arithmetic import ArithmeticConfig, ArithmeticWorld
from agent_envs.worlds.base import WORLDS, World, WorldConfig, make_world, register_world
from agent_envs.worlds.knowledge import KnowledgeConfig, KnowledgeWorld
from agent_envs.worlds.notebook import NotebookConfig, NotebookWorld
from agent_envs.worlds.web import WebConfig, WebWorld

__all__ = [
    "WORLDS",
    "ArithmeticConfig",
    "ArithmeticWorld",
    "KnowledgeConfig",
    "KnowledgeWorld",
    "NotebookConfig",
    "NotebookWorld",
    "WebConfig",
    "WebWorld",
    "World",
    "WorldConfig",
    "make_world",
    "register_world",
]
