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

With `ambiguity` > 0, that share of entities gets a rival (`rivals`, `Entity.history`): a namesake
told apart by its occupation or kind of company, a near-namesake, or a fact that changed, with an
old page that still states it. Questions say which one they mean ("Bela Tramor (painter)",
"today", "in 2010"), and the gold traces read, compare and search again (docs/envs.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from random import Random
from typing import ClassVar

from agent_envs.base.config import option
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.retrieval.backend import SearchBackend
from agent_envs.worlds.ambiguity import AMBIGUITY_HELP, careful_search, change_years, confusable, fresh_names
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


@dataclass(frozen=True)
class Change:
    """How text says a relation that changed over time (only with `ambiguity` > 0)."""

    since: str  # the passage sentence: "{s} moved from {old} to {o} in {y}."
    current_phrase: str  # "the current home city of {x}"
    current_question: str
    past_question: str  # "{y}" is a year before the change


CHANGES = {
    "based_in": Change(
        "{s} moved from {old} to {o} in {y}.",
        "the current home city of {x}",
        "In which city is {x} based today?",
        "In which city was {x} based in {y}?",
    ),
    "made_by": Change(
        "{s} passed from {old} to {o} in {y}.",
        "the current maker of {x}",
        "Which company makes {x} today?",
        "Which company made {x} in {y}?",
    ),
    "capital": Change(
        "The capital of {s} moved from {old} to {o} in {y}.",
        "the current capital of {x}",
        "What is the capital of {x} today?",
        "What was the capital of {x} in {y}?",
    ),
}
# Said after a namesake's name wherever the entity is named: "Bela Tramor (painter)". People and
# companies have namesakes; other kinds have near-namesakes or changed facts (passages stay short).
DESCRIPTORS = {"person": "{w}", "company": "{w} company"}
# A word of each relation's sentence: what a careful search adds when the name alone misses.
KEYWORDS = {"born_in": "born", "attended": "studied", "founded_by": "founded", "based_in": "based",
            "made_by": "made", "located_in": "located", "in_country": "country", "capital": "capital"}


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    intro: str
    facts: dict[str, str] = field(default_factory=dict)  # relation name -> object entity id
    word: str = ""  # the intro's attribute ("painter", "small")
    # with `ambiguity` > 0 only: what tells a namesake apart, and relation -> (old object id, year
    # an old page listed it, year it changed)
    descriptor: str = ""
    history: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        """How other text names this entity: with its descriptor when it has a namesake."""
        return f"{self.name} ({self.descriptor})" if self.descriptor else self.name

    def sentence(self, rel: Relation, entities: dict[str, Entity]) -> str:
        """The passage sentence stating this entity's `rel` fact."""
        obj = entities[self.facts[rel.name]]
        if rel.name in self.history:
            old, _, since = self.history[rel.name]
            return CHANGES[rel.name].since.format(s=self.name, o=obj.ref, y=since, old=entities[old].ref)
        return rel.sentence.format(s=self.name, o=obj.ref)

    def passage(self, entities: dict[str, Entity]) -> str:
        return " ".join([self.intro] + [self.sentence(r, entities) for r in RELATIONS if r.name in self.facts])


@dataclass
class KnowledgeConfig(WorldConfig):
    """Knowledge-base world settings. `difficulty` is the largest hop count (1-4)."""

    difficulty: int = option(2, "questions have min_hops..difficulty hops (1-4)")
    min_hops: int = option(1, "the fewest hops of a question")
    n_people: int = option(120, "world size; the other kinds scale with it (cities n/3, companies n/2, ...)")
    ambiguity: float = option(0.0, AMBIGUITY_HELP)

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
                by_kind.setdefault(kind, []).append(Entity(f"{kind}{i}", kind, name, intro, word=word))
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
        ents = {e.id: e for kind in by_kind.values() for e in kind}
        if self.config.ambiguity > 0:
            self.rivals = tuple(self._make_rivals(ents, by_kind))
        return ents

    # namesakes and near-namesakes, which no passage links to (set by `entities`, ambiguity > 0)
    rivals: tuple[Entity, ...] = ()

    def _make_rivals(self, ents: dict[str, Entity], by_kind: dict[str, list[Entity]]) -> list[Entity]:
        """Give each confusable entity one confusion its kind allows: a namesake with another
        attribute (and a descriptor for both), a near-namesake sharing its first word, or a
        changed fact (with an old page that still states the old one). Every entity's confusion
        is drawn whatever the share, and kept when it is confusable, so a world's rivals are a
        subset of those of any world with a larger share."""
        rng = Random(f"knowledge-ambiguity:{self.config.seed}")
        names = fresh_names(rng, [e.name for e in ents.values()])
        rivals: list[Entity] = []

        def rival(e: Entity, suffix: str, name: str, words: tuple[str, ...]) -> Entity:
            word = rng.choice([w for w in words if w != e.word])
            intro = INTROS[e.kind][0].format(s=name, w=word)
            intro = intro.replace(" a ", " an ", 1) if word[0] in "aeiou" else intro
            r = Entity(f"{e.id}-{suffix}", e.kind, name, intro, word=word)
            # facts about other entities (nothing links to a rival); a near-namesake's passage
            # states one, so that the search results stay short
            rels = [rel for rel in RELATIONS if rel.subject == e.kind and rel.name in e.facts]
            for rel in rels if suffix == "namesake" else rels[:1]:
                r.facts[rel.name] = rng.choice(by_kind[rel.object]).id
            return r

        for e in list(ents.values()):
            keep = confusable(rng, self.config.ambiguity)
            words, first = INTROS[e.kind][1], e.name.split()[0]
            changes = {rel.name: [x for x in by_kind[rel.object] if x.id != e.facts[rel.name]
                                  and (rel.name != "capital" or x.facts["in_country"] == e.id)]
                       for rel in RELATIONS if rel.subject == e.kind and rel.name in CHANGES}
            kinds = (["namesake"] * (e.kind in DESCRIPTORS) + ["near"] * (e.kind in ("company", "product"))
                     + ["changed"] * any(changes.values()))
            kind = rng.choice(kinds) if kinds else None  # one confusion each: cities and universities have none
            if kind == "namesake":
                twin = rival(e, "namesake", e.name, words)
                if keep:
                    rivals.append(twin)
                    e.descriptor, twin.descriptor = (DESCRIPTORS[e.kind].format(w=x.word) for x in (e, twin))
            elif kind == "near":
                if e.kind == "person":
                    near = rival(e, "near", f"{first} {names.word()}", words)
                elif e.kind == "company":
                    suffix = rng.choice([x for x in COMPANY_SUFFIXES if not e.name.endswith(x)])
                    near = rival(e, "near", f"{first} {suffix}", words)
                else:
                    other = rng.choice([w for w in words if w != e.word])
                    near = rival(e, "near", f"{first} {other.capitalize()}", (other,))
                rivals += [near] * keep
            elif kind == "changed":
                rel_name, olds = next((r, olds) for r, olds in changes.items() if olds)
                old = (rng.choice(olds).id, *change_years(rng))
                if keep:
                    e.history[rel_name] = old
        return rivals

    @cached_property
    def corpus(self) -> list[dict[str, str]]:
        """One passage per entity: `{"id", "title", "text"}` dicts (what the search tool indexes).
        With `ambiguity` > 0, the rivals' passages follow, then one old page per changed fact."""
        ents = self.entities
        seed = self.config.seed
        docs = [{"id": f"kb{seed}-{e.id}", "title": e.name, "text": e.passage(ents)} for e in ents.values()]
        both = {**ents, **{r.id: r for r in self.rivals}}
        docs += [{"id": f"kb{seed}-{r.id}", "title": r.name, "text": r.passage(both)} for r in self.rivals]
        for e in ents.values():
            for rel in RELATIONS:
                if rel.name in e.history:
                    old, listed, _ = e.history[rel.name]
                    text = f"Listed in {listed}: " + rel.sentence.format(s=e.name, o=ents[old].ref)
                    docs.append({"id": f"kb{seed}-{e.id}-{listed}", "title": e.name, "text": text})
        return docs

    @cached_property
    def _backend(self) -> SearchBackend:  # the search tool's BM25, for the careful gold traces
        from agent_envs.retrieval import BM25Backend

        return BM25Backend(self.corpus)

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
        if self.config.ambiguity > 0:
            return self._make_ambiguous_task(rng, index, chain, path)
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
        return self._task(index, question, trace, teacher, chain, path)

    def _task(self, index: int, question: str, trace: list[str], teacher: str, chain: tuple[Relation, ...],
              path: list[Entity], **extra: object) -> Task:
        return Task(
            id=self.task_id(index),
            question=question,
            answers=[path[-1].name],
            reward="qa",
            gold_trace=trace,
            metadata=self.metadata(
                index,
                teacher,
                hops=len(chain),
                tool_calls=len(trace) - 1,
                relations=[r.name for r in chain],
                path=[e.name for e in path],
                **extra,
            ),
        )

    def _make_ambiguous_task(self, rng: Random, index: int, chain: tuple[Relation, ...], path: list[Entity]) -> Task:
        """The task of the same draws in a world with rivals: the question names the attribute
        that tells a namesake apart and says "today" or a year where a fact changed; the gold
        trace reads the results, searches again when the one meant is not shown, and takes the
        fact the wording asks for. Draws beyond the base task's come last, and only here."""
        ents, seed = self.entities, self.config.seed
        phrase = path[0].ref
        for k, rel in enumerate(chain[:-1]):
            changed = rel.name in path[k].history
            phrase = (CHANGES[rel.name].current_phrase if changed else rel.noun_phrase).format(x=phrase)
        teacher = "shortcut" if len(chain) > 1 and self.takes_shortcut(rng) else "intended"
        last, subject = chain[-1], path[-2]
        year = None
        if last.name in subject.history:
            old, listed, since = subject.history[last.name]
            if rng.random() < 0.5 and ents[old] not in path:  # ask for the fact before the change
                year = rng.randint(listed, since - 1)
                path = [*path[:-1], ents[old]]
                question = CHANGES[last.name].past_question.format(x=phrase, y=year)
            else:
                question = CHANGES[last.name].current_question.format(x=phrase)
        else:
            question = last.question.format(x=phrase)
        met: list[str] = []
        trace = [f"<think> I need to search for {path[0].name}. </think> <search> {path[0].name} </search>"]
        for k, rel in enumerate(chain[: 1 if teacher == "shortcut" else None]):
            e = path[k]
            queries = [e.name] + [f"{e.name} {e.word}"] * bool(e.descriptor) + [f"{e.name} {KEYWORDS[rel.name]}"]
            issued, shown = careful_search(self._backend, queries, f"kb{seed}-{e.id}")
            for query in issued[1:]:
                met.append("searched_again")
                trace.append(f"<think> None of the results is {e.ref}. </think> <search> {query} </search>")
            notes = []
            if e.descriptor:  # named with it in the question or the passage before, shown or not
                met.append("namesake")
            if f"kb{seed}-{e.id}-namesake" in shown:
                notes.append(f"Doc {shown.index(f'kb{seed}-{e.id}') + 1} is the {e.descriptor}.")
            if shown[0] != f"kb{seed}-{e.id}":
                met.append("not_first")
            if f"kb{seed}-{e.id}-near" in shown:
                met.append("near_namesake")
            fact = e.sentence(rel, ents)
            if rel.name in e.history:
                met.append("outdated")
                listed = e.history[rel.name][1]
                if year and k + 1 == len(chain):  # asked before the change
                    fact += f" So in {year} it was {path[k + 1].name}."
                elif f"kb{seed}-{e.id}-{listed}" in shown:
                    notes.append(f"The {listed} page is old.")
            if teacher == "shortcut":  # stops at the first hop: wrong, as in the world without rivals
                trace.append(f"<think> {fact} </think> <answer> \\boxed{{{ents[e.facts[rel.name]].name}}} </answer>")
            elif k + 1 < len(chain):
                trace.append(f"<think> {' '.join([*notes, fact])} </think> <search> {path[k + 1].name} </search>")
            else:
                trace.append(f"<think> {' '.join([*notes, fact])} </think> <answer> \\boxed{{{path[-1].name}}} </answer>")
        return self._task(index, question, trace, teacher, chain, path, ambiguous=bool(met),
                          ambiguity=sorted(set(met)))
