"""Env step costs, side by side with GEM 0.1.0 (`gem-llm`), the closest peer, when it is there.

    taskset -c 1 python tests/perf/bench_env.py [--peer-python PATH] [--repeat 2000] [--rounds 50]
        [--blocks 5] [--without-rules]

`taskset -c 1` keeps every process of the run on one core, where the ratios hold still from run
to run (unpinned, the scheduler moving the processes moved them by up to 0.2).

What is timed (medians of wall clock and of process CPU time, one thread per side):
- an answer step right after `reset`: the task's golden answer as `<think>..</think><answer>
  The answer is \\boxed{gold}. </answer>` on HotpotQA (ARPO eval split) and MATH500, the same
  tasks and the same text on both sides (every step must earn reward 1; the script checks);
- `reset(seed=i)` on HotpotQA;
- a python tool step right after `reset` on MATH500 (`<python>print(1+1)</python>`, the call run
  and its output observed; GEM: its `PythonCodeTool` in a `ToolEnvWrapper`), in wall clock: the
  call runs in another process on both sides, which the caller's CPU time does not see;
- 64 QA envs answering together: one vector step of 64 answers after a reset, ours
  `ToolVectorEnv` against GEM's `SyncVectorEnv` in next-step autoreset mode (its fastest);
- our procedural worlds (no GEM counterpart): reset and answer step of each family's default id.

GEM lives in its own virtual environment (its pins differ from ours): install the `bench`
extra's list there (`pip install "gem-llm==0.1.0" datasets requests pylatexenc`: GEM and what its
wheel lacks) and name that interpreter with `--peer-python` or `AGENT_ENVS_PEER_PYTHON`. Each side
runs in its own process, started by this script; the sides take turns measure by measure, and who
goes first swaps every block, so machine load hits both alike; the load average is printed before
and after. Without GEM, the B side is our own floor: grading the same answer with the reward
recipe alone, and Gymnasium's `SyncVectorEnv` of the same id.

With GEM, the run ends with the regression floor (docs/benchmarks.md, Environments), in process
CPU time: the QA answer step and the 64-env vector step at 0.6x GEM or better, and every other
step timed against GEM (the math answer step, `reset`, and in wall clock the python tool step)
ahead of it. Each check prints PASS or FAIL, and a miss exits with status 1.

`--without-rules` adds a third side, ours with the format rule and the action parse replaced by
constants (an experiment, not a configuration: every answer then counts as well formed), on the
QA step and the vector step: what a step costs without two of its rules, against GEM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
os.environ.update(THREADS)
PEER_ENV = "AGENT_ENVS_PEER_PYTHON"
N_VEC = 64
QA_FILE, MATH_FILE = "hotpotqa/arpo_eval_200.jsonl", "math500/test.jsonl"
WORLD_IDS = ("AgentQA-v0", "AgentMath-v0", "AgentSearch-v0")
TOOL_ACTION, TOOL_OUTPUT = "<python>print(1+1)</python>", "2"
FLOOR = 0.6  # of GEM's speed, for the QA answer step and the vector step (docs/benchmarks.md)


def answer_text(gold: str) -> str:
    return f"<think> The passages say so. </think> <answer> The answer is \\boxed{{{gold}}}. </answer>"


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class Clock:
    """Wall-clock and process CPU time (all its threads: work a side hands to a loop thread
    counts) of each `with` block. CPU time leaves out the time the process waited for a core, so
    it holds still on a loaded machine where the wall clock does not."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)

    def samples(self, name: str) -> dict[str, list[float]]:
        return {name: self.wall, f"{name}_cpu": self.cpu}


# -- the two sides: each a process answering one measurement per request -----------------------


