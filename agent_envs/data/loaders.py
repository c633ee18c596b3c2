"""Reading benchmark files into `Task`s: .jsonl, .jsonl.gz, .json, .parquet, or a Hugging Face id.

Rows are normalised field by field (id, question, golden answers, grader kind); everything else in
the row is kept in `Task.metadata`. A malformed row raises `DataError` naming the file, the line
(or record) and the field.

`load_benchmark("aime24")` reads `$AGENT_ENVS_DATA_DIR/aime24/test.jsonl`; `load_tasks` reads
your own files (question + answer or answers):

    >>> import json, pathlib, tempfile
    >>> from agent_envs.data import load_tasks
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "my_questions.jsonl"
    >>> _ = path.write_text(json.dumps({"id": "q1", "question": "Capital of France?", "answers": ["Paris"]}) + "\\n")
    >>> [(t.id, t.answers, t.reward) for t in load_tasks(path, reward="qa")]
    [('q1', ['Paris'], 'qa')]
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_envs.base.paths import cache_root
from agent_envs.base.task import Task
from agent_envs.data.registry import BenchmarkSpec, get_spec
from agent_envs.rewards.extract import last_boxed

_log = logging.getLogger(__name__)

SUPPORTED = (".jsonl", ".jsonl.gz", ".ndjson", ".json", ".json.gz", ".parquet")
DATA_DIR_ENV = "AGENT_ENVS_DATA_DIR"
NO_HF_ENV = "AGENT_ENVS_NO_HF"  # set to 1 to never try the Hugging Face hub (offline machines: no retry wait)
HUB_PROBE_TIMEOUT_S = 1.0
_PROXY_ENVS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

# candidate source fields, in order of preference
ID_FIELDS = ("id", "_id", "task_id", "question_id", "unique_id", "hle_id", "idx", "index")
QUESTION_FIELDS = ("question", "Question", "problem", "question_text", "query", "input")
ANSWER_FIELDS = ("answers", "answer", "Final answer", "final_answer", "ground_truth", "target", "label")


class DataError(ValueError):
    """A benchmark file or row that cannot become a Task; the message says where and why."""


# ---------------------------------------------------------------------------------------------
# reading rows


def _open_text(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")
    )


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suf in sorted(SUPPORTED, key=len, reverse=True):
        if name.endswith(suf):
            return suf
    return path.suffix


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"line {n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {n}: not valid JSON ({e.msg} at column {e.colno})") from None


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines saved under a .json name
            yield from _jsonl_rows(path)
            return
        raise DataError(f"{path}, line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(data, dict):
        for key in ("data", "rows", "examples", "questions"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            if data and all(isinstance(v, dict) for v in data.values()):  # {id: record}
                data = [{"id": str(k), **v} for k, v in data.items()]
            else:
                raise DataError(
                    f"{path}: a JSON object must hold a list under 'data'/'rows'/'examples' or map ids to "
                    "records; got keys " + ", ".join(list(map(str, data))[:8])
                )
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for n, row in enumerate(data, 1):
        yield f"record {n}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow: pip install 'agent-envs[data]'") from None
    for n, row in enumerate(pq.read_table(path).to_pylist(), 1):
        yield f"row {n}", row


def read_rows(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """Yield (location, raw row) for every record of a file; the location reads "line 12" etc."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist")
    suf = _suffix(p)
    if suf in (".jsonl", ".jsonl.gz", ".ndjson"):
        return _jsonl_rows(p)
    if suf in (".json", ".json.gz"):
        return _json_rows(p)
    if suf == ".parquet":
        return _parquet_rows(p)
    raise DataError(f"{p}: unsupported file type {suf!r}; use one of {', '.join(SUPPORTED)}")


# ---------------------------------------------------------------------------------------------
# normalising rows


