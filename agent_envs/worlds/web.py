"""A synthetic web of linked pages for deep search: search finds a home page, links lead to the fact.

Each fictional organisation (a rowing club, a film festival, ...) has a home page, a people page,
one profile per committee member and one page per event; towns have pages on a shared atlas
site. Only home pages are in the search index, and their snippets hold no facts, so an answer
at depth d takes one search and d visits along links:

| depth | question | path |
|---|---|---|
| 1 | In which year was the Brindle Rowing Club founded? | home |
| 2 | Who is the treasurer of the Brindle Rowing Club? | home, people |
| 3 | Where was the treasurer of ... born? / In which month is the Kelvo Cup of ... held? | ..., profile or event |
| 4 | In which province was the treasurer of ... born? | ..., town page |

    >>> from agent_envs.worlds import WebWorld, WebConfig
    >>> w = WebWorld(WebConfig(seed=0, difficulty=4))
    >>> task = w[0]
    >>> task.metadata["depth"] == len(task.gold_trace) - 2, all(p["url"] in w.html for p in w.pages)
    (True, True)

`difficulty` is the largest depth (1-4); depths are drawn uniformly from [min_depth, difficulty].
With `teacher_shortcut` > 0, that share of traces for depth > 1 stops at the home page and answers
with what it read there (`teacher` "shortcut", `trace_correct` False); `path` stays the full path.

With `ambiguity` > 0, that share of organisations gets a namesake elsewhere and a near-namesake,
snippets that the search tool cuts before their facts, and a people page that lists the former
committee first. Questions name the founding year (or town) and say "current" or a year; the
gold traces open the namesakes in rank order until the right one (docs/envs.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from html import escape
from random import Random
from typing import Any, ClassVar

from agent_envs.base.config import option
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.retrieval.backend import SearchBackend
from agent_envs.worlds.ambiguity import AMBIGUITY_HELP, careful_search, confusable, fresh_names
from agent_envs.worlds.base import World, WorldConfig, register_world
from agent_envs.worlds.names import NameMaker

KINDS = (
    "Rowing Club",
    "Chess Society",
    "Film Festival",
    "Robotics Lab",
    "Choir",
    "Garden Trust",
    "Book Club",
    "Astronomy Society",
)
ROLES = ("chair", "treasurer", "secretary")
EVENT_KINDS = ("Cup", "Fair", "Gala", "Marathon", "Concert", "Workshop")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
ATLAS = "https://atlas.web"
# With `ambiguity` > 0, the snippets of confusable organisations say where they are based only
# after this, which the search tool's 300-character cut drops: the facts are indexed, not shown.
TEASER = (
    "News and notices for members are posted on this site, together with the minutes of the"
    " committee, the calendar of the season and directions for visitors; new members are always"
    " welcome and may write to the committee through the pages below."
)


@dataclass
class WebConfig(WorldConfig):
    """Synthetic web settings. `difficulty` is the largest link depth of an answer (1-4)."""

    difficulty: int = option(2, "answers lie min_depth..difficulty links below a search hit (1-4)")
    min_depth: int = option(1, "the fewest links from a search hit to the answer")
    n_sites: int = option(100, "organisations, each with ~6 pages; towns scale with it")
    page_chars: int = option(600, "pages are written short; this is the limit the browse tool applies")
    ambiguity: float = option(0.0, AMBIGUITY_HELP)

    max_difficulty: ClassVar[int] = 4

    def validate(self) -> None:
        super().validate()
        self._require("min_depth", 1 <= self.min_depth <= self.difficulty, "must be in [1, difficulty]")
        self._require("n_sites", 2 <= self.n_sites <= 5000, "must be in [2, 5000]")
        self._require("page_chars", self.page_chars >= 300, "must be >= 300 (a page must fit its links)")


@register_world
class WebWorld(World):
    """Deep-search questions over linked pages (`reward="qa"`), solved with `SearchTool` and `BrowseTool`."""

    name = "web"
    config_class = WebConfig
    config: WebConfig

    @cached_property
    def _site(self) -> dict[str, Any]:
        # Every page, link and fact is drawn from one RNG in one fixed order, and that order is
        # what keeps a seed's site the same across versions; rivals come from a stream of their own.
        rng = Random(f"web:{self.config.seed}")
        names = NameMaker(rng)
        pages: dict[str, dict[str, Any]] = {}

        def add(url: str, title: str, text: str, links: list[tuple[str, str]] = ()) -> None:
            if url in pages:
                raise RuntimeError(f"web world seed {self.config.seed}: two pages at {url}")
            pages[url] = {
                "url": url,
                "title": title,
                "text": text,
                "links": [{"title": t, "url": u} for t, u in links],
            }

        towns = []
        provinces = [names.word() for _ in range(max(2, self.config.n_sites // 10))]
        for _ in range(max(4, self.config.n_sites // 3)):
            town, province = names.word(), rng.choice(provinces)
            url = f"{ATLAS}/{town.lower()}"
            add(url, town, f"{town} is a town in the province of {province}. {town} has a market square.")
            towns.append({"name": town, "url": url, "province": province})
        orgs = []
        for _ in range(self.config.n_sites):
            word, kind = names.word(), rng.choice(KINDS)
            orgs.append(_add_org(add, rng, names, towns, word, kind, f"https://{word.lower()}.web/"))
        rivals = []  # searchable, never asked about
        if self.config.ambiguity > 0:
            rivals = _add_rivals(add, pages, orgs, towns, self.config.seed, self.config.ambiguity)
        return {"pages": pages, "orgs": orgs, "rivals": rivals}

    @property
    def pages(self) -> list[dict[str, Any]]:
        """Every page: `{"url", "title", "text", "links": [{"title", "url"}]}`."""
        return list(self._site["pages"].values())

    @cached_property
    def html(self) -> dict[str, str]:
        """URL -> HTML of every page (what `BrowseTool(pages=...)` serves)."""
        return {url: _to_html(p) for url, p in self._site["pages"].items()}

    @cached_property
    def corpus(self) -> list[dict[str, str]]:
        """The search index: one snippet per home page, with its URL in the text. The part the
        search tool shows holds no facts (with `ambiguity` > 0, confusable organisations' snippets
        go on past the tool's cut to say when they were founded and where they are based)."""
        return [
            {
                "id": o["home"],
                "title": o["name"],
                "url": o["home"],
                "text": f"{o['home']} Official home page of the {o['name']}."
                + (f" {TEASER} Founded in {o['year']}, based in {o['town']['name']}." if "teaser" in o else ""),
            }
            for o in self._site["orgs"] + self._site["rivals"]
        ]

    @cached_property
    def _backend(self) -> SearchBackend:  # the search tool's BM25, for the careful gold traces
        from agent_envs.retrieval import BM25Backend

        return BM25Backend(self.corpus)

    def make_tools(self, topk: int = 3, max_result_chars: int = 300) -> list[Tool]:
        from agent_envs.retrieval import BM25Backend
        from agent_envs.tools.browse import BrowseTool
        from agent_envs.tools.search import SearchTool

        return [
            SearchTool(BM25Backend(self.corpus), topk=topk, max_result_chars=max_result_chars),
            BrowseTool(pages=self.html, max_chars=self.config.page_chars),
        ]

    def _make_task(self, rng: Random, index: int) -> Task:
        depth = rng.randint(self.config.min_depth, self.config.difficulty)
        org = rng.choice(self._site["orgs"])
        if "namesake" in org and rng.random() < 0.5:  # ambiguity > 0: ask about the one elsewhere
            org = org["namesake"]
        name = org["name"]
        steps = [
            ("I will search for the " + name + ".", "search", name),
            ("I will open its home page.", "browse", org["home"]),
        ]
        if depth == 1:
            if rng.random() < 0.5:
                question, answer = f"In which year was the {name} founded?", str(org["year"])
                final = f"The {name} was founded in {answer}."
            else:
                question, answer = f"In which town is the {name} based?", org["town"]["name"]
                final = f"The {name} is based in {answer}."
        elif depth == 2 or rng.random() < 0.6:  # people: depth 2, 3 or 4
            m = rng.choice(org["members"])
            steps.append(("The People page lists its committee.", "browse", org["people_url"]))
            who = f"the {'current ' * ('committee' in org)}{m['role']} of the {name}"
            if depth == 2:
                question, answer, final = f"Who is {who}?", m["name"], f"The {m['role']} is {m['name']}."
                if "committee" in org and rng.random() < 0.5:  # ask for the former committee
                    c = org["committee"]
                    year = rng.randint(c["from"], c["elected"] - 1)
                    answer = c["former"][ROLES.index(m["role"])]
                    question = f"In {year}, who was the {m['role']} of the {name}?"
                    final = f"From {c['from']} to {c['elected']} the {m['role']} was {answer}."
            else:
                steps.append((f"The {m['role']} is {m['name']}.", "browse", m["url"]))
                born = f"{m['name']} was born in {m['town']['name']}."
                if depth == 3 and rng.random() < 0.5:
                    question, answer = f"In which year did {who} join?", str(m["joined"])
                    final = f"{m['name']} joined in {answer}."
                elif depth == 3:
                    question, answer, final = f"In which town was {who} born?", m["town"]["name"], born
                else:
                    steps.append((born, "browse", m["town"]["url"]))
                    question, answer = f"In which province was {who} born?", m["town"]["province"]
                    final = f"{m['town']['name']} is in the province of {answer}."
        else:  # events: depth 3 or 4
            ev = rng.choice(org["events"])
            steps.append(("The Events page lists its events.", "browse", org["events_url"]))
            steps.append((f"The {ev['name']} has its own page.", "browse", ev["url"]))
            where = f"the {ev['name']} of the {name}"
            if depth == 3:
                question, answer = f"In which month is {where} held?", ev["month"]
                final = f"The {ev['name']} is held every {answer}."
            else:
                steps.append(
                    (f"The {ev['name']} is held in {ev['town']['name']}.", "browse", ev["town"]["url"])
                )
                question, answer = f"In which province is {where} held?", ev["town"]["province"]
                final = f"{ev['town']['name']} is in the province of {answer}."
        path = [arg for _, tool, arg in steps if tool == "browse"]
        teacher = "shortcut" if depth > 1 and self.takes_shortcut(rng) else "intended"
        if teacher == "shortcut":
            # stops at the home page and answers with what it read there; when the town happens to
            # be the answer, the founding year (never an answer at depth > 1) is said instead
            town, year = org["town"]["name"], str(org["year"])
            said = town if town != answer else year
            final = f"The {name} is based in {town}." if said == town else f"The {name} was founded in {year}."
            steps = steps[:2]
        else:
            said = answer
        extra = {}
        if self.config.ambiguity > 0:
            question, steps, final, met = self._careful(org, question, answer, steps, final)
            extra = {"ambiguous": bool(met), "ambiguity": met}
        trace = [f"<think> {thought} </think> <{tool}> {arg} </{tool}>" for thought, tool, arg in steps]
        trace.append(f"<think> {final} </think> <answer> \\boxed{{{said}}} </answer>")
        return Task(
            id=self.task_id(index),
            question=question,
            answers=[answer],
            reward="qa",
            gold_trace=trace,
            metadata=self.metadata(
                index,
                teacher,
                depth=depth,
                hops=depth,
                tool_calls=len(steps),
                path=path,
                **extra,
            ),
        )

    def _careful(self, org: dict[str, Any], question: str, answer: str, steps: list[tuple[str, str, str]],
                 final: str) -> tuple[str, list[tuple[str, str, str]], str, list[str]]:
        """With rivals: the question names what tells the organisation from its namesake, and the
        steps open the namesakes the search shows, best first, until the one meant (searching
        again with that fact when it is not shown); the committee's dates decide who is current.
        Returns the question, steps, final thought, and what the task met."""
        met = ["cut_snippet"] if "teaser" in org else []
        notes = {k: "" for k in range(len(steps) + 1)}  # said after reading step k's result
        people = [k for k, (_, _, arg) in enumerate(steps) if arg == org["people_url"]]
        if "committee" in org and people:
            met.append("outdated")
            if "current" in question:
                notes[people[0]] = f"The committee since {org['committee']['elected']} is the current one. "
        if "namesake" in org:
            name, year, town = org["name"], org["year"], org["town"]["name"]
            qual = f"based in {town}" if answer == str(year) else f"founded in {year}"
            question = question.replace(f"the {name}", f"the {name} {qual}", 1)
            queries = [name, f"{name} {town if answer == str(year) else year}"]
            issued, shown = careful_search(self._backend, queries, org["home"])
            met += ["searched_again"] * (len(issued) > 1) + ["not_first"] * (shown[0] != org["home"])
            namesakes = [u for u in shown if u in (org["home"], org["namesake"]["home"])]
            met += ["namesake"] * (len(namesakes) > 1)
            head = [steps[0]] + [(f"None of the results is the {name} {qual}.", "search", q) for q in issued[1:]]
            first = "Several results are named the " + name + ", and their snippets are cut before the facts."
            for u in namesakes[: namesakes.index(org["home"]) + 1]:
                if u == namesakes[0]:
                    thought = f"{first} I will open {u}." if len(namesakes) > 1 else "I will open its home page."
                else:
                    o = org["namesake"]
                    thought = (f"That {name} was founded in {o['year']} and is based in {o['town']['name']};"
                               f" I need the one {qual}. I will open {u}.")
                head.append((thought, "browse", u))
            notes = {k + len(head) - 2: v for k, v in notes.items()}
            notes[len(head) - 1] = f"This is the {name} {qual}. " + notes.get(len(head) - 1, "")
            steps = head + steps[2:]
        steps = [(notes.get(k - 1, "") + thought, tool, arg) for k, (thought, tool, arg) in enumerate(steps)]
        return question, steps, notes.get(len(steps) - 1, "") + final, sorted(set(met))


def _add_org(add: Callable[..., None], rng: Random, names: NameMaker, towns: list[dict[str, Any]], word: str,
             kind: str, home: str, year: int | None = None, town: dict[str, Any] | None = None) -> dict[str, Any]:
    """One organisation's pages (home, people, profiles, events), drawn from `rng` in a fixed order."""
    org = {
        "name": f"{word} {kind}",
        "home": home,
        "kind": kind.lower(),
        "year": rng.randint(1850, 2020) if year is None else year,
        "town": rng.choice(towns) if town is None else town,
    }
    org["people_url"], org["events_url"] = org["home"] + "people", org["home"] + "events"
    org["members"] = []
    for role in ROLES:
        person = names.person()
        member = {
            "role": role,
            "name": person,
            "town": rng.choice(towns),
            "joined": rng.randint(1990, 2024),
            "url": f"{org['home']}people/{person.split()[1].lower()}",
        }
        org["members"].append(member)
        add(
            member["url"],
            person,
            f"{person} is the {role} of the {org['name']}. {person} was born in {member['town']['name']}"
            f" and joined in {member['joined']}.",
            [(member["town"]["name"], member["town"]["url"])],
        )
    org["events"] = []
    for _ in range(2):
        ev_word = names.word()
        event = {
            "name": f"{ev_word} {rng.choice(EVENT_KINDS)}",
            "month": rng.choice(MONTHS),
            "town": rng.choice(towns),
            "url": f"{org['home']}events/{ev_word.lower()}",
        }
        org["events"].append(event)
        add(
            event["url"],
            event["name"],
            f"The {event['name']} is held by the {org['name']} every {event['month']} in"
            f" {event['town']['name']}.",
            [(event["town"]["name"], event["town"]["url"])],
        )
    add(
        org["home"],
        org["name"],
        f"Welcome to the {org['name']}, a {org['kind']} based in {org['town']['name']}."
        f" It was founded in {org['year']}. See People and Events.",
        [("People", org["people_url"]), ("Events", org["events_url"])],
    )
    add(
        org["people_url"],
        f"People of the {org['name']}",
        " ".join(f"The {m['role']} is {m['name']}." for m in org["members"]),
        [(m["name"], m["url"]) for m in org["members"]],
    )
    add(
        org["events_url"],
        f"Events of the {org['name']}",
        f"The {org['name']} holds "
        + " and ".join(f"the {e['name']}" for e in org["events"])
        + " each year.",
        [(e["name"], e["url"]) for e in org["events"]],
    )
    return org


def _add_rivals(add: Callable[..., None], pages: dict[str, dict[str, Any]], orgs: list[dict[str, Any]],
                towns: list[dict[str, Any]], seed: int, share: float) -> list[dict[str, Any]]:
    """Give each confusable organisation a namesake elsewhere (same name, another town and year),
    a near-namesake (same first word, another kind), snippets cut before their facts, and a
    people page that lists the former committee, with its dates, before the current one."""
    rng = Random(f"web-ambiguity:{seed}")
    names = fresh_names(rng, [w for p in pages.values() for w in re.findall(r"[A-Z][a-z]+", p["text"])])
    rivals = []
    for org in orgs:
        # every organisation's rivals are drawn whatever the share (pages of the ones not kept
        # are dropped), so a world's rivals are a subset of those of any larger share
        keep = confusable(rng, share)
        put = add if keep else lambda *args: None
        word, kind = org["name"].split(" ", 1)
        town = rng.choice([t for t in towns if t is not org["town"]])
        year = rng.choice([y for y in range(1850, 2021) if y != org["year"]])
        twin = _add_org(put, rng, names, towns, word, kind, f"https://{word.lower()}-{town['name'].lower()}.web/",
                        year, town)
        other = rng.choice([k for k in KINDS if k != kind])
        near = _add_org(put, rng, names, towns, word, other, f"https://{word.lower()}-{other.split()[0].lower()}.web/")
        committees = []
        for o in (org, twin):
            elected = rng.randint(max(m["joined"] for m in o["members"]), 2024)
            committees.append({"from": rng.randint(1985, elected - 1), "elected": elected,
                               "former": [names.person() for _ in ROLES]})
        if not keep:
            continue
        org["namesake"], twin["namesake"] = twin, org
        for o, c in zip((org, twin), committees, strict=True):
            o["committee"] = c
            former = ", ".join(f"the {r} was {n}" for r, n in zip(ROLES, c["former"], strict=True))
            pages[o["people_url"]]["text"] = (
                f"Committee from {c['from']} to {c['elected']}: {former}. Committee since {c['elected']}: "
                + pages[o["people_url"]]["text"]
            )
        for o in (org, twin, near):
            o["teaser"] = True
        rivals += [twin, near]
    return rivals


def _to_html(page: dict[str, Any]) -> str:
    """The page as HTML with its links inline (`<a>` around the link text where the text says it),
    so the browse tool shows each link once in the text and once in its numbered link list."""
    body = escape(page["text"])
    for link in page["links"]:
        title = escape(link["title"])
        at = body.rfind(title)
        if at < 0:
            raise ValueError(
                f"page {page['url']}: link text {link['title']!r} does not occur in the page text"
            )
        anchor = f'<a href="{escape(link["url"])}">{title}</a>'
        body = body[:at] + anchor + body[at + len(title) :]
    return f"<html><head><title>{escape(page['title'])}</title></head><body><p>{body}</p></body></html>"
