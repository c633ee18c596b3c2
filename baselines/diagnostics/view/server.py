"""`agent-envs view RUN`: serve a local page that browses a run's trajectories as branch trees.

    agent-envs view runs/arpo                 # one run: http://127.0.0.1:8765
    agent-envs view runs/compare --port 0     # every run under a folder; 0 picks a free port

RUN is a learner run (`config.json`, `metrics.jsonl`, `trajectories/step_*.jsonl`, written with
`save_trajectories=true`), an evaluation folder (`summary.json`, `samples.jsonl` and, from newer
versions, `trajectories.jsonl`), or a folder holding such runs (up to three levels down), which
makes the algorithm filter useful; `baselines.diagnostics.runs` reads them. Files are read when
the page asks and parsed again only when they change, so a run still training shows its new
steps on reload. The page is plain HTML/CSS/JS from `static/`; the JSON it reads:

    GET /api/runs                                   runs, their algorithm, steps, read errors
    GET /api/prompts?run=&algo=&step=&outcome=correct|incorrect&tool=used|unused
                                                    one row per prompt (step, group) that matches
    GET /api/prompt?run=R&step=S&group=G            the task text and every trajectory of the
                                                    group: tree links, reward, advantage, reward
                                                    components, health warnings, text pieces

Text pieces cut the response where the loss mask changes (generated text | tool results the
env inserted) and at a fork's branch offset (the prefix it shares with its parent). With the
run's tokenizer (`final_model/tokenizer.json`, or the configured model's folder) each generated
token carries its entropy; without one, each generated segment of `response_text` carries the
mean entropy of its tokens. See docs/diagnostics.md (Viewer).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_envs.server.serving import AppServer, bind, serve_until_signal, start_app
from baselines.diagnostics.runs import CALL_END, EVAL_SAMPLES, INSERTED_RESULT, Run, find_runs, run_tokenizer

STATIC = Path(__file__).parent / "static"
DEFAULT_PORT = 8765
SEARCH_DEPTH = 3  # how far below RUN to look for runs
_LONG_STRING = 80  # longer string components (the parsed action) are left out of the table


# ---- the rows of a run (read by baselines.diagnostics.runs) ---------------------------------------

_row_cache: dict[Path, tuple[tuple[int, int], list[dict[str, Any]], str | None]] = {}


def _cached_rows(path: Path, rows: Iterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of `path` and the error that stopped them (None when clean). Parsed again only
    when the file's size or mtime changed: the page asks for every step on each reload."""
    stat = path.stat()
    key = (stat.st_mtime_ns, stat.st_size)
    hit = _row_cache.get(path)
    if hit is None or hit[0] != key:
        read: list[dict[str, Any]] = []
        try:
            read.extend(rows)
            hit = (key, read, None)
        except ValueError as exc:
            hit = (key, read, f"{exc}; this line and the rows after it are not shown")
        _row_cache[path] = hit
    return hit[1], hit[2]


def _steps(run: Run) -> tuple[dict[int, list[dict[str, Any]]], list[str]]:
    """Step -> the rows the page shows, and read errors. Rows stay dicts, so fields newer than
    this version's `Trajectory` (`health`) still reach the page. An evaluate output written
    before `trajectories.jsonl` existed shows its samples at step 0, one flat group per task."""
    steps, errors = {}, []
    if run.kind == "evaluate" and not run.steps:
        rows, error = _cached_rows(run.path / EVAL_SAMPLES, run.samples())
        groups: dict[str, int] = {}
        steps[0] = [_sample_as_trajectory(i, row, groups) for i, row in enumerate(rows)]
        errors += [error] if error else []
    for step in run.steps:
        steps[step], error = _cached_rows(run.trajectory_file(step), run.rows(step))
        errors += [error] if error else []
    return steps, errors


def _sample_as_trajectory(index: int, sample: dict[str, Any], groups: dict[str, int]) -> dict[str, Any]:
    """An evaluation sample in the trajectory fields the viewer reads (no tokens, so no entropy)."""
    task = str(sample.get("task_id", ""))
    components = {k: sample[k] for k in ("correct", "em", "f1", "format_ok", "pred", "gold") if k in sample}
    return {
        "task_id": task,
        "group_id": groups.setdefault(task, len(groups)),
        "traj_id": index,
        "reward": sample.get("reward", 0.0),
        "components": components,
        "tool_calls": sample.get("tool_calls", 0),
        "truncated": bool(sample.get("truncated")),
        "response_text": sample.get("response", ""),
    }


def _find_runs(root: Path) -> dict[str, Run]:
    return {run.name: run for run in find_runs(root, SEARCH_DEPTH)}