class Ours:
    """Our envs through `gymnasium.make`, and the in-process baselines of the no-peer mode."""

    def __init__(self, data_dir: str, without_rules: bool = False) -> None:
        os.environ.setdefault("AGENT_ENVS_DATA_DIR", data_dir)
        import gymnasium as gym

        import agent_envs  # noqa: F401  (registers the ids)
        from agent_envs.core.vector import ToolVectorEnv

        if without_rules:
            _drop_rules()

        self.gym, self.vector = gym, ToolVectorEnv
        self.envs = {"qa": gym.make("AgentQA-HotpotQA-v0"), "math": gym.make("AgentMath-MATH500-v0")}
        self.envs.update({i: gym.make(i) for i in WORLD_IDS})

    def answer(self, env) -> str:
        task = env.unwrapped.task
        return task.gold_trace[-1] if task.gold_trace else answer_text(task.answers[0])

    def steps(self, kind: str, n: int, start: int) -> dict:
        env = self.envs[kind]
        resets, steps, rewards = Clock(), Clock(), []
        for i in range(start, start + n):
            with resets:
                env.reset(seed=i)
            action = self.answer(env)
            with steps:
                reward = env.step(action)[1]
            rewards.append(reward)
        return {**resets.samples("reset"), **steps.samples("step"), "reward": statistics.fmean(rewards)}

    def tool_steps(self, n: int, start: int) -> dict:
        return _tool_steps(self.envs["math"], n, start)

    def grading_floor(self, kind: str, n: int, start: int) -> dict:
        """The reward recipe alone on the same answers: the floor an answer step cannot beat."""
        env = self.envs[kind]
        recipe, times = env.unwrapped.reward_fn, Clock()
        for i in range(start, start + n):
            env.reset(seed=i)
            task, action = env.unwrapped.task, self.answer(env)
            with times:
                recipe(task, action, True, {})
        return times.samples("step")

    def vec(self, rounds: int, start: int, sync: bool = False) -> dict:
        key = "vec_sync" if sync else "vec"
        if key not in self.envs:
            self.envs[key] = (self.gym.make_vec("AgentQA-HotpotQA-v0", num_envs=N_VEC, vectorization_mode="sync")
                              if sync else self.vector.make("AgentQA-HotpotQA-v0", num_envs=N_VEC))
        venv, times, rewards = self.envs[key], Clock(), []
        for r in range(start, start + rounds):
            venv.reset(seed=r * N_VEC)
            actions = [self.answer(e) for e in venv.envs]
            with times:
                out = venv.step(actions)
            rewards.append(float(out[1].mean()))
        return {**times.samples("step"), "reward": statistics.fmean(rewards)}


def _tool_steps(env, n: int, start: int) -> dict:
    """A python call right after each reset; `ok`: the share of observations showing its output."""
    times, ok = Clock(), []
    for i in range(start, start + n):
        env.reset(seed=i)
        with times:
            obs = env.step(TOOL_ACTION)[0]
        ok.append(float(TOOL_OUTPUT in obs))
    return {**times.samples("step"), "ok": statistics.fmean(ok)}


def _drop_rules() -> None:
    """In this worker process only: the inline tag protocol's format rule and action parse become
    constants (every action an answer, every response well formed), the rest of the step as
    shipped."""
    from agent_envs.core.protocols.arpo import ArpoTags
    from agent_envs.core.protocols.base import ParsedAction

    ArpoTags.check_format = lambda self, response, prefill="": (True, None)
    ArpoTags.parse = lambda self, action, tools: ParsedAction("answer", action, None, None, None, ())


