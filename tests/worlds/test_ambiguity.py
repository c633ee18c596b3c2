"""`world.ambiguity` of the knowledge and web worlds: at 0 every task, gold trace, corpus and
tool output is byte-identical to the worlds before the setting existed (hashes pinned below),
and above 0 the worlds hold namesakes, outdated facts and cut snippets that the gold traces
resolve and a naive first-hit agent does not."""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections import Counter
from dataclasses import asdict

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the env ids)
from agent_envs.worlds import make_world
from agent_envs.worlds.knowledge import CHANGES, RELATIONS
from agent_envs.worlds.web import ROLES

RELATIONS_BY_NAME = {r.name: r for r in RELATIONS}

# Computed from the worlds as they were before `ambiguity` existed; `ambiguity` 0 must keep them.
PINNED_EPISODES = {
    ("AgentQA-v0", (("seed", 0),)): "035d799c832254c3a2a5017cc6f63f88a8771551466953eea4c00060be1fa55c",
    ("AgentQA-v0", (("seed", 3), ("difficulty", 4))): "76f99cbaa46788b7f0560d1edd94abfbb12b025e130a5235bb85c8465d6f360d",
    ("AgentQA-v0", (("seed", 7), ("difficulty", 4), ("teacher_shortcut", 0.4))):
        "4c96f20da4c752eb460aebb302296b33763959cfa90d58696b14a67e60d07071",
    ("AgentSearch-v0", (("seed", 0),)): "32b06b5cea07d015de9bda3c7267d5aa648b2120ec8b9cb7e098e9271406f640",
    ("AgentSearch-v0", (("seed", 3), ("difficulty", 4))):
        "4bae3c3c0fc3ae4876da0cbff9e5407f209c523471a950869d1c12a9a3ea7141",
    ("AgentSearch-v0", (("seed", 7), ("difficulty", 4), ("teacher_shortcut", 0.4))):
        "fbcd714ba014c8936244cbf1a76a015c7357470a94c678b300d214b9e9b24fcc",
}
PINNED_CORPORA = {
    0: "6576d9f69a2ca18eb0175fa5618597d33f3fd55310a6c38061efb76ccdc82d9a",
    3: "28a6576d3bccec2408df87e9ddace7c3cd17759c550d95deb42a436feee04c76",
}


def episodes_digest(env_id: str, world: dict, n: int = 50) -> str:
    """SHA-256 over the rendered prompt, the task (question, answers, gold trace, metadata) and
    every observation, reward and end flag of the gold trace replayed through the env."""
    env = gym.make(env_id, world=world, max_tool_calls=8)
    h = hashlib.sha256()
    for i in range(n):
        prompt, _ = env.reset(options={"index": i})
        task = env.unwrapped.task
        h.update(json.dumps([prompt, asdict(task)], sort_keys=True).encode())
        for action in task.gold_trace:
            obs, reward, terminated, truncated, _ = env.step(action)
            h.update(json.dumps([obs, reward, terminated, truncated]).encode())
    return h.hexdigest()


@pytest.mark.parametrize("env_id, world", sorted(PINNED_EPISODES))
@pytest.mark.parametrize("ambiguity", [None, 0, 0.0])
def test_ambiguity_zero_keeps_every_episode_byte_identical(env_id, world, ambiguity):
    config = dict(world) if ambiguity is None else {**dict(world), "ambiguity": ambiguity}
    assert episodes_digest(env_id, config) == PINNED_EPISODES[env_id, world]


@pytest.mark.parametrize("seed", sorted(PINNED_CORPORA))
def test_ambiguity_zero_keeps_corpora_and_pages_byte_identical(seed):
    k, w = make_world("knowledge", seed=seed, ambiguity=0), make_world("web", seed=seed, ambiguity=0)
    rows = [k.corpus, w.corpus, w.pages, w.html]
    assert hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest() == PINNED_CORPORA[seed]


# -- above 0 ----------------------------------------------------------------------------------------

