"""`agent-envs data`: list the benchmarks and fetch their evaluation files into the data folder.

    agent-envs data list                  # id, env id, rows, source, licence, and whether it is here
    agent-envs data download hotpotqa aime24
    agent-envs data download --all

Every benchmark id's default split is the evaluation set the ARPO/AEPO papers report on, published
in the ARPO repository at a fixed commit. `download` fetches each file, checks its size and
SHA-256 against the values pinned here (a changed upstream file is refused, nothing written),
reads it with the package's own loader (`agent_envs.data.loaders`) and writes it in the common
record layout (`id`, `question`, `golden_answers`, then the source's fields) into the data folder
the envs read: `$AGENT_ENVS_DATA_DIR`, else `$AGENT_ENVS_CACHE/data` (default
`~/.cache/agent-envs/data`). GAIA, HLE and xbench-DeepSearch are written gzipped: their
publishers ask that they not be reshared as plain, crawlable text. HotpotQA and MuSiQue also get
a question file that carries its distractor-setting passages (`PASSAGE_SOURCES`): their envs
search those passages when no corpus is configured. Sources and licences: docs/benchmarks-data.md.

`$AGENT_ENVS_DATA_URL` replaces the base address (default `https://raw.githubusercontent.com`),
for a mirror.

    >>> SOURCES["hotpotqa"].path
    'dongguanting/ARPO/e257337d1f105ba685057cb662c75e509d1c7b34/evaluation/data/hotpotqa/test.jsonl'
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_envs.data.loaders import data_dir, read_rows
from agent_envs.data.registry import BENCHMARKS, get_spec

BASE_URL_ENV = "AGENT_ENVS_DATA_URL"
DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
_ARPO = "dongguanting/ARPO/e257337d1f105ba685057cb662c75e509d1c7b34"
_ARPO_LICENCE = "MIT (stated in the ARPO README)"


def _after_hashes(row: dict[str, Any]) -> list[str]:
    """GSM8K: the number after `####` in the worked solution, thousands separators removed."""
    return [str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")]


def _integer(row: dict[str, Any]) -> list[str]:
    """AIME: answers are integers 0-999 written with leading zeros ("025")."""
    return [str(int(str(row["answer"]).strip()))]


def _spans(row: dict[str, Any]) -> list[str]:
    """IRCoT's processed HotpotQA: the answer spans of `answers_objects`."""
    return [span for obj in row["answers_objects"] for span in obj["spans"]]


@dataclass(frozen=True)
class Source:
    """Where a benchmark's default file comes from, and how its rows become ours."""

    path: str  # under the base URL: owner/repo/commit/path
    sha256: str
    size: int
    licence: str
    id_format: str  # "{i:04d}" numbering, or "{field}" from the row
    gold: Callable[[dict[str, Any]], list[str]] | None = None  # golden answers from the row, when it needs a rule
    split: str | None = None  # the local split it is written as; None: the benchmark's default split

    def url(self, base: str | None = None) -> str:
        return f"{(base or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip('/')}/{self.path}"


def _arpo(path: str, sha256: str, size: int, id_format: str, gold: Callable | None = None, licence: str = "") -> Source:
    return Source(f"{_ARPO}/{path}", sha256, size, licence or _ARPO_LICENCE, id_format, gold)


