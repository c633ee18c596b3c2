"""A synthetic knowledge base of fictional entities, rendered to passages, with multi-hop questions.

People, cities, countries, companies, products and universities are linked by relations (born
in, founded by, made by, ...). Each entity is one passage (title = its name) that states its
relations; a k-hop question composes k relations ("Where was the founder of the maker of Zorbit
Lamp born?"), so answering it takes k searches, each for a name read in the previous result.

    >>> from agent_envs.worlds import KnowledgeWorld, KnowledgeConfig
    >>> w = KnowledgeWorld(KnowledgeConfig(seed=0, difficulty=3))
    >>> task = w[0]
    >>> task.metadata["hops"] == len(task.gold_trace) - 1, len(w.corpus) > 100
    (True, True)

`difficulty` is the largest number of hops (1-4); hops are drawn uniformly from
[min_hops, difficulty]. The corpus is built once per world seed, lazily, and shared by all tasks.

With `teacher_shortcut` > 0, that share of multi-hop traces stops after the first search and
answers with the entity that hop found (a classic multi-hop mistake; `teacher` "shortcut",
`trace_correct` False). One-hop traces have no shortcut to take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from random import Random
from typing import ClassVar

from agent_envs.base.config import option
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.worlds.base import World, WorldConfig, register_world
from agent_envs.worlds.names import NameMaker


@dataclass(frozen=True)
class Relation:
    """A function from entities of one kind to entities of another, and how text says it."""

    name: str
    subject: str
    object: str
    noun_phrase: str  # "{x}" is the subject: "the founder of {x}"
    question: str  # asks for the object of "{x}"
    sentence: str  # the passage sentence stating it: "{s} was founded by {o}."


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "born_in",
        "person",
        "city",
        "the birthplace of {x}",
        "In which city was {x} born?",
        "{s} was born in {o}.",
    ),
    Relation(
        "attended",
        "person",
        "university",
        "the alma mater of {x}",
        "Which university did {x} attend?",
        "{s} studied at {o}.",
    ),
    Relation(
        "founded_by", "company", "person", "the founder of {x}", "Who founded {x}?", "{s} was founded by {o}."
    ),
    Relation(
        "based_in",
        "company",
        "city",
        "the home city of {x}",
        "In which city is {x} based?",
        "{s} is based in {o}.",
    ),
    Relation(
        "made_by", "product", "company", "the maker of {x}", "Which company makes {x}?", "{s} is made by {o}."
    ),
    Relation(
        "located_in",
        "university",
        "city",
        "the city where {x} is",
        "In which city is {x} located?",
        "{s} is located in {o}.",
    ),
    Relation(
        "in_country",
        "city",
        "country",
        "the country of {x}",
        "In which country is {x}?",
        "{s} lies in the country of {o}.",
    ),
    Relation(
        "capital",
        "country",
        "city",
        "the capital of {x}",
        "What is the capital of {x}?",
        "The capital of {s} is {o}.",
    ),
)

# Opening sentence of each passage; it repeats the name so the entity's own passage outranks
# passages that merely mention it.
INTROS = {
    "person": (
        "{s} is a {w}.",
        ("engineer", "painter", "chemist", "teacher", "pilot", "architect", "writer"),
    ),
    "city": ("{s} is a {w} city.", ("coastal", "mountain", "river", "desert", "harbour", "valley")),
    "country": ("{s} is a {w} country.", ("small", "large", "northern", "southern", "island", "landlocked")),
    "company": ("{s} is a {w} company.", ("small", "large", "young", "old", "family")),
    "product": ("{s} is a {w}.", ("lamp", "phone", "bicycle", "kettle", "drone", "camera", "watch", "radio")),
    "university": ("{s} is a {w} university.", ("public", "private", "technical", "small", "old")),
}
COMPANY_SUFFIXES = ("Labs", "Works", "Systems", "Motors", "Foods", "Media")


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    intro: str
    facts: dict[str, str] = field(default_factory=dict)  # relation name -> object entity id

    def passage(self, entities: dict[str, Entity]) -> str:
        sentences = [self.intro]
        for rel in RELATIONS:
            if rel.name in self.facts:
                sentences.append(rel.sentence.format(s=self.name, o=entities[self.facts[rel.name]].name))
        return " ".join(sentences)


@dataclass
class KnowledgeConfig(WorldConfig):
    """Knowledge-base world settings. `difficulty` is the largest hop count (1-4)."""

    difficulty: int = option(2, "questions have min_hops..difficulty hops (1-4)")
    min_hops: int = option(1, "the fewest hops of a question")
    n_people: int = option(120, "world size; the other kinds scale with it (cities n/3, companies n/2, ...)")

    max_difficulty: ClassVar[int] = 4

    def validate(self) -> None:
        super().validate()
        self._require("min_hops", 1 <= self.min_hops <= self.difficulty, "must be in [1, difficulty]")
        self._require("n_people", 12 <= self.n_people <= 5000, "must be in [12, 5000]")


@register_world
class KnowledgeWorld(World):
    """Multi-hop questions over a fictional knowledge base (`reward="qa"`), solved with `SearchTool`."""

    name = "knowledge"
    config_class = KnowledgeConfig
    config: KnowledgeConfig

    @cached_property
    def entities(self) -> dict[str, Entity]:
        """All entities by id, built once from the world seed."""
        rng = Random(f"knowledge:{self.config.seed}")
        names = NameMaker(rng)
        n = self.config.n_people
        counts = {
            "country": max(2, n // 12),
            "city": max(4, n // 3),
            "university": max(2, n // 6),
            "company": max(2, n // 2),
            "product": max(2, n * 2 // 3),
            "person": n,
        }
        by_kind: dict[str, list[Entity]] = {}
        for kind, count in counts.items():
            template, words = INTROS[kind]
            for i in range(count):
                word = rng.choice(words)
                if kind == "person":
                    name = names.person()
                elif kind == "company":
                    name = f"{names.word()} {rng.choice(COMPANY_SUFFIXES)}"
                elif kind == "product":
                    name = f"{names.word()} {word.capitalize()}"
                elif kind == "university":
                    name = f"{names.word()} University"
                else:
                    name = names.word()
                intro = template.format(s=name, w=word)
                intro = intro.replace(" a ", " an ", 1) if word[0] in "aeiou" else intro
                by_kind.setdefault(kind, []).append(Entity(f"{kind}{i}", kind, name, intro))
        countries, cities = by_kind["country"], by_kind["city"]
        for i, city in enumerate(cities):  # every country gets at least one city, so it has a capital
            country = countries[i] if i < len(countries) else rng.choice(countries)
            city.facts["in_country"] = country.id
        for country in countries:
            country.facts["capital"] = rng.choice(
                [c for c in cities if c.facts["in_country"] == country.id]
            ).id
        for rel in RELATIONS:
            if rel.name in ("in_country", "capital"):
                continue
            for ent in by_kind[rel.subject]:
                ent.facts[rel.name] = rng.choice(by_kind[rel.object]).id
        return {e.id: e for kind in by_kind.values() for e in kind}

    @cached_property
    def corpus(self) -> list[dict[str, str]]:
        """One passage per entity: `{"id", "title", "text"}` dicts (what the search tool indexes)."""
        ents = self.entities
        return [
            {"id": f"kb{self.config.seed}-{e.id}", "title": e.name, "text": e.passage(ents)}
            for e in ents.values()
        ]

    @cached_property
    def _chains(self) -> dict[int, list[tuple[Relation, ...]]]:
        """Every composable relation sequence of each length (the object of one is the next's subject)."""
        chains = {1: [(r,) for r in RELATIONS]}
        for hops in range(2, self.config.max_difficulty + 1):
            chains[hops] = [
                c + (r,) for c in chains[hops - 1] for r in RELATIONS if r.subject == c[-1].object
            ]
        return chains

    @cached_property
    def _by_kind(self) -> dict[str, list[Entity]]:
        out: dict[str, list[Entity]] = {}
        for e in self.entities.values():
            out.setdefault(e.kind, []).append(e)
        return out

    def make_tools(self, topk: int = 3, max_result_chars: int = 300) -> list[Tool]:
        from agent_envs.retrieval import BM25Backend
        from agent_envs.tools.search import SearchTool

        return [SearchTool(BM25Backend(self.corpus), topk=topk, max_result_chars=max_result_chars)]

    def _make_task(self, rng: Random, index: int) -> Task:
        hops = rng.randint(self.config.min_hops, self.config.difficulty)
        ents = self.entities
        while True:  # a walk that comes back to an entity ("the capital of the country of X") is redrawn
            chain = rng.choice(self._chains[hops])
            path = [rng.choice(self._by_kind[chain[0].subject])]
            for rel in chain:
                path.append(ents[path[-1].facts[rel.name]])
            if len({e.id for e in path}) == len(path):
                break
        phrase = path[0].name
        for rel in chain[:-1]:
            phrase = rel.noun_phrase.format(x=phrase)
        question = chain[-1].question.format(x=phrase)
        trace = [f"<think> I need to search for {path[0].name}. </think> <search> {path[0].name} </search>"]
        teacher = "shortcut" if hops > 1 and self.takes_shortcut(rng) else "intended"
        if teacher == "shortcut":  # path entities are distinct, so this answer is wrong
            fact = chain[0].sentence.format(s=path[0].name, o=path[1].name)
            trace.append(f"<think> {fact} </think> <answer> \\boxed{{{path[1].name}}} </answer>")
        for k, rel in enumerate(chain if teacher == "intended" else ()):
            fact = rel.sentence.format(s=path[k].name, o=path[k + 1].name)
            if k + 1 < len(chain):
                trace.append(f"<think> {fact} </think> <search> {path[k + 1].name} </search>")
            else:
                trace.append(f"<think> {fact} </think> <answer> \\boxed{{{path[-1].name}}} </answer>")
        return Task(
            id=self.task_id(index),
            question=question,
            answers=[path[-1].name],
            reward="qa",
            gold_trace=trace,
            metadata=self.metadata(
                index,
                teacher,
                hops=hops,
                tool_calls=len(trace) - 1,
                relations=[r.name for r in chain],
                path=[e.name for e in path],
            ),
        )