ENVS = {"knowledge": "AgentQA-v0", "web": "AgentSearch-v0"}
TOOL_CALL = re.compile(r"<(search|browse)>(.*?)</\1>\s*$", re.DOTALL)


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("bad", [-0.1, 1.5, True])
def test_ambiguity_must_be_a_share(name, bad):
    with pytest.raises(ValueError, match="ambiguity"):
        make_world(name, ambiguity=bad)
    config_class = type(make_world(name).config)
    with pytest.raises(ValueError, match=f"'{config_class.__name__}.ambiguity' must be a share in"):
        config_class(ambiguity=bad).validate()


def play(env, index: int, policy) -> tuple[float, dict]:
    """One episode of task `index` driven by `policy(task)`, a generator that yields actions and is
    sent each observation."""
    env.reset(options={"index": index})
    actions = policy(env.unwrapped.task)
    action = next(actions)
    while True:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return reward, info
        action = actions.send(obs)


def answer(text: str) -> str:
    return f"<think> done </think> <answer> \\boxed{{{text}}} </answer>"


def first_hit(obs: str) -> str:
    """The text of the first search result ("" when there is none)."""
    m = re.search(r"^Doc 1\(Title: [^)]*\) (.*)$", obs, re.MULTILINE)
    return m.group(1) if m else ""


NAME = r"(?P<o>[A-Z][a-z]+(?: [A-Z][a-z]+)*)"


def naive_knowledge(task):
    """Searches each name and takes the first fact of the relation that the first hit states
    (the relation chain and first name are what the question says)."""
    name = task.metadata["path"][0]
    for rel in task.metadata["relations"]:
        obs = yield f"<think> next </think> <search> {name} </search>"
        templates = [RELATIONS_BY_NAME[rel].sentence] + ([CHANGES[rel].since] if rel in CHANGES else [])
        found = [m for t in templates if (m := re.search(sentence_pattern(t, name), first_hit(obs)))]
        if not found:
            yield answer("unknown")
            return
        name = min(found, key=lambda m: m.start()).group("o")
    yield answer(name)


def sentence_pattern(template: str, subject: str) -> str:
    """A relation sentence as a regex whose group `o` is its object."""
    out = ""
    for literal, field, _, _ in string.Formatter().parse(template):
        out += re.escape(literal)
        out += {"s": re.escape(subject), "o": NAME, "y": r"\d+", "old": ".*?", None: ""}[field]
    return out


def naive_web(task):
    """Opens the first search hit and reads the first matching fact on each page, following the
    links a reader of the question would (people or events, the person or event, the town)."""
    q = task.question
    obs = yield task.gold_trace[0]  # the same search as the careful trace: the organisation's name
    url = re.search(r"^Doc 1\(Title: [^)]*\) (\S+)", obs, re.MULTILINE).group(1)
    page = yield f"<browse> {url} </browse>"

    def link(title: str) -> str | None:
        m = re.search(rf"^\[\d+\] {re.escape(title)}: (\S+)$", page, re.MULTILINE)
        return m.group(1) if m else None

    def first_link() -> str:
        return re.search(r"^\[1\] [^:]+: (\S+)$", page, re.MULTILINE).group(1)

    role = next((r for r in ROLES if f" {r} " in q), None)
    event = re.search(r"the (\w+ \w+) of the ", q)
    if role:
        page = yield f"<browse> {link('People')} </browse>"
        who = re.search(rf"[Tt]he {role} (?:is|was) (?P<o>[A-Z][a-z]+ [A-Z][a-z]+)", page).group("o")
        if q.startswith(("Who", "In 1", "In 2")):
            yield answer(who)
            return
        if link(who) is None:  # a former member has no profile
            yield answer("unknown")
            return
        page = yield f"<browse> {link(who)} </browse>"
    elif event and "month" in q or event and "province" in q:
        page = yield f"<browse> {link('Events')} </browse>"
        if link(event.group(1)) is None:
            yield answer("unknown")
            return
        page = yield f"<browse> {link(event.group(1))} </browse>"
    if "province" in q:
        page = yield f"<browse> {first_link()} </browse>"
    for keyword, pattern in (("province", r"province of (\w+)"), ("month", r"every (\w+)"), ("join", r"joined in (\d+)"),
                             ("born", r"born in (\w+)"), ("founded?", r"founded in (\d+)"), ("based", r"based in (\w+)")):
        if re.search(keyword, q):
            yield answer(re.search(pattern, page).group(1))
            return
    raise AssertionError(f"the naive reader does not know this question: {q}")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_naive_reader_solves_every_task_without_ambiguity(name):
    """Why its failures above 0 mean something: at 0 it earns the reward on every task."""
    env = gym.make(ENVS[name], world={"seed": 2, "difficulty": 4})
    policy = naive_knowledge if name == "knowledge" else naive_web
    rewards = [play(env, i, policy)[0] for i in range(60)]
    assert rewards == [1.0] * 60