def _as_answer(value: Any, where: str, fname: str) -> list[str]:
    if value is None:
        raise DataError(f"{where}: field {fname!r} is null; every task needs at least one golden answer")
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, int | float):
        return [str(int(value)) if float(value).is_integer() else str(value)]
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):  # {"target": [...]}, SQuAD-style {"text": [...]}
        for key in ("target", "text", "answers", "value", "ground_truth"):
            if key in value:
                return _as_answer(value[key], where, f"{fname}.{key}")
        raise DataError(
            f"{where}: field {fname!r} is an object without target/text/answers: {list(value)[:6]}"
        )
    if isinstance(value, Sequence) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        out: list[str] = []
        for i, item in enumerate(items):
            if isinstance(item, Sequence | Mapping) and not isinstance(item, str):
                raise DataError(
                    f"{where}: field {fname}[{i}] must be a string or number, got {type(item).__name__}"
                )
            out.extend(_as_answer(item, where, f"{fname}[{i}]"))
        return out
    raise DataError(f"{where}: field {fname!r} must be a string, number or list, got {type(value).__name__}")


def _question(row: Mapping[str, Any], where: str) -> str:
    for key in QUESTION_FIELDS:
        if key in row and row[key] is not None:
            q = row[key]
            if not isinstance(q, str):
                raise DataError(f"{where}: field {key!r} must be a string, got {type(q).__name__}")
            if not q.strip():
                raise DataError(f"{where}: field {key!r} is empty")
            return q
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and isinstance(extra.get("question"), str):
        return extra["question"]
    prompt = row.get("prompt")  # verl: a list of chat messages; the question is the last user turn
    if isinstance(prompt, Sequence) and not isinstance(prompt, str):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    raise DataError(
        f"{where}: no question field (looked for {', '.join(QUESTION_FIELDS)}, extra_info.question, prompt)"
    )


def _answers(row: Mapping[str, Any], where: str) -> list[str]:
    if row.get("golden_answers") is not None:  # columnar files hold null where a row lacks a field
        answers = _as_answer(row["golden_answers"], where, "golden_answers")
    else:
        answers = []
        for key in ANSWER_FIELDS:
            if key in row and row[key] is not None:
                answers = _as_answer(row[key], where, key)
                if key == "answer" and len(answers) == 1 and "\n#### " in answers[0]:
                    answers = [answers[0].rsplit("\n#### ", 1)[1].strip()]  # GSM8K: solution, then "#### 18"
                break
        else:
            rm = row.get("reward_model")
            if isinstance(rm, Mapping) and "ground_truth" in rm:
                answers = _as_answer(rm["ground_truth"], where, "reward_model.ground_truth")
            elif isinstance(row.get("solution"), str) and last_boxed(row["solution"]) is not None:
                answers = [last_boxed(row["solution"])]  # MATH rows without an answer field
            else:
                nulls = [k for k in ("golden_answers", *ANSWER_FIELDS) if k in row and row[k] is None]
                raise DataError(
                    f"{where}: no answer field (looked for golden_answers, {', '.join(ANSWER_FIELDS)}, "
                    "reward_model.ground_truth, a \\boxed{} in solution)"
                    + (f"; {', '.join(repr(k) for k in nulls)} is null" if nulls else "")
                )
        aliases = row.get("answer_aliases")
        if aliases:
            answers += [a for a in _as_answer(aliases, where, "answer_aliases") if a not in answers]
    if not answers:
        raise DataError(f"{where}: the golden answer list is empty")
    # blank aliases would let an empty prediction count as correct; a row left with none keeps
    # answers=[] (never scores) and is flagged, so one bad source row does not block a file
    return [a for a in answers if a.strip()]


def _task_id(row: Mapping[str, Any], default: str) -> str:
    for key in ID_FIELDS:
        v = row.get(key)
        if v is not None and not isinstance(v, bool) and str(v).strip():
            return (
                str(v)
                if key in ("id", "_id", "task_id", "question_id", "unique_id", "hle_id")
                else f"{default}-{v}"
            )
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and extra.get("index") is not None:
        return f"{default}-{extra['index']}"
    return ""