# ---- tokens and text pieces ----------------------------------------------------------------------


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Text of each token: how much a short window's decoded text grows with it. A character split
    over several byte-level tokens lands on the token that completes it."""

    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False) if part else ""

    out = []
    for i in range(len(ids)):
        lo = max(0, i - 4)
        before = decode(ids[lo:i]).rstrip("\ufffd")
        now = decode(ids[lo : i + 1])
        if i + 1 < len(ids):
            now = now.rstrip("\ufffd")  # an incomplete character: wait for the token that ends it
        out.append(now[len(before) :] if now.startswith(before) else decode([ids[i]]))
    return out


def _runs_of(row: dict[str, Any]) -> list[tuple[int, int, bool]]:
    """(start, end, generated) spans of the response: cut where the loss mask changes, where a
    generated segment starts, and at the branch offset."""
    mask = row.get("loss_mask") or []
    cuts = {0, len(mask)}
    cuts.update(i for i in range(1, len(mask)) if mask[i] != mask[i - 1])
    cuts.update(s for s in row.get("segment_starts") or [] if 0 < s < len(mask))
    offset = row.get("branch_offset")
    if isinstance(offset, int) and 0 < offset < len(mask):
        cuts.add(offset)
    edges = sorted(cuts)
    return [(a, b, bool(mask[a])) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _pieces(row: dict[str, Any], tokenizer: Any | None) -> list[dict[str, Any]]:
    """The response as pieces: `kind` gen (the policy wrote it), call (the tool call that ends a
    generated segment, split off so that the page folds it with its result) or env (a tool result
    or message the env inserted); `shared` (before a fork's branch offset), `text`, `entropy`
    (mean over the piece), and with a tokenizer `tokens`: [text, entropy] per token."""
    return _split_calls(_unsplit_pieces(row, tokenizer))


def _unsplit_pieces(row: dict[str, Any], tokenizer: Any | None) -> list[dict[str, Any]]:
    ids = row.get("response_ids") or []
    entropy = row.get("entropy")
    offset = row.get("branch_offset") or 0
    spans = _runs_of(row)
    if tokenizer is not None and ids and spans:
        texts = _token_texts(tokenizer, ids)
        out = []
        for a, b, generated in spans:
            piece = {"kind": "gen" if generated else "env", "shared": a < offset, "text": "".join(texts[a:b])}
            if generated and entropy:
                piece["tokens"] = [[texts[i], entropy[i]] for i in range(a, b)]
                piece["entropy"] = _mean(entropy[a:b])
            out.append(piece)
        return out
    return _text_pieces(row.get("response_text") or "", spans, entropy)


def _split_calls(pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split the tool call off the end of each generated piece that an env piece follows: from
    the opening tag of the closing tag it ends with (`<python> ... </python>`, `<tool_call> ...
    </tool_call>`), whatever the protocol names its tools."""
    out: list[dict[str, Any]] = []
    for piece, following in zip(pieces, [*pieces[1:], None], strict=True):
        text = piece["text"]
        close = (
            CALL_END.search(text)
            if piece["kind"] == "gen" and following and following["kind"] == "env"
            else None
        )
        start = text.rfind(f"<{close.group(1)}>", 0, close.start()) if close else -1
        if start < 0:
            out.append(piece)
            continue
        head, call = dict(piece), dict(piece, kind="call")
        if "tokens" in piece:
            # the token where the opening tag starts goes to the call, whole
            k, seen = 0, 0
            while k < len(piece["tokens"]) and seen + len(piece["tokens"][k][0]) <= start:
                seen += len(piece["tokens"][k][0])
                k += 1
            head["tokens"], call["tokens"] = piece["tokens"][:k], piece["tokens"][k:]
            head["text"] = "".join(t for t, _ in head["tokens"])
            call["text"] = "".join(t for t, _ in call["tokens"])
            head["entropy"] = _mean([h for _, h in head["tokens"]])
            call["entropy"] = _mean([h for _, h in call["tokens"]])
        else:
            head["text"], call["text"] = text[:start], text[start:]
        out.extend([head, call] if head["text"] else [call])
    return out


def _text_pieces(
    text: str, spans: list[tuple[int, int, bool]], entropy: list[float] | None
) -> list[dict[str, Any]]:
    """Without a tokenizer: cut `response_text` at the results inserted after tool calls; when
    they match the loss mask's inserted spans one for one, each generated piece gets the mean
    entropy of its span's tokens, otherwise the whole text gets the mean of all of them."""
    inserted = [m.span(1) for m in INSERTED_RESULT.finditer(text)]
    generated = [(a, b) for a, b, g in spans if g]
    env_spans = [s for s in spans if not s[2]]
    if not inserted or len(inserted) != len(env_spans) or len(generated) != len(inserted) + 1:
        everything = _mean([h for a, b in generated for h in entropy[a:b]]) if entropy else None
        return [{"kind": "gen", "shared": False, "text": text, "entropy": everything}]
    out, pos = [], 0
    for k, (a, b) in enumerate(inserted):
        ga, gb = generated[k]
        out.append(
            {
                "kind": "gen",
                "shared": False,
                "text": text[pos:a],
                "entropy": _mean(entropy[ga:gb]) if entropy else None,
            }
        )
        out.append({"kind": "env", "shared": False, "text": text[a:b]})
        pos = b
    ga, gb = generated[-1]
    out.append(
        {
            "kind": "gen",
            "shared": False,
            "text": text[pos:],
            "entropy": _mean(entropy[ga:gb]) if entropy else None,
        }
    )
    return out


def _task_text(row: dict[str, Any], tokenizer: Any | None) -> tuple[str, str]:
    """(the task: the last user turn of the prompt, the whole prompt); the task id without a tokenizer."""
    ids = row.get("prompt_ids")
    if tokenizer is None or not ids:
        return str(row.get("task_id", "")), ""
    prompt = tokenizer.decode(ids, skip_special_tokens=False)
    turns = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)
    return (turns[-1].strip() if turns else prompt.strip()), prompt


