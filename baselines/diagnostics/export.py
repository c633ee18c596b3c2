"""`agent-envs export RUN`: every saved trajectory of a run in the Agent Trajectory Interchange
Format (ATIF v1.7, Harbor RFC 0001), which viewers, SFT and RL tooling of other projects read.

    agent-envs export runs/arpo_tiny                          # RUN/atif/arpo_tiny/step_000001/*.json
    agent-envs export runs/compare --format jsonl --out out   # out/<run>/trajectories.atif.jsonl

RUN is what `baselines.diagnostics.runs` reads: a learner run written with
`save_trajectories=true`, an `evaluate --out` folder, or a folder of such runs. `--format atif`
writes one ATIF document per trajectory (`<out>/<run>/step_<N>/group<G>-traj<T>.json`; an
evaluation's trajectories are step 0);
`--format jsonl` writes the same documents one per line (`<out>/<run>/trajectories.atif.jsonl`).

One trajectory is one document: the prompt's chat turns become `system` and `user` steps; each
generated segment an `agent` step whose `metrics` hold its exact `completion_token_ids`, their
behaviour `logprobs` and the `prompt_token_ids` the model saw before it; a tool call that
ends a segment becomes its `tool_calls` entry and the text the env inserted after it the
`observation`. Reward, reward components, advantage and end reason are in `final_metrics.extra`.
A fork (tree rollouts) is exported whole: the steps it shares with its parent carry
`is_copied_context: true`, and `extra.parent_trajectory_id` and `extra.branch_offset` name the
parent document and the response token where the fork left it (`continued_trajectory_ref` is
not used: a fork is not a continuation, and a parent may have many). Text needs the run's
tokenizer (`final_model/tokenizer.json`, the configured model's folder, or `--tokenizer`); without
one, tool results are cut out of `response_text` when they line up with the loss mask, and the
prompt's text is left empty (its token ids are still there). See docs/interop.md.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from baselines.diagnostics.runs import CALL_END, INSERTED_RESULT, Run, find_runs, run_tokenizer

ATIF_VERSION = "ATIF-v1.7"
FORMATS = ("atif", "jsonl")
_CHAT_TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)(?:<\|im_end\|>|$)", re.S)
_SOURCES = {"system": "system", "user": "user", "assistant": "agent"}


def export(path: str | Path, out: str | Path | None = None, fmt: str = "atif",
           tokenizer: str | Path | None = None) -> list[Path]:
    """Write every trajectory of the runs at or below `path`; returns the files written.

    Raises ValueError for a folder that holds no run, a run without saved trajectories, a bad
    format or tokenizer, or a malformed line (naming the file and line)."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    out = Path(out) if out is not None else Path(path) / "atif"
    given = _load_tokenizer(tokenizer) if tokenizer is not None else None
    written: list[Path] = []
    for run in find_runs(path):
        if not run.steps:
            raise ValueError(f"{run.path}: no saved trajectories; train with save_trajectories=true "
                             "(an evaluate --out folder holds trajectories.jsonl)")
        tok = given or run_tokenizer(run.path, run.config)
        folder = out / run.name
        lines: list[str] = []
        for step in run.steps:
            seen: dict[str, int] = {}
            for row in run.rows(step):
                doc = atif_document(row, run, step, tok)
                if fmt == "jsonl":
                    lines.append(json.dumps(doc))
                    continue
                name = f"group{int(row.get('group_id', 0)):04d}-traj{int(row.get('traj_id', 0)):04d}"
                seen[name] = seen.get(name, 0) + 1
                if seen[name] > 1:  # rows that share ids (an evaluation's samples): every one kept
                    name += f"-{seen[name]}"
                file = folder / f"step_{step:06d}" / f"{name}.json"
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text(json.dumps(doc, indent=1))
                written.append(file)
        if fmt == "jsonl":
            folder.mkdir(parents=True, exist_ok=True)
            file = folder / "trajectories.atif.jsonl"
            file.write_text("".join(line + "\n" for line in lines))
            written.append(file)
    return written