def normalize_row(
    row: Any,
    where: str,
    *,
    reward: str,
    prefix: str,
    position: int,
    per_row_reward: bool = False,
    benchmark: str | None = None,
) -> Task:
    """One raw record -> Task. `where` ("file, line 3") prefixes every error; `prefix` builds ids
    for rows that have none; `per_row_reward` lets an `ability: math|qa` field pick the grader."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: a record must be a JSON object, got {type(row).__name__}")
    question = _question(row, where)
    answers = _answers(row, where)
    tid = _task_id(row, prefix) or f"{prefix}-{position:05d}"
    kind = reward
    if per_row_reward and row.get("ability") in ("math", "qa"):
        kind = row["ability"]
    meta = {k: v for k, v in row.items() if k not in ("id", "question", "golden_answers")}
    meta["source"] = where
    if not answers:
        meta["no_golden_answer"] = True
        _log.warning("%s: every golden answer is blank; the task can never score", where)
    if benchmark:
        meta["benchmark"] = benchmark
    return Task(id=tid, question=question, answers=answers, metadata=meta, reward=kind)


# ---------------------------------------------------------------------------------------------
# public loaders


def _file_tasks(
    path: Path, reward: str, per_row_reward: bool, benchmark: str | None, text_only: bool = False
) -> list[Task]:
    prefix = path.name.split(".")[0]
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for i, (loc, row) in enumerate(read_rows(path)):
        where = f"{path}, {loc}"
        if text_only and isinstance(row, Mapping) and (row.get("file_name") or row.get("image")):
            continue
        task = normalize_row(
            row,
            where,
            reward=reward,
            prefix=prefix,
            position=i,
            per_row_reward=per_row_reward,
            benchmark=benchmark,
        )
        if task.id in seen:
            raise DataError(
                f"{where}: field 'id' = {task.id!r} repeats the id of {seen[task.id]}; ids must be unique"
            )
        seen[task.id] = loc
        tasks.append(task)
    if not tasks:
        raise DataError(f"{path}: no records")
    return tasks


def load_tasks(
    data_files: str | os.PathLike | Sequence[str | os.PathLike],
    reward: str = "qa",
    *,
    per_row_reward: bool = False,
    benchmark: str | None = None,
) -> list[Task]:
    """Tasks from one or more local files (.jsonl, .jsonl.gz, .json, .parquet), graded by `reward`
    (`math`, `qa`, `judge` or `exact`)."""
    files = [data_files] if isinstance(data_files, str | os.PathLike) else list(data_files)
    if not files:
        raise ValueError("data_files is empty: pass a path or a list of paths")
    out: list[Task] = []
    for f in files:
        out.extend(_file_tasks(Path(f), reward, per_row_reward, benchmark))
    return out


def data_dir() -> Path:
    """Where benchmark files are looked up: `$AGENT_ENVS_DATA_DIR`, else the cache's `data/`, which
    `agent-envs data download` fills."""
    d = os.environ.get(DATA_DIR_ENV)
    return Path(d).expanduser() if d else cache_root() / "data"


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached, from one quick TCP connect; None if it answers.

    Offline, the hub client retries for about 25 s before it gives up; one connect with a short
    timeout says the same at once. Behind a proxy a direct connect proves nothing: no probe then.
    """
    if any(os.environ.get(name) for name in _PROXY_ENVS):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlsplit(endpoint)
    if not url.hostname:
        return None  # let the hub client report a malformed HF_ENDPOINT itself
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((url.hostname, port), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except TimeoutError:
        return f"the hub at {endpoint} did not answer within {HUB_PROBE_TIMEOUT_S:g} s"
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        return f"the hub at {endpoint} is unreachable ({why})"


def _hf_copy_may_be_cached(hf_id: str) -> bool:
    """Whether the hub or datasets cache may hold `hf_id`, judged from folder names alone.

    Importing `datasets` to ask it takes seconds (pandas, pyarrow); offline with nothing cached,
    that import was most of the time before the error. The match is loose (any datasets-cache
    folder of the same owner), so a cached copy is never missed; a false "maybe" only costs the
    import.
    """
    if Path(hf_id).expanduser().exists():  # a local dataset folder needs no hub
        return True
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    home = home.expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    if (hub.expanduser() / f"datasets--{hf_id.replace('/', '--')}").is_dir():
        return True
    owner = hf_id.split("/")[0].lower() + "___" if "/" in hf_id else hf_id.lower()
    try:
        return any(p.name.lower().startswith(owner) for p in datasets_cache.iterdir())
    except OSError:
        return False


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """The hub client in offline mode for one load: a copy cached by an earlier download still
    loads, and a missing one fails at once instead of after the client's retries."""
    import datasets.config  # noqa: PLC0415 (optional dependency)
    import huggingface_hub.constants  # noqa: PLC0415 (installed with datasets)

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _load_hf(spec: BenchmarkSpec, split: str | None) -> list[Task]:
    import datasets  # noqa: PLC0415 (optional dependency)

    hf_split = split or spec.hf_split
    ds = datasets.load_dataset(spec.hf_id, spec.hf_config, split=hf_split)
    tasks = []
    for i, row in enumerate(ds):
        if spec.text_only and (row.get("file_name") or row.get("image")):
            continue
        where = f"hf:{spec.hf_id}[{spec.hf_config or ''}:{hf_split}], row {i + 1}"
        tasks.append(
            normalize_row(
                row,
                where,
                reward=spec.reward,
                prefix=spec.name,
                position=i,
                per_row_reward=spec.train,
                benchmark=spec.name,
            )
        )
    return tasks


def benchmark_path(name: str, split: str | None = None) -> Path:
    """The local file of a benchmark split in the data folder (`data_dir()`)."""
    spec = get_spec(name)
    key = split or spec.default_split
    if key not in spec.files:
        raise KeyError(
            f"benchmark {spec.name!r} has no local split {key!r}; local splits: {', '.join(spec.files)}"
        )
    return data_dir() / spec.files[key]


def load_benchmark(
    name: str,
    data_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    split: str | None = None,
) -> list[Task]:
    """Tasks of a named benchmark (see `BENCHMARKS`).

    Lookup order: `data_files` when given; else `$AGENT_ENVS_DATA_DIR/<file of split>`; else the
    Hugging Face copy (`datasets` installed, access granted; only a cached copy when a one-second
    probe finds the hub unreachable); else an error saying what to pass.
    """
    spec = get_spec(name)
    if data_files is not None:
        return load_tasks(data_files, spec.reward, per_row_reward=spec.train, benchmark=spec.name)
    local_split = split if split is None or split in spec.files else None
    path = benchmark_path(spec.name, local_split) if (split is None or local_split) else None
    if path is not None and path.is_file():
        return _file_tasks(path, spec.reward, spec.train, spec.name)
    hf_error = ""
    if spec.hf_id and os.environ.get(NO_HF_ENV, "").lower() in ("", "0", "false"):
        unreachable = _hub_unreachable()
        try:
            if unreachable is not None and not _hf_copy_may_be_cached(spec.hf_id):
                raise FileNotFoundError("not cached")  # reported below as "unreachable and no copy is cached"
            if unreachable is None:
                return _load_hf(spec, None if local_split else split)
            with _hub_offline():
                return _load_hf(spec, None if local_split else split)
        except ImportError:
            hf_error = "the `datasets` package is not installed"
        except Exception as e:  # offline, gated, renamed: say so, then say what to pass instead
            hf_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if unreachable is not None:
                hf_error = f"{unreachable} and no copy is cached"
    want = spec.files.get(local_split or spec.default_split, spec.default_file)
    where = path if path is not None else data_dir() / want
    fetch = (f"Get it with `agent-envs data download {spec.name}`. "
             if (local_split or spec.default_split) == spec.default_split else "")
    raise FileNotFoundError(
        f"benchmark {spec.name!r} (split {split or spec.default_split!r}): no data at {where}"
        + (
            f"; Hugging Face {spec.hf_id!r}: {hf_error or f'not tried ({NO_HF_ENV} is set)'}"
            if spec.hf_id
            else ""
        )
        + f". {fetch}Or pass data_files='path/to/{Path(want).name}' (one of {', '.join(SUPPORTED)}), "
        f"or set {DATA_DIR_ENV} to a folder holding {want}. Full data: {spec.full_data or 'see docs/benchmarks-data.md'}"
    )


def load_local_splits(name: str) -> dict[str, list[Task]]:
    """Every local split of a benchmark that exists under $AGENT_ENVS_DATA_DIR."""
    spec = get_spec(name)
    out = {}
    for split in spec.files:
        path = benchmark_path(spec.name, split)
        if path is not None and path.is_file():
            out[split] = _file_tasks(path, spec.reward, spec.train, spec.name)
    return out
