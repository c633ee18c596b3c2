"""`ToolEnv`: one multi-turn, tool-using episode as a Gymnasium environment.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentMath-v0")
    >>> prompt, info = env.reset(seed=0)
    >>> for action in env.unwrapped.task.gold_trace:
    ...     obs, reward, terminated, truncated, info = env.step(action)
    >>> reward, terminated
    (1.0, True)

An action is one generated segment: text ending at a stop string (a tool call) or at EOS. The
observation after a tool call is only the new text to append (the wrapped tool result), never
the whole history. `terminated` when the model gave its answer (or stopped), `truncated` on the
turn limit or the response budget; never both. Reward components are in `info`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from typing import Protocol as TypingProtocol

import gymnasium as gym

from agent_envs.base.messages import MESSAGES
from agent_envs.base.reward import RewardResult
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.core.env_config import ToolEnvConfig
from agent_envs.core.protocols import PROMPT_VERSION, ParsedAction, make_protocol
from agent_envs.core.spaces import UnicodeText
from agent_envs.rewards.recipe import RewardFn, grader, make_reward

StepResult = tuple[str, float, bool, bool, dict]

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The event loop that runs the blocking `step()` of every env in this process.

    One long-lived loop (in a daemon thread) rather than `asyncio.run` per step, so tools can keep
    loop-bound resources (HTTP sessions, worker pipes) across steps and envs.
    """
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="agent-envs-loop", daemon=True).start()
            if _LOOP is None:
                atexit.register(_shut_down_background_loop)
            _LOOP = loop
        return _LOOP


def _shut_down_background_loop() -> None:
    """At interpreter exit, finalise the loop's async generators, then stop it.

    A daemon thread is killed without unwinding, so nothing on its loop would ever close:
    finalising the generators closes the HTTP sessions pooled on the loop (`SessionPool` parks
    one per session for this), which otherwise end the process with "Unclosed client session".
    """
    loop = _LOOP
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    with contextlib.suppress(Exception):  # a wedged loop must not hang the exit
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)


def _encodable(action: str) -> str:
    """The action with lone surrogates and other unencodable text replaced: never allowed to crash
    a tokenizer. ASCII text has none, and most actions are ASCII."""
    return action if action.isascii() else action.encode("utf-8", "replace").decode("utf-8")


class PromptSetup(NamedTuple):
    """What the prompt and the parser need of the env's configuration, built once (`_prompt_setup`):
    the `tools` dict and system prompt text it was built from, to notice when either is replaced."""

    built_from_tools: Mapping[str, Tool]
    built_from_text: str | None
    tools: tuple[Tool, ...]  # a tuple: a protocol may key a cache on it (`ArpoTags.parse`)
    system: str
    stops: list[str]


