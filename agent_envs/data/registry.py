"""The benchmarks a user can run by name, and where each one's data comes from.

Each `BenchmarkSpec` names its env family, its default correctness grader, the gym id registered
for it, the file looked up under `$AGENT_ENVS_DATA_DIR` by default, other local variants (splits),
and a Hugging Face id for users who have the `datasets` package and access.

    >>> from agent_envs.data import BENCHMARKS
    >>> BENCHMARKS["hotpotqa"].env_id, BENCHMARKS["hotpotqa"].default_file
    ('AgentQA-HotpotQA-v0', 'hotpotqa/arpo_eval_200.jsonl')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

BENCHMARK_FAMILIES = ("math", "qa", "search")  # the env families a benchmark can be played in


@dataclass(frozen=True)
class BenchmarkSpec:
    """One named benchmark.

    `files` maps a split name to a file relative to the data dir; `default_split` is the one
    `default_file` points at. `hf_*` describe the public Hugging Face copy (loaded only when the
    user has `datasets` and access). `reward` is the task grader (`math`, `qa` or `judge`); the
    training mixes grade each row by its own `ability` field. `train` marks training data, which
    the contamination filter checks against evaluation sets.
    """

    name: str
    family: str
    reward: str
    env_id: str
    default_file: str
    description: str
    metric: str
    files: Mapping[str, str] = field(default_factory=dict)
    default_split: str = "test"
    hf_id: str | None = None
    hf_config: str | None = None
    hf_split: str = "test"
    text_only: bool = False
    train: bool = False
    full_data: str = ""

    def __post_init__(self) -> None:
        if self.family not in BENCHMARK_FAMILIES:
            raise ValueError(
                f"benchmark {self.name!r}: family must be one of {BENCHMARK_FAMILIES}, got {self.family!r}"
            )
        if self.reward not in ("math", "qa", "judge"):
            raise ValueError(
                f"benchmark {self.name!r}: reward must be math, qa or judge, got {self.reward!r}"
            )
        if not self.files:
            object.__setattr__(self, "files", {self.default_split: self.default_file})
        elif self.files.get(self.default_split) != self.default_file:
            raise ValueError(
                f"benchmark {self.name!r}: files[{self.default_split!r}] must equal default_file"
            )


def _spec(**kw) -> BenchmarkSpec:
    return BenchmarkSpec(**kw)


_QA_FULL = "FlashRAG benchmark collection on Hugging Face (`RUC-NLPIR/FlashRAG_datasets`, config `{cfg}`)"

BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in [
        # --- math -------------------------------------------------------------------------------
        _spec(
            name="gsm8k",
            family="math",
            reward="math",
            env_id="AgentMath-GSM8K-v0",
            default_file="gsm8k/test.jsonl",
            hf_id="openai/gsm8k",
            hf_config="main",
            hf_split="test",
            description="grade-school word problems (1319 test questions), integer answers",
            metric="accuracy (math equivalence)",
            full_data="github.com/openai/grade-school-math or HF `openai/gsm8k` (config main, split test)",
        ),
        _spec(
            name="math500",
            family="math",
            reward="math",
            env_id="AgentMath-MATH500-v0",
            default_file="math500/test.jsonl",
            hf_id="HuggingFaceH4/MATH-500",
            hf_split="test",
            description="MATH-500: the PRM800K 500-problem test subset of MATH, LaTeX answers",
            metric="accuracy (math equivalence)",
            full_data="github.com/openai/prm800k (math_splits/test.jsonl) or HF `HuggingFaceH4/MATH-500`",
        ),
        _spec(
            name="aime24",
            family="math",
            reward="math",
            env_id="AgentMath-AIME24-v0",
            default_file="aime24/test.jsonl",
            hf_id="HuggingFaceH4/aime_2024",
            hf_split="train",
            description="AIME 2024 I and II (30 problems), integer answers 0-999",
            metric="accuracy (math equivalence)",
            full_data="HF `HuggingFaceH4/aime_2024`",
        ),
        _spec(
            name="aime25",
            family="math",
            reward="math",
            env_id="AgentMath-AIME25-v0",
            default_file="aime25/test.jsonl",
            hf_id="math-ai/aime25",
            hf_split="test",
            description="AIME 2025 I and II (30 problems), integer answers 0-999",
            metric="accuracy (math equivalence)",
            full_data="HF `math-ai/aime25`",
        ),
        # --- knowledge / multi-hop QA -------------------------------------------------------------
        _spec(
            name="hotpotqa",
            family="qa",
            reward="qa",
            env_id="AgentQA-HotpotQA-v0",
            default_file="hotpotqa/arpo_eval_200.jsonl",
            default_split="arpo_eval_200",
            files={
                "arpo_eval_200": "hotpotqa/arpo_eval_200.jsonl",
                "dev_500_ircot": "hotpotqa/dev_500_ircot_with_contexts.jsonl",
                "dev_500_r1searcher": "hotpotqa/dev_500_r1searcher.jsonl",
                "dev_512_deepresearcher": "hotpotqa/dev_512_deepresearcher.jsonl",
            },
            hf_id="RUC-NLPIR/FlashRAG_datasets",
            hf_config="hotpotqa",
            hf_split="dev",
            description="HotpotQA distractor dev, 2-hop Wikipedia questions (ARPO's 200-question eval subset)",
            metric="token F1 (also EM, acc)",
            full_data=_QA_FULL.format(cfg="hotpotqa") + "; hotpotqa.github.io",
        ),
        _spec(
            name="2wikimultihopqa",
            family="qa",
            reward="qa",
            env_id="AgentQA-2WikiMultihopQA-v0",
            default_file="2wikimultihopqa/arpo_eval_200.jsonl",
            default_split="arpo_eval_200",
            files={
                "arpo_eval_200": "2wikimultihopqa/arpo_eval_200.jsonl",
                "dev_500_r1searcher": "2wikimultihopqa/dev_500_r1searcher.jsonl",
                "dev_512_deepresearcher": "2wikimultihopqa/dev_512_deepresearcher.jsonl",
                "dev_2_hipporag": "2wikimultihopqa/dev_2_hipporag_with_context.jsonl",
            },
            hf_id="RUC-NLPIR/FlashRAG_datasets",
            hf_config="2wikimultihopqa",
            hf_split="dev",
            description="2WikiMultihopQA dev, compositional / comparison questions over Wikipedia + Wikidata",
            metric="token F1 (also EM, acc)",
            full_data=_QA_FULL.format(cfg="2wikimultihopqa") + "; github.com/Alab-NII/2wikimultihop",
        ),
        _spec(
            name="musique",
            family="qa",
            reward="qa",
            env_id="AgentQA-MuSiQue-v0",
            default_file="musique/arpo_eval_200.jsonl",
            default_split="arpo_eval_200",
            files={
                "arpo_eval_200": "musique/arpo_eval_200.jsonl",
                "dev_100_kag": "musique/dev_100_kag_with_paragraphs.jsonl",
                "dev_500_r1searcher": "musique/dev_500_r1searcher.jsonl",
                "dev_512_deepresearcher": "musique/dev_512_deepresearcher.jsonl",
            },
            hf_id="RUC-NLPIR/FlashRAG_datasets",
            hf_config="musique",
            hf_split="dev",
            description="MuSiQue-Ans dev, 2-4 hop composed questions",
            metric="token F1 (also EM, acc)",
            full_data=_QA_FULL.format(cfg="musique") + "; github.com/StonyBrookNLP/musique",
        ),
        _spec(
            name="bamboogle",
            family="qa",
            reward="qa",
            env_id="AgentQA-Bamboogle-v0",
            default_file="bamboogle/test.jsonl",
            hf_id="RUC-NLPIR/FlashRAG_datasets",
            hf_config="bamboogle",
            hf_split="test",
            description="Bamboogle (125 hand-written 2-hop questions that search engines answer badly)",
            metric="token F1 (also EM, acc)",
            full_data=_QA_FULL.format(cfg="bamboogle"),
        ),
        # --- deep search --------------------------------------------------------------------------
        _spec(
            name="gaia",
            family="search",
            reward="judge",
            env_id="AgentSearch-GAIA-v0",
            default_file="gaia/dev_text_103.jsonl.gz",
            default_split="dev_text_103",
            hf_id="gaia-benchmark/GAIA",
            hf_config="2023_all",
            hf_split="validation",
            text_only=True,
            description="GAIA validation, the 103 text-only questions (levels 1-3); evaluation only, do not reshare",
            metric="LLM-judge accuracy (EM/F1 reported beside it)",
            full_data="HF `gaia-benchmark/GAIA` (gated: accept the terms; config 2023_all, split validation)",
        ),
        _spec(
            name="hle",
            family="search",
            reward="judge",
            env_id="AgentSearch-HLE-v0",
            default_file="hle/arpo_top_500.jsonl.gz",
            default_split="arpo_top_500",
            files={
                "arpo_top_500": "hle/arpo_top_500.jsonl.gz",
                "webthinker_text_500": "hle/webthinker_text_500.jsonl.gz",
                "arpo_rl_val_100": "hle/arpo_rl_val_100.jsonl.gz",
            },
            hf_id="cais/hle",
            hf_split="test",
            text_only=True,
            description="Humanity's Last Exam, text-only 500-question subsets (ARPO's and WebThinker's)",
            metric="LLM-judge accuracy (EM/F1 reported beside it)",
            full_data="HF `cais/hle` (gated; split test; drop rows with an image for text-only)",
        ),
        _spec(
            name="webwalkerqa",
            family="search",
            reward="judge",
            env_id="AgentSearch-WebWalkerQA-v0",
            default_file="webwalkerqa/arpo_eval_200.jsonl",
            default_split="arpo_eval_200",
            files={
                "arpo_eval_200": "webwalkerqa/arpo_eval_200.jsonl",
                "test_680": "webwalkerqa/test_680.jsonl",
            },
            hf_id="callanwu/WebWalkerQA",
            hf_split="main",
            description="WebWalkerQA: questions answered by walking a website's links (English and Chinese)",
            metric="LLM-judge accuracy (EM/F1 reported beside it)",
            full_data="HF `callanwu/WebWalkerQA`; github.com/Alibaba-NLP/WebAgent",
        ),
        _spec(
            name="xbench-deepsearch",
            family="search",
            reward="judge",
            env_id="AgentSearch-XBenchDeepSearch-v0",
            default_file="xbench_deepsearch/arpo_eval_100.jsonl.gz",
            default_split="arpo_eval_100",
            description="xbench-DeepSearch (100 Chinese deep-search questions); evaluation only, do not reshare",
            metric="LLM-judge accuracy (EM/F1 reported beside it)",
            full_data="released encrypted at github.com/xbench-ai/xbench-evals (decrypt with their script)",
        ),
        # --- ARPO RL training data ----------------------------------------------------------------
        _spec(
            name="arpo_rl",
            family="qa",
            reward="qa",
            env_id="AgentQA-ARPO-RL-v0",
            default_file="arpo_rl/train_10k.jsonl",
            default_split="train",
            files={
                "train": "arpo_rl/train_10k.jsonl",
                "train_parquet": "arpo_rl/train_10k.parquet",
                "valid": "arpo_rl/valid.jsonl",
                "valid_parquet": "arpo_rl/valid.parquet",
            },
            hf_id="dongguanting/ARPO-RL-Reasoning-10K",
            hf_split="train",
            train=True,
            description="ARPO RL reasoning mix: 5000 math + 5000 multi-hop QA (each row graded by its ability)",
            metric="training data (reward: ARPO recipe)",
            full_data="github.com/dongguanting/ARPO (rl_datasets/)",
        ),
        _spec(
            name="arpo_hard_search",
            family="search",
            reward="qa",
            env_id="AgentSearch-ARPO-HardSearch-v0",
            default_file="arpo_rl/hard_search_1k.jsonl",
            default_split="train",
            hf_id="dongguanting/ARPO-RL-DeepSearch-1K",
            hf_split="train",
            train=True,
            description="ARPO deep-search RL set (1071 questions)",
            metric="training data (reward: ARPO recipe)",
            full_data="github.com/dongguanting/ARPO (rl_datasets/)",
        ),
    ]
}

# names people type for the same benchmark
ALIASES = {
    "math-500": "math500",
    "math_500": "math500",
    "aime2024": "aime24",
    "aime2025": "aime25",
    "hotpot": "hotpotqa",
    "hotpot_qa": "hotpotqa",
    "2wiki": "2wikimultihopqa",
    "2wikimqa": "2wikimultihopqa",
    "xbench": "xbench-deepsearch",
    "xbench_deepsearch": "xbench-deepsearch",
    "webwalker": "webwalkerqa",
    "hle_text": "hle",
    "arpo": "arpo_rl",
    "arpo_rl_10k": "arpo_rl",
    "hard_search_1k": "arpo_hard_search",
}


def get_spec(name: str) -> BenchmarkSpec:
    """The spec of a benchmark by name or alias (case-insensitive); a clear error otherwise."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BENCHMARKS:
        raise KeyError(
            f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}. "
            "For your own data use agent_envs.data.load_tasks(path, reward=...)"
        )
    return BENCHMARKS[key]