class Gem:
    """GEM 0.1.0's QaEnv and MathEnv over the same files, and its SyncVectorEnv."""

    def __init__(self, data_dir: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        import datasets
        from gem.envs.math_env import MathEnv
        from gem.envs.qa_env import QaEnv
        from gem.tools.python_code_tool import PythonCodeTool
        from gem.tools.tool_env_wrapper import ToolEnvWrapper
        from gem.vector.sync_vector_env import SyncVectorEnv
        from gem.vector.vector_env import AutoresetMode

        datasets.disable_progress_bars()

        def rows(rel: str) -> datasets.Dataset:
            with open(os.path.join(data_dir, rel), encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
            return datasets.Dataset.from_list(
                [{"question": r["question"], "answer": r["golden_answers"]} for r in records])

        qa, math = rows(QA_FILE), rows(MATH_FILE)
        # extract_boxed: GEM reads the same \boxed{} answer our envs read (its default reads the
        # whole <answer> block, which the shared answer text would fail)
        self.envs = {"qa": QaEnv(dataset=qa, extract_boxed=True),
                     "math": MathEnv(dataset=math, question_key="question"),
                     "math_inproc": MathEnv(dataset=math, question_key="question", use_mp=False),
                     "math_python": ToolEnvWrapper(MathEnv(dataset=math, question_key="question"), [PythonCodeTool()])}
        self.make_vec = lambda: SyncVectorEnv(
            ["qa"] * N_VEC, [lambda: QaEnv(dataset=qa, extract_boxed=True) for _ in range(N_VEC)],
            autoreset_mode=AutoresetMode.NEXT_STEP)

    @staticmethod
    def gold(env) -> str:
        answer = env.answer
        return str(answer[0] if isinstance(answer, list) else answer)

    def steps(self, kind: str, n: int, start: int) -> dict:
        env = self.envs[kind]
        resets, steps, rewards = Clock(), Clock(), []
        for i in range(start, start + n):
            with resets:
                env.reset(seed=i)
            action = answer_text(self.gold(env))
            with steps:
                reward = env.step(action)[1]
            rewards.append(float(reward))
        return {**resets.samples("reset"), **steps.samples("step"), "reward": statistics.fmean(rewards)}

    def tool_steps(self, n: int, start: int) -> dict:
        return _tool_steps(self.envs["math_python"], n, start)

    def vec(self, rounds: int, start: int) -> dict:
        if not hasattr(self, "venv"):
            self.venv = self.make_vec()
        times, rewards = Clock(), []
        for r in range(start, start + rounds):
            self.venv.reset(seed=r * N_VEC)
            actions = [answer_text(self.gold(e)) for e in self.venv.envs]
            with times:
                out = self.venv.step(actions)
            rewards.append(float(out[1].mean()))
        return {**times.samples("step"), "reward": statistics.fmean(rewards)}


def serve(side: str, data_dir: str) -> None:
    """Worker loop: one JSON request per stdin line, one JSON answer per stdout line."""
    worker = Gem(data_dir) if side == "gem" else Ours(data_dir, without_rules=side == "ours-bare")
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries that print must not corrupt the answers
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        result = getattr(worker, request.pop("call"))(**request)
        out.write(json.dumps(result) + "\n")
        out.flush()


class Side:
    """A worker process of one side, and the samples collected from it per measurement."""

    def __init__(self, python: str, side: str, data_dir: str) -> None:
        env = {**os.environ, **THREADS, "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen([python, __file__, "--serve", side, "--data-dir", data_dir],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {side} benchmark worker ({python}) did not start; its error is above")
        self.name = side
        self.samples: dict[str, dict[str, list]] = {}

    def ask(self, name: str, **request: object) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker died during {name!r}; its error is above")
        for key, value in json.loads(line).items():
            self.samples.setdefault(name, {}).setdefault(key, [])
            self.samples[name][key] += value if isinstance(value, list) else [value]

    def median_us(self, name: str, key: str = "step") -> float:
        return median_us(self.samples[name][key])

    def reward(self, name: str) -> float:
        return statistics.fmean(self.samples[name]["reward"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _floor_request(request: dict) -> dict:
    """The in-process baseline of one of our measurements (no-peer mode)."""
    if request["call"] == "vec":
        return {**request, "name": "vec_sync", "sync": True}
    return {**request, "name": f"{request['kind']}_floor", "call": "grading_floor"}


def _swapped(pairs: list) -> list:
    """The same requests with each A/B pair in the other order."""
    out = list(pairs)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", default=os.environ.get(PEER_ENV),
                        help=f"interpreter of a venv with gem-llm 0.1.0 (default: ${PEER_ENV}, else this one if it has gem)")
    parser.add_argument("--repeat", type=int, default=2000, help="single-env steps per side")
    parser.add_argument("--rounds", type=int, default=50, help="64-env vector steps per side")
    parser.add_argument("--blocks", type=int, default=5, help="turns each side takes (A, B, A, B, ...)")
    parser.add_argument("--data-dir", default=None,
                        help="benchmark data folder (default: $AGENT_ENVS_DATA_DIR, else shared/data beside the repository)")
    parser.add_argument("--without-rules", action="store_true",
                        help="also time our QA and vector steps with the format rule and the parse replaced by constants")
    parser.add_argument("--serve", choices=("ours", "ours-bare", "gem"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = args.data_dir or os.environ.get("AGENT_ENVS_DATA_DIR") or str(REPO.parent / "shared" / "data")
    if not data_dir or not os.path.isdir(data_dir):
        sys.exit(f"benchmark data folder {data_dir!r} not found: set AGENT_ENVS_DATA_DIR or pass --data-dir")
    if args.serve:
        return serve(args.serve, data_dir)
    peer = args.peer_python
    if peer is None:
        import importlib.util

        peer = sys.executable if importlib.util.find_spec("gem") else None
    ours = Side(sys.executable, "ours", data_dir)
    gem = Side(peer, "gem", data_dir) if peer else None
    bare = Side(sys.executable, "ours-bare", data_dir) if args.without_rules else None
    print(load())
    n, r = max(1, args.repeat // args.blocks), max(1, args.rounds // args.blocks)
    for b in range(args.blocks):
        # A and B take turns measure by measure, on the same seeds, and swap who goes first every
        # block: neither side always runs right after the other (CPU schedulers favour a
        # process that just slept).
        pairs = [(ours, dict(name="qa", call="steps", kind="qa", n=n, start=b * n)),
                 (ours, dict(name="math", call="steps", kind="math", n=n, start=b * n)),
                 (ours, dict(name="vec", call="vec", rounds=r, start=b * r))]
        tool = dict(name="tool", call="tool_steps", n=max(1, n // 20), start=b * n)  # milliseconds a step
        if gem is None:
            pairs = [p for mine in pairs for p in (mine, (ours, _floor_request(mine[1])))] + [(ours, tool)]
        else:
            theirs = [dict(name="qa", call="steps", kind="qa", n=n, start=b * n),
                      dict(name="math", call="steps", kind="math", n=max(1, n // 10), start=b * n),  # ~5 ms a step
                      dict(name="vec", call="vec", rounds=r, start=b * r)]
            pairs = [p for mine, other in zip(pairs, theirs, strict=True) for p in (mine, (gem, other))]
            pairs += [(ours, tool), (gem, tool)]
            pairs.append((gem, dict(name="math_inproc", call="steps", kind="math_inproc", n=max(1, n // 10),
                                    start=b * n)))
        if bare is not None:
            pairs += [(bare, dict(name="qa", call="steps", kind="qa", n=n, start=b * n)),
                      (bare, dict(name="vec", call="vec", rounds=r, start=b * r))]
        for side, request in pairs if b % 2 == 0 else _swapped(pairs):
            side.ask(**request)
        for kind in WORLD_IDS:
            ours.ask(name=kind, call="steps", kind=kind, n=n, start=b * n)
    report(ours, gem, args)
    if bare is not None:
        report_without_rules(ours, bare, gem)
    misses = check_floor(ours, gem) if gem is not None else []
    if gem is None:
        print("\nfloor: not checked (it is against GEM: --peer-python)")
    print(load())
    for side in (ours, gem, bare):
        if side is not None:
            side.close()
    if misses:
        raise SystemExit(f"below the floor: {', '.join(misses)}")


def report(ours: Side, gem: Side | None, args: argparse.Namespace) -> None:
    for name in ("qa", "math", *WORLD_IDS, "vec"):
        if ours.reward(name) != 1.0:
            raise SystemExit(f"our {name} answers earned {ours.reward(name):.3f}, not 1: the benchmark is broken")
    for side in (ours, gem):
        if side is not None and statistics.fmean(side.samples["tool"]["ok"]) != 1.0:
            raise SystemExit(f"a python call's output was missing from an observation ({side.name}): the benchmark is broken")
    if gem is not None:
        for name in ("qa", "vec"):
            if gem.reward(name) != 1.0:
                raise SystemExit(f"GEM's {name} answers earned {gem.reward(name):.3f}, not 1: the benchmark is broken")
    b_side, b_name = (gem, "GEM 0.1.0") if gem else (ours, "floor")
    rows = [("QA answer step (HotpotQA)", "qa", "step", "qa" if gem else "qa_floor"),
            ("math answer step (MATH500)", "math", "step", "math" if gem else "math_floor")]
    if gem:
        rows += [("  GEM math, use_mp=False", "math", "step", "math_inproc"),
                 ("reset(seed) (HotpotQA)", "qa", "reset", "qa")]
    else:
        print(f"\nno GEM interpreter (--peer-python or ${PEER_ENV}): B is our own floor, grading alone "
              "and gymnasium's SyncVectorEnv")
    print(f"\nmedians of {args.repeat} steps / {args.rounds} vector rounds per side, {args.blocks} alternating blocks;"
          " A/B > 1: ours is faster")
    print(f"{'':<28} {'wall clock':^36}   {'process CPU time':^36}")
    print(f"{'measure':<28} {'ours':>11} {b_name:>11} {'B/A':>10}   {'ours':>11} {b_name:>11} {'B/A':>10}")
    for label, a, key, b in rows:
        cells = []
        for k in (key, f"{key}_cpu"):
            x, y = ours.median_us(a, k), b_side.median_us(b, k)
            cells.append(f"{x:8.1f} us {y:8.1f} us {y / x:9.2f}x")
        print(f"{label:<28} " + "   ".join(cells))
    b_vec = "vec" if gem else "vec_sync"
    cells = []
    for k in ("step", "step_cpu"):
        x = N_VEC / statistics.median(ours.samples["vec"][k])
        y = N_VEC / statistics.median(b_side.samples[b_vec][k])
        cells.append(f"{x:6.0f} st/s {y:6.0f} st/s {x / y:9.2f}x")
    print(f"{'64 QA envs answering':<28} " + "   ".join(cells))
    x = ours.median_us("tool") / 1000
    y = f"{gem.median_us('tool') / 1000:8.2f} ms {gem.median_us('tool') / 1000 / x:9.2f}x" if gem else ""
    print(f"{'python tool step (MATH500)':<28} {x:8.2f} ms {y}   (wall clock only: the call runs in another process)")
    if gem:
        print("(GEM: QaEnv(extract_boxed=True), MathEnv defaults (use_mp=True), SyncVectorEnv in next-step "
              f"autoreset; its math reward on the MATH500 golds: {gem.reward('math'):.3f})")
    print("\nprocedural worlds (ours only)           wall clock            process CPU time")
    for env_id in WORLD_IDS:
        print(f"{env_id:<24} reset(seed) {ours.median_us(env_id, 'reset'):6.1f} us answer {ours.median_us(env_id):6.1f} us"
              f"   reset(seed) {ours.median_us(env_id, 'reset_cpu'):6.1f} us answer {ours.median_us(env_id, 'step_cpu'):6.1f} us")


def check_floor(ours: Side, gem: Side) -> list[str]:
    """Print PASS or FAIL for each check of the floor, in process CPU time; return the misses."""
    qa = gem.median_us("qa", "step_cpu") / ours.median_us("qa", "step_cpu")
    vec = statistics.median(gem.samples["vec"]["step_cpu"]) / statistics.median(ours.samples["vec"]["step_cpu"])
    math = gem.median_us("math", "step_cpu") / ours.median_us("math", "step_cpu")
    reset = gem.median_us("qa", "reset_cpu") / ours.median_us("qa", "reset_cpu")
    tool = gem.median_us("tool") / ours.median_us("tool")
    checks = [("QA answer step", qa, FLOOR), ("64 QA envs answering", vec, FLOOR),
              ("math answer step", math, 1.0), ("reset(seed)", reset, 1.0), ("python tool step", tool, 1.0)]
    print("\nfloor (ours against GEM, process CPU time, the tool step wall clock; > 1: ours is faster)")
    misses = []
    for label, ratio, least in checks:
        ok = ratio >= least if least < 1 else ratio > least
        print(f"  {'PASS' if ok else 'FAIL'}  {label:<22} {ratio:6.3f}x  (needs {'>=' if least < 1 else '>'} {least:g}x)")
        if not ok:
            misses.append(f"{label} {ratio:.3f}x")
    return misses


def report_without_rules(ours: Side, bare: Side, gem: Side | None) -> None:
    if bare.reward("qa") != 1.0 or bare.reward("vec") != 1.0:
        raise SystemExit("our answers without the format rule and parse did not all earn 1: the benchmark is broken")
    b_side, b_name = (gem, "GEM") if gem else (ours, "ours")
    step, b_step = bare.median_us("qa", "step_cpu"), b_side.median_us("qa", "step_cpu")
    vec = N_VEC / statistics.median(bare.samples["vec"]["step_cpu"])
    b_vec = N_VEC / statistics.median(b_side.samples["vec"]["step_cpu"])
    print(f"\nours without the format rule and parse (process CPU time), against {b_name}:")
    print(f"  QA answer step {step:6.1f} us against {b_step:6.1f} us: {b_step / step:.2f}x")
    print(f"  64 QA envs     {vec:6.0f} st/s against {b_vec:6.0f} st/s: {vec / b_vec:.2f}x")


if __name__ == "__main__":
    main()