class TaskSource(TypingProtocol):
    """Anything indexable that yields tasks: a list of `Task`, a benchmark, a procedural world."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Task: ...


@dataclass(frozen=True)
class EpisodeState:
    """Everything that changes during an episode. Immutable: `fork()` shares it, steps replace it."""

    task: Task
    index: int
    prompt: str
    messages: tuple[dict, ...]
    segments: tuple[tuple[str, bool], ...] = ()  # (text, written by the model?)
    calls: tuple[tuple[str, int], ...] = ()  # per-tool call counts, as sorted pairs
    queries: frozenset[str] = frozenset()
    invalid_calls: int = 0
    failed_calls: int = 0  # tool calls that ran and failed (timeouts, server errors)
    turns: int = 0
    chars: int = 0
    tokens: int = 0
    limit_hit: bool = False
    flags: tuple[str, ...] = ()
    done: bool = False

    def evolve(self, **changes: Any) -> EpisodeState:
        """A copy with `changes` applied: `dataclasses.replace` without the frozen `__init__`,
        which costs six times as much and would take the 64-env vector step below its floor
        against GEM (docs/benchmarks.md, Environments)."""
        new = object.__new__(EpisodeState)
        new.__dict__.update(self.__dict__, **changes)
        return new

    @property
    def response(self) -> str:
        return "".join([text for text, _ in self.segments])

    @property
    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)


@dataclass
class ToolMetrics:
    """Per-env counters of tool use, for rollout metrics.

    `failures` counts failed calls per tool; `errors` counts them per cause (`ToolResult.error`:
    `timeout`, `http_500`, `reset`, `refused`, ...), and `retries` the retries the calls spent.
    """

    calls: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    retries: int = 0
    timeouts: int = 0
    cache_hits: int = 0
    total_time_s: float = 0.0
    max_time_s: float = 0.0


class ToolEnv(gym.Env[str, str]):
    """A text environment where the agent reasons, calls tools and answers.

    Args:
        tasks: the tasks to play (a list of `Task`, a benchmark, or a procedural world).
        tools: the enabled tools; their names are the protocol's tags / function names.
        config: the settings (`ToolEnvConfig`, or a family's subclass of it); or give them as
            keywords, `ToolEnv(tasks, tools, max_tool_calls=2)`, checked the same way. Each key's
            meaning and default: `ToolEnvConfig`, or `agent-envs play --help`.
    """

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, tasks: TaskSource, tools: Sequence[Tool] = (), config: ToolEnvConfig | None = None,
                 **settings: Any) -> None:
        if config is None:
            config = ToolEnvConfig.of(settings)
        elif settings:
            raise TypeError(f"ToolEnv takes its settings as a config or as keywords, not both (got {sorted(settings)})")
        if len(tasks) == 0:
            raise ValueError("ToolEnv needs at least one task; the task source is empty")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.config = config
        self.tasks = tasks
        self.tools = {t.name: t for t in tools}
        self.protocol = make_protocol(config.protocol, config.tokenizer)
        self.reward_fn = make_reward(config.reward, **config.reward_kwargs)  # the setter picks its grader
        self.max_tool_calls = config.max_tool_calls
        self.max_calls_per_tool = dict(config.max_calls_per_tool)
        self.max_turns = config.max_turns if config.max_turns is not None else config.max_tool_calls + 4
        self.max_response_chars = config.max_response_chars
        self.max_response_tokens = config.max_response_tokens
        self.tokenizer = config.tokenizer
        self.prefill = config.prefill if config.prefill is not None else self.protocol.generation_prefill(self.tokenizer)
        self.tool_timeout_s = config.tool_timeout_s
        self.system_prompt_text = config.system_prompt
        self.render_mode = config.render_mode
        self.observation_space = UnicodeText(max_length=1 << 24)
        self.action_space = UnicodeText(max_length=1 << 24)
        self.metrics = ToolMetrics()
        self.state: EpisodeState | None = None
        self._setup: PromptSetup | None = None  # see `_prompt_setup`
        self._sessions: dict[str, Tool] = {}  # this episode's sessions of stateful tools (`_tool_for`)

    # -- public API -------------------------------------------------------------------------

    @property
    def task(self) -> Task:
        if self.state is None:
            raise RuntimeError("no task yet: call reset() first")
        return self.state.task

    @property
    def reward_fn(self) -> RewardFn:
        """The reward: a `RewardRecipe` or a callable (see `agent_envs.rewards.recipe`)."""
        return self._reward_fn

    @reward_fn.setter
    def reward_fn(self, reward: RewardFn) -> None:
        self._reward_fn, self._grade = reward, grader(reward)

    @property
    def stop_sequences(self) -> list[str]:
        return list(self._prompt_setup().stops)

    def format_observation(self, text: str, tool: str | None = None) -> str:
        return self.protocol.format_observation(text, tool)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if self._sessions:
            self._end_sessions()
        options = options or {}
        if "task" in options:
            task, index = options["task"], -1
        else:
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(len(self.tasks)))
            elif not 0 <= index < len(self.tasks):
                raise IndexError(f"options['index']={index} is out of range for {len(self.tasks)} tasks")
            task = self.tasks[index]
        setup = self._prompt_setup()
        tools, stops = setup.tools, setup.stops
        messages = self.protocol.messages(task.question, tools, setup.system)
        prompt = self.protocol.render_prompt(messages, self.tokenizer, tools)
        self.state = EpisodeState(task, index, prompt, tuple(messages))
        info: dict[str, Any] = {
            "messages": messages,
            "task_id": task.id,
            "index": index,
            "stop_sequences": list(stops),
            "prompt_version": PROMPT_VERSION,
        }
        if self.tokenizer is not None:
            info["prompt_token_ids"] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return prompt, info

    def step(self, action: str) -> StepResult:
        # `_get_running_loop` answers None where `get_running_loop` would raise: no exception per step
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("step() was called inside a running event loop; use `await env.astep(action)` there")
        result = self._step(action)
        if type(result) is tuple:  # nothing to wait for: no event-loop round trip
            return result
        return asyncio.run_coroutine_threadsafe(result, background_loop()).result()

    async def astep(self, action: str) -> StepResult:
        result = self._step(action)
        return result if type(result) is tuple else await result

    def truncate(self, why: str = "response_budget") -> tuple[float, dict]:
        """End the episode from outside, e.g. when a runner's token budget ran out: the partial
        response is scored by the same finishing code as a truncation inside `step`, so an episode
        cut off by a runner scores like one cut off by the env (in an event loop: `atruncate`)."""
        result = self._truncation(why)
        if type(result) is not tuple:  # a judge or the symbolic stage: wait for it on the env's loop
            result = _wait_on_background_loop(result)
        return result[1], result[4]

    async def atruncate(self, why: str = "response_budget") -> tuple[float, dict]:
        """`truncate` inside an event loop: a grade that must wait (a judge) is awaited here."""
        result = self._truncation(why)
        if type(result) is not tuple:
            result = await result
        return result[1], result[4]

    def _truncation(self, why: str) -> StepResult | Coroutine[Any, Any, StepResult]:
        st = self.state
        if st is None or st.done:
            raise RuntimeError("truncate() needs an episode in progress")
        return self._finish(st, {"stop_reason": "truncated"}, True, why)

    def fork(self) -> ToolEnv:
        """An independent copy at the current point of the episode.

        The episode state is immutable and shared; tools, task source and tokenizer are shared
        (they are stateless or safe to share); the RNG and metrics are the copy's own.
        """
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.metrics = ToolMetrics()
        twin._sessions = {name: session.fork() for name, session in self._sessions.items()}
        if self._np_random is not None:
            twin._np_random = gym.utils.seeding.np_random(int(self._np_random.integers(1 << 31)))[0]
        return twin

    def get_state(self) -> EpisodeState | None:
        return self.state

    def set_state(self, state: EpisodeState) -> None:
        self.state = state

    def render(self) -> str | None:
        if self.state is None:
            return None
        text = self.state.prompt + self.state.response
        if self.render_mode == "human":
            print(text)
            return None
        return text

    async def aclose(self) -> None:
        """Release the tools' pooled resources held on the running loop; tools reopen them if used again."""
        self._end_sessions()
        for tool in self.tools.values():
            await tool.aclose()

    def close(self) -> None:
        """Release what `step()` opened: the tools' sessions and workers on the background loop.

        Tools may be shared with other envs of this process; they reopen what they need on their
        next call. Sessions opened by `astep` on a caller's loop are released by `await aclose()`.
        """
        self._end_sessions()
        loop = _LOOP
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()

    # -- internals --------------------------------------------------------------------------

    def _prompt_setup(self) -> PromptSetup:
        """The enabled tools as a list, the system prompt and the stop strings: built once, not on
        every reset and step, and again only when `tools` or `system_prompt_text` is replaced
        (the prompting baselines swap both on a built env)."""
        setup = self._setup
        if setup is None or setup.built_from_tools is not self.tools or setup.built_from_text is not self.system_prompt_text:
            tools = tuple(self.tools.values())
            text = self.system_prompt_text
            system = text if text is not None else self.protocol.system_prompt(tools)
            setup = self._setup = PromptSetup(self.tools, text, tools, system, self.protocol.stop_sequences(list(self.tools)))
        return setup

    def _step(self, action: str) -> StepResult | Coroutine[Any, Any, StepResult]:
        """The one step behind `step`, `astep` and the vector env: the result at once when nothing
        needs waiting (an answer graded in-process, a budget end), else an awaitable of it (a tool
        call, a judge request, the symbolic math stage). A round trip to the event loop's thread costs
        tens of microseconds, more than a whole answer step (docs/benchmarks.md, Environments)."""
        st, parsed, info, truncated, why = self._begin(action)
        if why is None:
            return self._act(st, parsed, info)
        return self._finish(st, info, truncated, why)

    def _begin(self, action: str) -> tuple[EpisodeState, ParsedAction, dict, bool, str | None]:
        """Validate and parse an action; say how the episode ends (truncated, why) when no tool runs:
        `why` is None when one does."""
        st = self.state
        if st is None:
            raise RuntimeError("step() before reset(): call env.reset() first")
        if st.done:
            raise RuntimeError(f"episode of task {st.task.id!r} is over; call env.reset() before stepping again")
        if not isinstance(action, str):
            raise TypeError(f"an action is the text of one generated segment (str), got {type(action).__name__}")
        parsed = self.protocol.parse(_encodable(action), self._prompt_setup().tools)
        ends = parsed.kind in ("answer", "end")  # marked done in the same copy: one fewer per answer
        text = parsed.text
        st = self._append(st, text, by_model=True, turns=st.turns + 1, flags=st.flags + parsed.flags, done=ends)
        info: dict[str, Any] = {
            "parsed_action": text,
            "tool": parsed.tool,
            "tool_input": parsed.tool_input,
            "stop_reason": parsed.kind,
            "flags": list(parsed.flags),
        }
        if st.chars > self.max_response_chars or (self.tokenizer is not None and self._over_budget(st)):
            return st, parsed, info, True, "response_budget"
        if ends:
            return st, parsed, info, False, parsed.kind
        return st, parsed, info, False, None

    async def _act(self, st: EpisodeState, parsed: ParsedAction, info: dict) -> tuple[str, float, bool, bool, dict]:
        """Run (or refuse) the tool call and append its observation."""
        text, st = await self._run_tool(st, parsed, info)
        obs = self.protocol.format_observation(text, parsed.tool)
        grown = self._append(st, obs, by_model=False)
        if self._over_budget(grown):
            return await _settled(self._finish(st, info, True, "response_budget"))
        st = grown
        if st.turns >= self.max_turns:
            return await _settled(self._finish(st, info, True, "max_turns"))
        self.state = st
        self._add_episode_info(info, st)
        return obs, 0.0, False, False, info

    def _append(self, st: EpisodeState, text: str, by_model: bool, **changes: Any) -> EpisodeState:
        """`st` with `text` appended to the response, and any other `changes` in the same copy."""
        tokens = st.tokens
        if self.tokenizer is not None and text:
            tokens += len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        changes["segments"] = st.segments + ((text, by_model),)
        changes["chars"] = st.chars + len(text)
        changes["tokens"] = tokens
        return st.evolve(**changes)

    def _over_budget(self, st: EpisodeState) -> bool:
        if st.chars > self.max_response_chars:
            return True
        return self.tokenizer is not None and self.max_response_tokens is not None and st.tokens > self.max_response_tokens

    async def _run_tool(self, st: EpisodeState, parsed: ParsedAction, info: dict) -> tuple[str, EpisodeState]:
        """Execute (or refuse) one call; return the tool text and the updated state."""
        name = parsed.tool or "tool"
        if parsed.kind == "invalid":
            info["invalid_reason"] = parsed.reason
            if parsed.reason == "empty_call":
                text = MESSAGES["empty_call"].format(tool=name)
            else:
                text = MESSAGES["invalid_call"].format(reason=parsed.reason)
            return text, st.evolve(invalid_calls=st.invalid_calls + 1)
        counts = st.call_counts
        total = sum(counts.values())
        if total >= self.max_tool_calls or counts.get(name, 0) >= self.max_calls_per_tool.get(name, 1 << 30):
            info["limit_exceeded"] = True
            return MESSAGES["limit_exceeded"].format(tool=name), st.evolve(limit_hit=True)
        tool = self.tools[name]
        counts[name] = counts.get(name, 0) + 1
        key = f"{name}:{tool.normalize(parsed.tool_input or '')}"
        repeated = tool.dedupe_repeats and key in st.queries
        st = st.evolve(calls=tuple(sorted(counts.items())), queries=st.queries | {key})
        if repeated:  # counts toward the limit but is not executed
            info["repeated_query"] = True
            return MESSAGES["repeated_query"], st
        result = await self._call(self._tool_for(tool), parsed.tool_input or "")
        st = st.evolve(failed_calls=st.failed_calls + (not result.ok))
        info["tool_result"] = {"ok": result.ok, "error": result.error, "latency_s": result.latency_s,
                               "cached": result.cached, "retries": result.retries}
        return result.text, st

    async def _call(self, tool: Tool, arg: str) -> ToolResult:
        deadline = self.tool_timeout_s if self.tool_timeout_s is not None else tool.timeout_s + 1.0
        start = time.perf_counter()
        try:
            result = await asyncio.wait_for(tool(arg), deadline)
        except TimeoutError:
            result = ToolResult(MESSAGES["timeout"].format(seconds=f"{deadline:g}"), ok=False, error="timeout")
        result.latency_s = result.latency_s or time.perf_counter() - start
        m = self.metrics
        m.calls[tool.name] += 1
        m.failures[tool.name] += not result.ok
        if not result.ok:
            m.errors[result.error or "unknown"] += 1
        m.retries += result.retries
        m.timeouts += result.error == "timeout"
        m.cache_hits += result.cached
        m.total_time_s += result.latency_s
        m.max_time_s = max(m.max_time_s, result.latency_s)
        return result

    # -- stateful tools (`session = True`): one session per episode, forked with the env --

    def _tool_for(self, tool: Tool) -> Tool:
        """What a call of `tool` runs on: for a tool with `session = True`, this episode's session
        of it (opened at its first call; `reset` and the episode's end close it, `fork` forks it)."""
        if getattr(tool, "session", False) is not True:
            return tool
        session = self._sessions.get(tool.name)
        if session is None:
            session = self._sessions[tool.name] = tool.open_session()
        return session

    def _end_sessions(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            session.close()

    # -- end of stateful tools --

    def _finish(
        self, st: EpisodeState, info: dict, truncated: bool, why: str,
    ) -> StepResult | Coroutine[Any, Any, StepResult]:
        """End the episode and grade it: the step's result, or an awaitable of it when the grade
        must be awaited (a judge request, the symbolic math stage)."""
        if not st.done:
            st = st.evolve(done=True)
        self.state = st
        if self._sessions:
            self._end_sessions()
        response = st.response
        format_ok, format_error = self.protocol.check_format(response, self.prefill)
        counts = dict(st.calls)
        self._add_episode_info(info, st, counts)
        reward = self._grade(st.task, response, format_ok, counts)
        if isinstance(reward, RewardResult) or not inspect.isawaitable(reward):
            return _ended(info, reward, truncated, why, format_ok, format_error)
        return _ended_later(info, reward, truncated, why, format_ok, format_error)

    @staticmethod
    def _add_episode_info(info: dict, st: EpisodeState, counts: dict[str, int] | None = None) -> None:
        """Write the episode's counters into a step's `info` (in place: it runs on every step)."""
        counts = dict(st.calls) if counts is None else counts
        info["calls_per_tool"] = counts
        info["tool_calls"] = sum(counts.values())
        info["n_invalid_calls"] = st.invalid_calls
        info["tool_errors"] = st.failed_calls
        info["limit_hit"] = st.limit_hit
        info["turns"] = st.turns
        info["prompt_version"] = PROMPT_VERSION


def _ended(
    info: dict, reward: RewardResult, truncated: bool, why: str, format_ok: bool, format_error: str | None,
) -> StepResult:
    """The last step's result: `info` completed with the reward's components and the verdicts."""
    info.update(reward.components)
    score = reward.score
    info["format_ok"] = format_ok
    info["format_error"] = format_error
    info["end_reason"] = why
    info["truncated"] = truncated
    info["reward"] = score
    return "", float(score), not truncated, truncated, info


async def _ended_later(info: dict, reward: Awaitable[RewardResult], *verdicts: Any) -> StepResult:
    return _ended(info, await reward, *verdicts)


async def _settled(result: StepResult | Coroutine[Any, Any, StepResult]) -> StepResult:
    return result if type(result) is tuple else await result


def _wait_on_background_loop(result: Coroutine[Any, Any, StepResult]) -> StepResult:
    """Block until `result` is done on the loop that runs `step()`'s tool calls (where the tools'
    and the judge's sessions live). Called from that loop's own thread, it would wait forever."""
    loop = background_loop()
    if asyncio._get_running_loop() is loop:
        result.close()
        raise RuntimeError("truncate() must wait for a judge or the symbolic math stage, which it cannot do "
                           "on the env's own event loop: call it from another thread")
    return asyncio.run_coroutine_threadsafe(result, loop).result()


__all__ = ["EpisodeState", "PromptSetup", "StepResult", "TaskSource", "ToolEnv"]