SOURCES: dict[str, Source] = {
    "gsm8k": _arpo("evaluation/data/gsm8k/test.jsonl",
                   "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394", 761421,
                   "gsm8k-test-{i:04d}", _after_hashes, "MIT (openai/grade-school-math)"),
    "math500": _arpo("evaluation/data/math500/test.jsonl",
                     "fba7f0faf5593e5c29028190115672e36fe4bed72f535cea8c71d393bd03ba0f", 119567,
                     "math500-{i:04d}", licence="MIT (openai/prm800k)"),
    "aime24": _arpo("evaluation/data/aime24/test.jsonl",
                    "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac", 156944,
                    "aime2024-{id}", _integer, "MIT (ARPO README); problems (c) MAA"),
    "aime25": _arpo("evaluation/data/aime25/test.jsonl",
                    "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331", 15813,
                    "aime2025-{i:02d}", _integer, "MIT (ARPO README); problems (c) MAA"),
    "bamboogle": _arpo("evaluation/data/bamboogle/test.jsonl",
                       "e37b9c512f27f76f1bab1922972a0d7d48af8ac08dbdc41de56dcae45e5148c7", 13878,
                       "bamboogle-{i:04d}", licence="not stated upstream"),
    "hotpotqa": _arpo("evaluation/data/hotpotqa/test.jsonl",
                      "072c04637a2736f355e92ee77649d1de89112f873b21b97e50171ac33497ad98", 28176,
                      "hotpotqa-arpo-{i:04d}", licence="MIT (ARPO README); HotpotQA CC BY-SA 4.0"),
    "2wikimultihopqa": _arpo("evaluation/data/2wiki/test.jsonl",
                             "f92e028caf038c0fd861111ce811f12a50fc17324933b9b723d169913dfa9884", 31675,
                             "2wiki-arpo-{i:04d}", licence="MIT (ARPO README); 2WikiMultihopQA Apache-2.0"),
    "musique": _arpo("evaluation/data/musique/test.jsonl",
                     "d238f3c3b34347019bf84136eaca6fc34882d2263fbcd3dc352ad85eb80cf1dc", 32010,
                     "musique-arpo-{i:04d}", licence="MIT (ARPO README); MuSiQue CC BY 4.0"),
    "gaia": _arpo("evaluation/data/gaia/test.jsonl",
                  "4b631659cb2cd9957c865b0070958fc726c5705d1700c54e75c47359057959ca", 141628,
                  "{task_id}", licence="GAIA terms: evaluation only, do not reshare"),
    "hle": _arpo("evaluation/data/hle/top.json",
                 "da8a4a88feebeb412a7df2e67c79133c484c47889653c9934743236c42c9ee77", 1202880,
                 "{id}", licence="MIT; HLE asks that it not be reshared (canary)"),
    "webwalkerqa": _arpo("evaluation/data/webwalker/test.jsonl",
                         "5aa737b433dfc1cfd882c4857c492490eba0cb7c990ab35c0f322c51c24db678", 48314,
                         "webwalkerqa-arpo-{i:04d}", licence="Apache-2.0 (reported)"),
    "xbench-deepsearch": _arpo("evaluation/data/xbench/test.jsonl",
                               "70cac61a33f2dd1e8308cff011b718d203e680f3ce0c7fcf81a8958f5a2b0f3a", 22250,
                               "xbench-ds-{i:04d}", licence="released encrypted upstream: evaluation only"),
    "arpo_rl": _arpo("ARPO/rl_datasets/train_10k.parquet",
                     "d1268cd800b821d7fa2913766beb81db342e4b839cbb6ba50a6549d5d8d1851b", 2793322,
                     "arpo-train_10k-{i}"),
    "arpo_hard_search": _arpo("ARPO/rl_datasets/hard_search_1k.parquet",
                              "a569566769376eb605872c769c137ff201a335c9f9d43dc0233834473899d239", 215410,
                              "arpo-hard_search_1k-{i}"),
}


# Question files whose rows carry their distractor-setting passages, fetched beside the default
# file: the passages of all their questions are the benchmark's search corpus when none is
# configured (agent_envs/data/passages.py). 137 of ARPO's 200 HotpotQA questions and 9 of its 200
# MuSiQue questions are among them, with their gold paragraphs.
PASSAGE_SOURCES: dict[str, Source] = {
    "hotpotqa": Source("xindili-cmu/anlp-project-multihop/df0d5757f42f098ab6026f40323e91c369307506/"
                       "processed_data/hotpotqa/dev_subsampled.jsonl",
                       "837a919903fedf521211c4271f168ad5458488198e9c4d967bf5f3a579525ce8", 3312335,
                       "IRCoT's processed HotpotQA dev subsample (repository Apache-2.0); HotpotQA CC BY-SA 4.0",
                       "{question_id}", _spans, split="dev_500_ircot"),
    "musique": Source("OpenSPG/KAG/8901a93e04cd70c90e2fe029bb838a93c58c65ed/"
                      "kag/examples/musique_pike/solver/data/musique_qa_100.json",
                      "7ee7b3f9533586b38d8ebe579dcb8d3daa8f52600b7777a6daa085ccac470467", 1467293,
                      "KAG Apache-2.0; MuSiQue CC BY 4.0", "{id}", split="dev_100_kag"),
}


class DownloadError(RuntimeError):
    """A download that failed; nothing was written."""


def local_path(name: str, folder: Path | None = None, split: str | None = None) -> Path:
    spec = get_spec(name)
    return (folder or data_dir()) / spec.files[split or spec.default_split]


def fetch(source: Source, base_url: str | None = None, timeout_s: float = 60.0) -> bytes:
    """The source file's bytes, checked against the pinned size and SHA-256."""
    url = source.url(base_url)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            data = r.read(source.size + 1)
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise DownloadError(f"{url}: unreachable ({why}); check the network or set {BASE_URL_ENV} to a mirror") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != source.size or digest != source.sha256:
        raise DownloadError(f"{url}: got {len(data)} bytes with SHA-256 {digest[:16]}..., expected {source.size} "
                            f"bytes with {source.sha256[:16]}...; the upstream file changed: nothing was written")
    return data