def _load_tokenizer(path: str | Path) -> Any:
    file = Path(path)
    file = file / "tokenizer.json" if file.is_dir() else file
    if not file.is_file():
        raise ValueError(f"--tokenizer {path}: no tokenizer.json there (give the file or the model's folder)")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def atif_document(row: dict[str, Any], run: Run, step: int, tokenizer: Any | None) -> dict[str, Any]:
    """One trajectory row (as saved) as an ATIF v1.7 document."""
    from agent_envs import __version__

    group, traj = int(row.get("group_id", 0)), int(row.get("traj_id", 0))
    session = f"{run.name}/step_{step}/group_{group}"  # the episode tree: a root and its forks
    model = run.config.get("model")
    steps = _prompt_steps(row, tokenizer) + _response_steps(row, tokenizer)
    for k, item in enumerate(steps, 1):
        item["step_id"] = k
    agent_metrics = [s["metrics"] for s in steps if "metrics" in s]
    extra: dict[str, Any] = {"run": run.name, "algorithm": run.algorithm, "step": step, "group_id": group,
                             "traj_id": traj, "task_id": row.get("task_id", "")}
    if row.get("parent_id") is not None:
        extra["parent_trajectory_id"] = f"{session}/traj_{row['parent_id']}"
        extra["branch_offset"] = row.get("branch_offset")
    if row.get("lineage"):
        extra["lineage"] = row["lineage"]
    doc: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": session,
        "trajectory_id": f"{session}/traj_{traj}",
        "agent": {"name": "agent-envs", "version": __version__, "extra": {"algorithm": run.algorithm}},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(m["prompt_tokens"] for m in agent_metrics),
            "total_completion_tokens": sum(m["completion_tokens"] for m in agent_metrics),
            "total_steps": len(steps),
            "extra": {key: row.get(key) for key in ("reward", "components", "advantage", "terminated", "truncated",
                                                     "end_reason", "finish_reason", "tool_calls", "health")
                      if row.get(key) is not None},
        },
        "extra": extra,
    }
    if isinstance(model, str) and model:
        doc["agent"]["model_name"] = model
    return doc


def _prompt_steps(row: dict[str, Any], tokenizer: Any | None) -> list[dict[str, Any]]:
    """The prompt's chat turns (ChatML); the whole prompt as one user turn otherwise; without a
    tokenizer one empty user turn that keeps the prompt's token count and task id."""
    ids = row.get("prompt_ids") or []
    if tokenizer is None:
        return [{"source": "user", "message": "", "extra": {"task_id": row.get("task_id", ""),
                                                             "prompt_tokens": len(ids),
                                                             "text": "not recovered: no tokenizer for this run"}}]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    turns = [(role, body) for role, body in _CHAT_TURN.findall(text) if role != "assistant" or body.strip()]
    if not turns:
        return [{"source": "user", "message": text}]
    return [{"source": _SOURCES[role], "message": body.strip("\n")} for role, body in turns]