def replay_and_compare(name: str, ambiguity: float, seeds=(0, 1, 2), n: int = 80) -> dict[str, float]:
    """Gold and naive rewards on every task: the gold trace must earn 1 and use only what it saw."""
    naive_policy = naive_knowledge if name == "knowledge" else naive_web
    ambiguous = naive_failed = 0
    for seed in seeds:
        env = gym.make(ENVS[name], world={"seed": seed, "difficulty": 4, "ambiguity": ambiguity})
        for i in range(n):
            obs, _ = env.reset(options={"index": i})
            task = env.unwrapped.task
            seen = obs
            for k, action in enumerate(task.gold_trace):
                call = TOOL_CALL.search(action)
                if call is not None and k > 0:  # arguments come from what the episode showed
                    arg = call.group(2).strip()
                    assert all(word in seen for word in arg.split()), f"{task.id} step {k}: {arg!r} unseen"
                obs, reward, terminated, truncated, info = env.step(action)
                seen += obs
            assert (reward, terminated, truncated) == (1.0, True, False), f"{task.id}: {info}"
            assert info["tool_calls"] == task.metadata["tool_calls"]
            if task.metadata["ambiguous"]:
                ambiguous += 1
                naive_failed += play(env, i, naive_policy)[0] < 1.0
    return {"ambiguous": ambiguous / (len(seeds) * n), "naive_fails": naive_failed / max(ambiguous, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENVS))
def test_gold_traces_resolve_ambiguity_and_the_naive_reader_does_not(name):
    """Every gold trace earns 1 at ambiguity 0.5 and 1 (240 tasks each), the share of ambiguous
    tasks grows with the setting, and the naive first-hit reader fails on many of them."""
    half, full = replay_and_compare(name, 0.5), replay_and_compare(name, 1.0)
    # web: one organisation per task, so the share is the setting; knowledge: hops meet several
    # entities, and cities and universities have no rivals
    assert 0.3 < half["ambiguous"] < full["ambiguous"]
    assert full["ambiguous"] == 1.0 if name == "web" else full["ambiguous"] > 0.6
    for measured in (half, full):
        assert measured["naive_fails"] > (0.5 if name == "web" else 0.25), measured


@pytest.mark.parametrize("name", sorted(ENVS))
def test_tasks_without_rivals_keep_their_question_and_answer(name):
    """Ambiguity adds rivals and draws only where a task meets one: the other tasks ask what the
    world without rivals asks."""
    plain, half = make_world(name, seed=4, difficulty=4), make_world(name, seed=4, difficulty=4, ambiguity=0.5)
    unchanged = 0
    for i in range(100):
        if not half[i].metadata["ambiguous"]:
            unchanged += 1
            assert (half[i].question, half[i].answers) == (plain[i].question, plain[i].answers)
        assert "ambiguous" not in plain[i].metadata
    assert unchanged > 20