def convert(name: str, data: bytes, source: Source | None = None) -> list[dict[str, Any]]:
    """The source's rows (default: the benchmark's default file) in the common layout: id,
    question, golden_answers, then its own fields."""
    from agent_envs.data.loaders import normalize_row

    source, spec = source or SOURCES[name], get_spec(name)
    suffix = Path(source.path).suffix
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / f"source{suffix}"
        raw.write_bytes(data)
        rows = [row for _, row in read_rows(raw)]
    out = []
    for i, row in enumerate(rows):
        where = f"{source.url()}, row {i + 1}"
        gold = source.gold(row) if source.gold is not None else None
        task = normalize_row(row if gold is None else {**row, "golden_answers": gold}, where, reward=spec.reward,
                             prefix=name, position=i, per_row_reward=spec.train, benchmark=name)
        answers = gold if gold is not None else list(task.answers)
        if not answers:  # a blank gold the loader warns about: kept as it is upstream, so row counts match
            answers = [str(row.get("ground_truth", row.get("answer", "")))]
        fields = {("orig_" + k if k in ("id", "question", "golden_answers") else k): v for k, v in row.items()}
        out.append({"id": source.id_format.format(i=i, **row), "question": task.question,
                    "golden_answers": answers, **fields})
    return out


def write_rows(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Write JSONL (gzipped for a .gz name) through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as raw:
            stream: Any = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.suffix == ".gz" else raw
            with io.TextIOWrapper(stream, encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def download(names: Sequence[str], folder: Path | None = None, base_url: str | None = None,
             log: Callable[[str], None] = print) -> list[Path]:
    """Fetch, check and write each named benchmark (its default file, and its question file with
    passages where `PASSAGE_SOURCES` has one); returns the files written."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise KeyError(f"no download for {', '.join(map(repr, unknown))}; `agent-envs data list` shows the ids")
    written = []
    for name in names:
        for source in (SOURCES[name], PASSAGE_SOURCES.get(name)):
            if source is None:
                continue
            target = local_path(name, folder, source.split)
            log(f"{name}: fetching {source.url(base_url)}")
            rows = convert(name, fetch(source, base_url), source)
            write_rows(rows, target)
            log(f"{name}: {len(rows)} rows -> {target}")
            written.append(target)
    return written


def listing(folder: Path | None = None) -> list[dict[str, Any]]:
    out = []
    for name, spec in BENCHMARKS.items():
        source = SOURCES.get(name)
        out.append({"id": name, "env_id": spec.env_id, "file": spec.default_file,
                    "local": local_path(name, folder).is_file(), "description": spec.description,
                    "source": source.url() if source else "none", "licence": source.licence if source else ""})
    return out


def _list(args: argparse.Namespace) -> int:
    import textwrap

    folder = Path(args.dir) if args.dir else None
    print(f"data folder: {folder or data_dir()}\n")
    rows = listing(folder)
    id_width, env_width = (max(len(r[key]) for r in rows) for key in ("id", "env_id"))
    # descriptions wrap at whole words under their column
    columns = f"{{:{id_width}s}} {{:4s}} {{:{env_width}s}} {{}}"
    indent = " " * len(columns.format("", "", "", ""))
    print(columns.format("id", "here", "env id", "description, source, licence"))
    for row in rows:
        text = textwrap.wrap(row["description"], width=110 - len(indent))
        print(columns.format(row["id"], "yes" if row["local"] else "no", row["env_id"], text[0] if text else ""))
        for line in [*text[1:], f"source: {row['source']}", f"licence: {row['licence']}"]:
            print(indent + line)
    return 0


def _download(args: argparse.Namespace) -> int:
    names = list(SOURCES) if args.all else args.ids
    if not names:
        raise SystemExit("agent-envs data download: name benchmark ids (see `agent-envs data list`) or --all")
    try:
        download(names, Path(args.dir) if args.dir else None, args.base_url)
    except (KeyError, DownloadError) as exc:
        raise SystemExit(f"agent-envs data download: {exc.args[0]}") from None
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `data list` and `data download` on the package CLI."""
    p = subparsers.add_parser("data", help="list benchmarks and download their evaluation files",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="data_command", required=True)
    q = sub.add_parser("list", help="every benchmark id, its source, licence and whether it is here")
    q.add_argument("--dir", default=None, help="data folder (default: $AGENT_ENVS_DATA_DIR or the cache's data/)")
    q.set_defaults(func=_list)
    q = sub.add_parser("download", help="fetch benchmark files, check their SHA-256, write the data folder")
    q.add_argument("ids", nargs="*", help="benchmark ids (from `agent-envs data list`)")
    q.add_argument("--all", action="store_true", help="every benchmark")
    q.add_argument("--dir", default=None, help="data folder (default: $AGENT_ENVS_DATA_DIR or the cache's data/)")
    q.add_argument("--base-url", default=None, help=f"mirror of the sources (default: ${BASE_URL_ENV} or {DEFAULT_BASE_URL})")
    q.set_defaults(func=_download)


__all__ = ["PASSAGE_SOURCES", "SOURCES", "DownloadError", "Source", "add_cli", "convert", "download", "fetch", "listing", "local_path"]