def _parts(row: dict[str, Any], tokenizer: Any | None) -> list[tuple[int, int, bool, str]]:
    """The response as (start, end, generated, text) in response tokens: cut where the loss mask
    changes, where a generated segment starts, and at a fork's branch offset (with a tokenizer);
    without one, cut where the mask changes when `response_text`'s inserted tool results line up
    with it, else one generated part of the whole text."""
    ids, mask = row.get("response_ids") or [], row.get("loss_mask") or []
    cuts = {0, len(mask)} | {i for i in range(1, len(mask)) if mask[i] != mask[i - 1]}
    if tokenizer is not None:
        cuts |= {s for s in row.get("segment_starts") or [] if 0 < s < len(mask)}
        offset = row.get("branch_offset")
        if isinstance(offset, int) and 0 < offset < len(mask):
            cuts.add(offset)
    edges = sorted(cuts)
    spans = [(a, b, bool(mask[a])) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    if tokenizer is not None:  # one decode per part: its cuts are where separately made texts meet
        return [(a, b, g, tokenizer.decode(ids[a:b], skip_special_tokens=False)) for a, b, g in spans]
    text = row.get("response_text") or ""
    inserted = [m.span(1) for m in INSERTED_RESULT.finditer(text)]
    kinds = [g for _, _, g in spans]
    if inserted and kinds == [k % 2 == 0 for k in range(len(kinds))] and len(inserted) == kinds.count(False):
        bounds = [0, *(x for span in inserted for x in span), len(text)]
        return [(a, b, g, text[lo:hi]) for (a, b, g), lo, hi in zip(spans, bounds, bounds[1:], strict=False)]
    return [(0, len(mask), True, text)]


def _response_steps(row: dict[str, Any], tokenizer: Any | None) -> list[dict[str, Any]]:
    prompt, ids = row.get("prompt_ids") or [], row.get("response_ids") or []
    mask, logprobs = row.get("loss_mask") or [], row.get("logprobs") or []
    offset = row.get("branch_offset")
    steps: list[dict[str, Any]] = []
    for a, b, generated, text in _parts(row, tokenizer):
        copied = isinstance(offset, int) and b <= offset
        if not generated:
            last = steps[-1] if steps else None
            if last is not None and last["source"] == "agent":  # what the env answered to that segment
                results = last.setdefault("observation", {"results": []})["results"]
                if results:  # a result cut at a branch offset: one result still
                    results[-1]["content"] += text
                else:
                    call = _tool_call(last["message"], 1 + sum("tool_calls" in s for s in steps))
                    if call is not None:
                        last["tool_calls"] = [call]
                    results.append({**({"source_call_id": call["tool_call_id"]} if call else {}), "content": text})
                continue
            steps.append({"source": "user", "message": text, **({"is_copied_context": True} if copied else {})})
            continue
        taken = [i for i in range(a, b) if mask[i]]  # all of [a, b) but where one part holds the whole text
        step: dict[str, Any] = {"source": "agent", "message": text, "metrics": {
            "prompt_tokens": len(prompt) + a,
            "completion_tokens": len(taken),
            "prompt_token_ids": [*prompt, *ids[:a]],
            "completion_token_ids": [ids[i] for i in taken],
            "logprobs": [float(logprobs[i]) for i in taken],
        }}
        if copied:
            step["is_copied_context"] = True
        steps.append(step)
    return steps


def _tool_call(message: str, number: int) -> dict[str, Any] | None:
    """The tool call a generated segment ends with (`<python> ... </python>`, `<tool_call> ...
    </tool_call>`), whatever the protocol names its tools; its text is the one argument. `number`:
    the trajectory's how-manieth call (`call_1`, `call_2`, ...)."""
    close = CALL_END.search(message)
    if close is None:
        return None
    name = close.group(1)
    start = message.rfind(f"<{name}>", 0, close.start())
    if start < 0:
        return None
    return {"tool_call_id": f"call_{number}", "function_name": name,
            "arguments": {"input": message[start + len(name) + 2 : close.start()].strip()}}


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="write a run's saved trajectories in ATIF v1.7 (Harbor's "
                              "trajectory format), one JSON file each or one JSONL file",
                              description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("run", metavar="RUN",
                   help="a learner run (save_trajectories=true), an evaluate --out folder, or a folder of runs")
    p.add_argument("--format", dest="fmt", choices=FORMATS, default="atif",
                   help="atif: one .json document per trajectory; jsonl: the documents one per line (default: atif)")
    p.add_argument("--out", default=None, help="folder written into, one subfolder per run (default: RUN/atif)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (or its model folder) to decode text with, "
                   "when the run has none (final_model/ or the configured model's folder)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    written = export(args.run, args.out, args.fmt, args.tokenizer)
    folders = sorted({str(p.parent if args.fmt == "jsonl" else p.parent.parent) for p in written})
    print(f"export: {len(written)} file(s) in {', '.join(folders)}")
    return 0


__all__ = ["ATIF_VERSION", "atif_document", "export"]