# ---- views of prompts and trajectories -----------------------------------------------------------


def _correct(row: dict[str, Any]) -> bool:
    value = (row.get("components") or {}).get("correct")
    try:
        return float(value or 0.0) > 0
    except (TypeError, ValueError):
        return False


def _scalar_components(components: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in components.items():
        if (
            value is None
            or isinstance(value, (bool, int, float))
            or (isinstance(value, str) and len(value) <= _LONG_STRING)
        ):
            out[key] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[key] = ", ".join(value)
    return out


def _groups(run: Run) -> dict[tuple[int, int], list[dict[str, Any]]]:
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for step, rows in _steps(run)[0].items():
        for row in rows:
            out.setdefault((step, int(row.get("group_id", 0))), []).append(row)
    return out


def _matches(rows: list[dict[str, Any]], outcome: str, tool: str) -> bool:
    if outcome == "correct" and not any(_correct(r) for r in rows):
        return False
    if outcome == "incorrect" and all(_correct(r) for r in rows):
        return False
    if tool == "used" and not any(r.get("tool_calls", 0) for r in rows):
        return False
    return not (tool == "unused" and all(r.get("tool_calls", 0) for r in rows))


def prompt_rows(runs: dict[str, Run], query: dict[str, str]) -> list[dict[str, Any]]:
    """One summary per prompt (run, step, group) that passes the query's filters."""
    outcome, tool = query.get("outcome", ""), query.get("tool", "")
    step = int(query["step"]) if query.get("step", "").lstrip("-").isdigit() else None
    out = []
    for name, run in runs.items():
        # an empty filter (the page sends every field) matches every run
        if (query.get("run") or name) != name or (query.get("algo") or run.algorithm) != run.algorithm:
            continue
        tokenizer = run_tokenizer(run.path, run.config)
        for (s, group), rows in sorted(_groups(run).items()):
            if (step is not None and s != step) or not _matches(rows, outcome, tool):
                continue
            rewards = [float(r.get("reward", 0.0)) for r in rows]
            out.append(
                {
                    "run": name,
                    "algo": run.algorithm,
                    "step": s,
                    "group": group,
                    "task_id": rows[0].get("task_id", ""),
                    "task": _task_text(rows[0], tokenizer)[0],
                    "trajectories": len(rows),
                    "correct": sum(_correct(r) for r in rows),
                    "reward_mean": sum(rewards) / len(rewards),
                    "tool_calls": sum(r.get("tool_calls", 0) for r in rows),
                    "forks": sum(r.get("parent_id") is not None for r in rows),
                    "health": sum(len(r.get("health") or []) for r in rows),
                }
            )
    return out


def prompt_view(run: Run, step: int, group: int) -> dict[str, Any] | None:
    """The task and every trajectory of one prompt, or None when the run has no such prompt."""
    rows = _groups(run).get((step, group))
    if rows is None:
        return None
    tokenizer = run_tokenizer(run.path, run.config)
    task, prompt = _task_text(rows[0], tokenizer)
    trajectories = []
    for i, row in enumerate(rows):
        lineage = row.get("lineage") or {}
        trajectories.append(
            {
                "id": row.get("traj_id", i),
                "parent": row.get("parent_id"),
                "branch_offset": row.get("branch_offset"),
                "depth": lineage.get("depth", 0),
                "kind": lineage.get("kind", ""),
                "reward": row.get("reward", 0.0),
                "advantage": row.get("advantage"),
                "correct": _correct(row),
                "tool_calls": row.get("tool_calls", 0),
                "end_reason": row.get("end_reason", ""),
                "truncated": bool(row.get("truncated")),
                "tokens": len(row.get("response_ids") or []),
                "generated": sum(row.get("loss_mask") or []),
                "components": _scalar_components(row.get("components") or {}),
                "health": [str(h) for h in row.get("health") or []],
                "pieces": _pieces(row, tokenizer),
            }
        )
    return {
        "run": run.name,
        "algo": run.algorithm,
        "step": step,
        "group": group,
        "task_id": rows[0].get("task_id", ""),
        "task": task,
        "prompt": prompt,
        "tokenizer": tokenizer is not None,
        "trajectories": trajectories,
    }


def run_rows(runs: dict[str, Run]) -> list[dict[str, Any]]:
    out = []
    for name, run in runs.items():
        steps, errors = _steps(run)
        if run.kind == "learner" and not steps:
            errors.append(
                f"{run.path}: no trajectories/step_*.jsonl; train with save_trajectories=true to see them here"
            )
        last = run.metrics[-1] if run.metrics else run.summary.get("metrics", {})
        out.append(
            {
                "name": name,
                "kind": run.kind,
                "algo": run.algorithm,
                "steps": sorted(steps),
                "reward_mean": last.get("reward_mean"),
                "accuracy": last.get("accuracy"),
                "errors": errors,
            }
        )
    return out


# ---- the server ----------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> web.Response:
    # NaN/inf (a diverged run) are not JSON: the page shows them as text
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return web.json_response(clean(data), status=status)


def make_app(root: str | Path) -> web.Application:
    """The viewer's aiohttp application for the run (or folder of runs) at `root`."""
    root = Path(root).resolve()  # "." gets its folder's name as the run name
    if not root.is_dir():
        raise FileNotFoundError(
            f"agent-envs view: {root} is not a folder; pass a run's output_dir or evaluate --out"
        )

    async def index(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    @web.middleware
    async def unreadable(request: web.Request, handler: Any) -> web.StreamResponse:
        # no run under root, or a run's config.json / metrics.jsonl is malformed: the message
        # names the folder or file and line, and the page shows it
        try:
            return await handler(request)
        except ValueError as exc:
            return _json({"error": str(exc)}, 500)

    async def runs(_request: web.Request) -> web.Response:
        return _json({"root": str(root), "runs": run_rows(_find_runs(root))})

    async def prompts(request: web.Request) -> web.Response:
        return _json({"prompts": prompt_rows(_find_runs(root), dict(request.query))})

    async def prompt(request: web.Request) -> web.Response:
        found = _find_runs(root)
        q = request.query
        name = q.get("run", "")
        if name not in found:
            return _json({"error": f"no run {name!r} under {root}; runs: {sorted(found)}"}, 404)
        try:
            step, group = int(q.get("step", "")), int(q.get("group", ""))
        except ValueError:
            return _json(
                {"error": "step and group must be integers, e.g. /api/prompt?run=R&step=1&group=0"}, 400
            )
        view = prompt_view(found[name], step, group)
        if view is None:
            return _json({"error": f"run {name!r} has no prompt at step {step}, group {group}"}, 404)
        return _json(view)

    app = web.Application(middlewares=[unreadable])
    app.router.add_get("/", index)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/prompts", prompts)
    app.router.add_get("/api/prompt", prompt)
    app.router.add_static("/static/", STATIC)
    return app


async def start(root: str | Path, port: int = DEFAULT_PORT) -> tuple[web.AppRunner, str]:
    """Serve on 127.0.0.1 (port 0: a free one); returns the runner (`cleanup()` stops it) and the URL."""
    runner, url = await start_app(make_app(root), "127.0.0.1", port)
    return runner, f"{url}/"


class _Viewer(AppServer):
    def __init__(self, root: str | Path) -> None:
        self.root = root

    def app(self) -> web.Application:
        return make_app(self.root)


def serve(root: str | Path, port: int = DEFAULT_PORT) -> None:
    """Serve until interrupted."""
    serve_until_signal(_Viewer(root), "127.0.0.1", bind("127.0.0.1", port),
                       lambda url: f"agent-envs view: {url}/  (Ctrl-C stops)")


def add_cli(subparsers: Any) -> None:
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser("view", help="browse a run's trajectories as branch trees in the browser")
    p.add_argument("run", help="a run's output_dir, an evaluate --out folder, or a folder of runs")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port on 127.0.0.1 (0: a free one)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # a folder with no run in it is a mistyped path: refused before a server starts. A missing
    # folder, a port in use: the command's one error line (agent_envs/cli.py)
    if not Path(args.run).is_dir():
        raise FileNotFoundError(f"{args.run} is not a folder")
    find_runs(args.run, SEARCH_DEPTH)
    serve(args.run, args.port)
    return 0