def test_knowledge_rivals_share_a_name_or_a_first_word_and_changed_facts_keep_an_old_page():
    w = make_world("knowledge", seed=1, ambiguity=1.0)
    titles = Counter(d["title"] for d in w.corpus)
    by_id = {d["id"]: d for d in w.corpus}
    kinds = Counter()
    for r in w.rivals:
        base = w.entities[r.id.rsplit("-", 1)[0]]
        own = by_id[f"kb1-{base.id}"]["text"]
        if r.id.endswith("-namesake"):
            kinds["namesake"] += 1
            assert r.name == base.name and r.word != base.word and base.descriptor and r.descriptor != base.descriptor
            assert own.startswith(f"{base.name} is a") and by_id[f"kb1-{r.id}"]["text"] != own
        else:
            kinds["near"] += 1
            assert r.name != base.name and r.name.split()[0] == base.name.split()[0] and titles[r.name] == 1
    for e in w.entities.values():
        for rel, (old, listed, since) in e.history.items():
            kinds["changed"] += 1
            assert listed < since and old != e.facts[rel]
            assert f"from {w.entities[old].ref} to {w.entities[e.facts[rel]].ref} in {since}" in by_id[f"kb1-{e.id}"]["text"]
            assert by_id[f"kb1-{e.id}-{listed}"]["text"].startswith(f"Listed in {listed}: ")
    assert min(kinds.values()) > 20, kinds
    # a descriptor is said wherever the entity is named, so each hop of a question is decidable
    for d in w.corpus:
        for e in w.entities.values():
            if e.descriptor and f"by {e.name}." in d["text"]:
                raise AssertionError(f"{d['id']} names {e.name} without its descriptor: {d['text']}")


def test_web_snippets_are_cut_before_the_facts_that_tell_namesakes_apart():
    w = make_world("web", seed=1, difficulty=4, ambiguity=1.0)
    search = w.make_tools()[0]
    for org in w._site["orgs"][:30]:
        twin = org["namesake"]
        assert twin["name"] == org["name"] and twin["home"] != org["home"]
        assert twin["year"] != org["year"] and twin["town"] is not org["town"]
        shown = search.run(org["name"]).text
        assert org["home"] in shown and twin["home"] in shown
        for o in (org, twin):  # indexed, but past the tool's cut
            assert f"Founded in {o['year']}, based in {o['town']['name']}." in next(
                d["text"] for d in w.corpus if d["id"] == o["home"])
            assert str(o["year"]) not in shown and f"based in {o['town']['name']}" not in shown
        people = w._site["pages"][org["people_url"]]["text"]
        c = org["committee"]
        assert people.index(f"Committee from {c['from']} to {c['elected']}") < people.index(
            f"Committee since {c['elected']}")
    assert all(len(p["text"]) <= w.config.page_chars for p in w.pages)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["configs/sft_tiny_qa.yaml"])
def test_sft_gold_traces_at_ambiguity_one_fit_the_preset(preset):
    """`agent-envs sft` on the gold traces still runs at ambiguity 1: every episode tokenizes with
    the tiny model's tokenizer, replays to its reward and fits the preset's `max_length`; the
    held-out evaluation's response budget covers nearly all of them."""
    from transformers import AutoTokenizer

    from agent_envs.base.config import build_config
    from algorithms.models.tiny import build_tiny_model
    from algorithms.sft import SFTConfig, gold_trace_examples

    cfg = build_config(SFTConfig, preset, ["env_kwargs.world.ambiguity=1"])
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(seed=0))
    env = gym.make(cfg.env, tokenizer=tokenizer, **cfg.env_kwargs).unwrapped
    examples = gold_trace_examples(env, tokenizer, list(range(100)))
    assert max(len(e.ids) for e in examples) <= cfg.max_length
    responses = [len(e.ids) - e.mask.index(1) for e in examples]
    assert sum(r <= cfg.eval_max_response_tokens for r in responses) >= 0.95 * len(responses)
    assert sum(env.tasks[i].metadata["ambiguous"] for i in range(100)) > 50


def test_a_larger_share_keeps_the_rivals_of_a_smaller_one():
    k = {a: make_world("knowledge", seed=2, ambiguity=a) for a in (0.3, 1.0)}
    w = {a: make_world("web", seed=2, ambiguity=a) for a in (0.3, 1.0)}
    for worlds in (k, w):
        small, large = ({d["id"]: d["text"] for d in worlds[a].corpus} for a in (0.3, 1.0))
        assert len(small) < len(large)
        # every passage of the smaller share is in the larger one; the changed texts are the
        # base passages that gained a descriptor or a change (knowledge) or a teaser (web)
        assert set(small) <= set(large)
    assert {r.id for r in k[0.3].rivals} < {r.id for r in k[1.0].rivals}
    assert {p["url"] for p in w[0.3].pages} < {p["url"] for p in w[1.0].pages}
