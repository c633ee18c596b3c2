"""What each world generates: answers recomputed independently, difficulty knobs honoured,
corpora and sites well formed, and facts kept out of places they would leak from."""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter

import pytest

from agent_envs.retrieval import BM25Backend
from agent_envs.tools.browse import BrowseTool
from agent_envs.tools.search import SearchTool
from agent_envs.worlds import (
    ArithmeticConfig,
    ArithmeticWorld,
    KnowledgeConfig,
    KnowledgeWorld,
    WebConfig,
    WebWorld,
)
from agent_envs.worlds.arithmetic import PROBLEM_FAMILIES
from agent_envs.worlds.knowledge import RELATIONS
from agent_envs.worlds.web import ATLAS

N = 200
CODE = re.compile(r"<python>(.*)</python>", re.DOTALL)

# -- arithmetic -------------------------------------------------------------------------------------


def run_code(code: str) -> str:
    """Gold code is plain arithmetic; running it in-process recomputes the answer independently."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    return out.getvalue().strip()


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arithmetic_code_computes_the_answer_from_the_questions_numbers(difficulty):
    w = ArithmeticWorld(ArithmeticConfig(seed=1, difficulty=difficulty))
    families, templates = Counter(), Counter()
    for i in range(N):
        t = w[i]
        families[t.metadata["family"]] += 1
        templates[t.metadata["family"], t.metadata["template"]] += 1
        code = CODE.search(t.gold_trace[0]).group(1)
        assert run_code(code) == t.answers[0], t
        # the code only restates numbers the question gives (coefficients of 1 are implicit: "x - y")
        question_numbers = {abs(int(n)) for n in re.findall(r"\d+", t.question)}
        for n in re.findall(r"\d+", code):
            assert int(n) in question_numbers or int(n) == 1, (
                f"{t.id}: {n} in {code!r} is not in {t.question!r}"
            )
        assert (
            t.gold_trace[1]
            == f"<think> The result is {t.answers[0]}. </think> <answer> \\boxed{{{t.answers[0]}}} </answer>"
        )
    assert set(families) == set(PROBLEM_FAMILIES[difficulty])
    assert all(count > 5 for count in templates.values()) and len(templates) == 3 * len(PROBLEM_FAMILIES[difficulty])


def test_arithmetic_digits_are_configurable():
    w = ArithmeticWorld(ArithmeticConfig(seed=0, min_digits=4, max_digits=4))
    for i in range(N):
        t = w[i]
        operands = re.findall(r"\d+", CODE.search(t.gold_trace[0]).group(1))
        assert all(len(n) == 4 for n in operands), t
    default = ArithmeticWorld()
    lengths = {len(n) for i in range(N) for n in re.findall(r"\d+", default[i].question)}
    assert lengths == {2, 3, 4, 5}


def test_arithmetic_mod_tasks_are_not_trivial():
    w = ArithmeticWorld(ArithmeticConfig(seed=2))
    mods = [w[i] for i in range(N) if w[i].metadata["family"] == "mod"]
    assert mods
    for t in mods:
        a, b = (int(n) for n in re.findall(r"\d+", CODE.search(t.gold_trace[0]).group(1)))
        assert a >= b, t


# -- knowledge base ---------------------------------------------------------------------------------


def test_knowledge_corpus_one_passage_per_entity_built_once():
    w = KnowledgeWorld(KnowledgeConfig(seed=0))
    corpus = w.corpus
    assert w.corpus is corpus
    assert len(corpus) == len(w.entities)
    assert len({d["id"] for d in corpus}) == len(corpus)
    assert len({d["title"] for d in corpus}) == len(corpus)
    for d in corpus:
        assert set(d) == {"id", "title", "text"}
        assert d["text"].startswith(d["title"] + " is a"), d  # the name opens its own passage
        assert len(d["text"]) < 300
    assert KnowledgeWorld(KnowledgeConfig(seed=1)).corpus[0]["title"] != corpus[0]["title"]


def test_knowledge_hops_and_reasoning_steps_come_from_passages():
    w = KnowledgeWorld(KnowledgeConfig(seed=0, difficulty=4))
    passages = {d["title"]: d["text"] for d in w.corpus}
    rel = {r.name: r for r in RELATIONS}
    hops = Counter()
    for i in range(N):
        t = w[i]
        h = t.metadata["hops"]
        hops[h] += 1
        path, relations = t.metadata["path"], t.metadata["relations"]
        assert len(path) == h + 1 == len(relations) + 1 == len(t.gold_trace)
        assert path[0] in t.question and all(p not in t.question for p in path[1:]), t
        assert len(set(path)) == len(path)
        assert t.answers == [path[-1]]
        for k, r in enumerate(relations):
            fact = rel[r].sentence.format(s=path[k], o=path[k + 1])
            assert fact in passages[path[k]], f"{t.id}: {fact!r} is not in the passage of {path[k]}"
            assert f"<think> {fact} </think>" in t.gold_trace[k + 1]
    assert set(hops) == {1, 2, 3, 4}
    exact = KnowledgeWorld(KnowledgeConfig(seed=0, difficulty=3, min_hops=3))
    assert {exact[i].metadata["hops"] for i in range(50)} == {3}


def test_knowledge_entity_passage_is_the_top_search_hit_for_its_name():
    """Why a gold trace's search finds what it needs: the named entity's own passage ranks first."""
    w = KnowledgeWorld(KnowledgeConfig(seed=3))
    backend = BM25Backend(w.corpus)
    names = [d["title"] for d in w.corpus]
    hits = backend.search_sync(names, topk=1)
    assert [h[0].title for h in hits] == names


# -- web --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def web() -> WebWorld:
    return WebWorld(WebConfig(seed=0, difficulty=4))


def test_web_site_is_well_formed(web):
    urls = {p["url"] for p in web.pages}
    assert len(urls) == len(web.pages) == len(web.html)
    for page in web.pages:
        assert len(page["text"]) <= web.config.page_chars
        for link in page["links"]:
            assert link["url"] in urls, f"{page['url']} links to a missing page {link['url']}"
    # every page is reachable from a home page (the only entry points search gives)
    homes = [d["url"] for d in web.corpus]
    by_url = {p["url"]: p for p in web.pages}
    reached, frontier = set(homes), list(homes)
    while frontier:
        for link in by_url[frontier.pop()]["links"]:
            if link["url"] not in reached:
                reached.add(link["url"])
                frontier.append(link["url"])
    # only town pages no profile or event links to may be unreachable
    assert all(u.startswith(ATLAS) for u in urls - reached)


def test_web_browse_shows_page_text_once_and_every_link(web):
    tool = BrowseTool(pages=web.html, max_chars=web.config.page_chars)
    for page in web.pages[:60]:
        text = tool.run(page["url"]).text
        assert page["text"] in text
        for n, link in enumerate(page["links"], 1):
            assert f"[{n}] {link['title']}: {link['url']}" in text
        assert text.count(page["text"]) == 1


def test_web_answers_lie_only_behind_links(web):
    search = SearchTool(BM25Backend(web.corpus), topk=3, max_result_chars=300)
    depths = Counter()
    for i in range(N):
        t = web[i]
        depths[t.metadata["depth"]] += 1
        assert len(t.metadata["path"]) == t.metadata["depth"]
        query = re.search(r"<search> (.*) </search>", t.gold_trace[0]).group(1)
        result = search.run(query).text
        assert t.metadata["path"][0] in result.splitlines()[0]  # the home page is the first hit
        assert t.answers[0] not in result, f"{t.id}: the answer leaks into search results"
    assert set(depths) == {1, 2, 3, 4}
    for d in web.corpus:
        assert not re.search(r"\d", d["text"].replace(d["url"], "")), d  # snippets carry no facts
