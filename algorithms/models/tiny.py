"""A tiny local Qwen2-architecture model and tokenizer, built offline and cached.

No model hub is reachable in tests or in the CPU quickstart, so this module builds a stand-in:
a byte-level BPE tokenizer trained with `tokenizers` on protocol-style episode text and the gold
traces of the procedural worlds (`agent_envs.worlds`) (digits are
single tokens; the protocol tags and the ChatML markers are single tokens; EOS is `<|im_end|>`;
a Qwen-style ChatML chat template) and a random-init `Qwen2ForCausalLM` (hidden 128, 3 layers,
4 heads, 2 KV heads, FFN 384, tied embeddings, about 0.7M parameters), saved with
`save_pretrained` in float32. vLLM and transformers both load the directory.

    >>> from algorithms.models.tiny import build_tiny_model
    >>> path = build_tiny_model(seed=0)
    >>> sorted(p.name for p in path.iterdir())[:2]
    ['chat_template.jinja', 'config.json']

`warmup_steps > 0` additionally trains the random model for that many steps on the same episode
text, so that it writes the tag protocol (tool calls, results, answers) instead of noise; tests
and benchmarks use it to get real multi-turn episodes. Built models are cached under
`$AGENT_ENVS_CACHE/tiny-models` (default `~/.cache/agent-envs/tiny-models`) by a hash of all
settings, so the second call returns at once.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from agent_envs.base.paths import cache_root
from agent_envs.core.protocols import ArpoTags

BUILDER_VERSION = 2

PROTOCOL_TAGS = (
    "<think>",
    "</think>",
    "<python>",
    "</python>",
    "<search>",
    "</search>",
    "<browse>",
    "</browse>",
    "<result>",
    "</result>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
# The short system prompt of the warm-up episodes (short keeps warm-up cheap on a CPU). Envs that
# should get protocol-following behaviour from a warmed tiny model pass it as `system_prompt`.
WARMUP_SYSTEM_PROMPT = "Use <python> to compute, then answer in <answer> \\boxed{} </answer>."
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2.5-style ChatML: tool schemas in the system turn, tool results as a user turn of
# <tool_response> blocks. Kept short; assistant tool_calls objects are not rendered.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Everything that defines a tiny model; its hash names the cache entry."""

    seed: int = 0
    vocab_size: int = 512  # BPE target; the trained vocabulary may come out smaller
    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    corpus_episodes: int = 3000  # procedural episodes the tokenizer is trained on
    world_episodes: int = 300  # gold-trace episodes per world of TEXT_WORLDS, also tokenizer text
    warmup_steps: int = 0  # SFT steps on math episodes (0: random init)
    warmup_batch_size: int = 16
    warmup_lr: float = 2e-3
    extra_text: tuple[str, ...] = field(default=())  # more tokenizer training text (e.g. world traces)

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"TinyModelConfig: hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"TinyModelConfig: num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.vocab_size < 300:
            raise ValueError(
                f"TinyModelConfig: vocab_size={self.vocab_size} must be >= 300 (256 bytes + tags)"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"TinyModelConfig: warmup_steps={self.warmup_steps} must be >= 0")

    def key(self) -> str:
        blob = json.dumps({"v": BUILDER_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """Where built tiny models are kept, under the package's one cache root."""
    return cache_root() / "tiny-models"


# -- procedural episode text ----------------------------------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "zel", "qu", "bar", "nis", "dor", "el", "fen", "gri")
_MATH_WORDINGS = ("What is {e}?", "Compute {e}.", "Calculate the value of {e}.")
_QA_WORDINGS = ("Who founded {x}?", "In which city was {x} born?", "What is the capital of {x}?")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _tool_stub(name: str, argument: str, description: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, argument=argument, description=description)


_STUB_TOOLS = {
    "python": _tool_stub("python", "code", "runs Python code and returns what it prints"),
    "search": _tool_stub("search", "query", "searches a corpus and returns passages"),
}


def episode(
    rng: random.Random, system_prompt: str | None = None, math_only: bool = False
) -> tuple[list[dict], str]:
    """One procedural episode in the ARPO tag protocol: chat messages and the assistant response."""
    protocol = ArpoTags()
    if math_only or rng.random() < 0.6:
        a, b = rng.randint(2, 99999), rng.randint(2, 999)
        op = rng.choice(["*", "+", "-", "%"])
        value = eval(f"{a} {op} {b}")  # noqa: S307 - integers and one operator we just generated
        question = rng.choice(_MATH_WORDINGS).format(e=f"{a} {op} {b}")
        tools = [_STUB_TOOLS["python"]]
        response = (
            f"<think> I will compute {a} {op} {b} with python. </think> <python> print({a} {op} {b}) </python>"
            + protocol.format_observation(str(value))
            + f" <think> The result is {value}. </think> <answer> The final answer is \\boxed{{{value}}}. </answer>"
        )
    else:
        subject, answer = _name(rng), _name(rng)
        question = rng.choice(_QA_WORDINGS).format(x=subject)
        tools = [_STUB_TOOLS["search"], _STUB_TOOLS["python"]]
        passage = f"{subject} is linked to {answer}. {_name(rng)} is a town near {_name(rng)}."
        response = (
            f"<think> I need to find this. </think> <search> {question[:-1]} </search>"
            + protocol.format_observation(passage)
            + f" <think> The passage says {answer}. </think> <answer> The final answer is \\boxed{{{answer}}}. </answer>"
        )
    messages = protocol.messages(question, tools, system_prompt)
    return messages, response


# The worlds whose gold traces the tokenizer and warm-up read: a fixed list, so that registering a
# world (ours or a user's) does not change the tiny model, its cache key or any figure measured with it.
TEXT_WORLDS = ("arithmetic", "knowledge", "web")


def world_text(n_per_world: int, seed: int = 0) -> list[str]:
    """Gold-trace episodes of the `TEXT_WORLDS` (question and the gold actions) as ChatML text."""
    from agent_envs.worlds import make_world

    protocol = ArpoTags()
    texts = []
    for name in TEXT_WORLDS:
        world = make_world(name, seed=seed)
        for i in range(min(n_per_world, len(world))):
            task = world[i]
            prompt = protocol.render_prompt(protocol.messages(task.question, list(_STUB_TOOLS.values())))
            texts.append(prompt + " ".join(task.gold_trace or []) + IM_END + "\n")
    return texts


def corpus(n_episodes: int, seed: int, extra_text: Iterable[str] = ()) -> list[str]:
    """Rendered ChatML episodes (prompt + response + EOS) for tokenizer training and warm-up."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_episodes):
        messages, response = episode(rng)
        texts.append(ArpoTags().render_prompt(messages) + response + IM_END + "\n")
    texts.extend(extra_text)
    return texts


# -- building --------------------------------------------------------------------------------------


def _train_tokenizer(texts: Sequence[str], vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen2's own split (transformers re-applies it when loading a qwen2 checkpoint); `\p{N}`
    # alone makes every digit a token.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Added after training (new ids at the end): at encode time they are split off before BPE, so
    # each tag is always one token, and they stay visible in decoded text (not special).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    return fast


def _warmup(model, tokenizer, cfg: TinyModelConfig) -> None:
    """Short SFT on the episode text (response tokens only) so the model writes the protocol."""
    import torch

    rng = random.Random(cfg.seed + 1)
    protocol = ArpoTags()
    examples = []
    for _ in range(max(2000, cfg.warmup_batch_size * 8)):
        messages, response = episode(rng, WARMUP_SYSTEM_PROMPT, math_only=True)
        p = tokenizer(protocol.render_prompt(messages), add_special_tokens=False)["input_ids"]
        r = tokenizer(response + IM_END, add_special_tokens=False)["input_ids"]
        examples.append((p, r))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmup_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.warmup_lr, total_steps=cfg.warmup_steps, pct_start=0.1, anneal_strategy="cos"
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for _ in range(cfg.warmup_steps):
        idx = torch.randint(len(examples), (cfg.warmup_batch_size,), generator=gen).tolist()
        batch = [examples[i] for i in idx]
        width = max(len(p) + len(r) for p, r in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (p, r) in enumerate(batch):
            seq = p + r
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, len(p) : len(seq)] = torch.tensor(r)
            attn[row, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def _build(cfg: TinyModelConfig, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    texts = corpus(cfg.corpus_episodes, cfg.seed, cfg.extra_text) + world_text(cfg.world_episodes, cfg.seed)
    tokenizer = _train_tokenizer(texts, cfg.vocab_size)
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config).float()
    if cfg.warmup_steps:
        _warmup(model, tokenizer, cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tiny_model.json").write_text(
        json.dumps({"builder_version": BUILDER_VERSION, **asdict(cfg)}, indent=1)
    )


def build_tiny_model(out_dir: str | Path | None = None, seed: int = 0, **settings) -> Path:
    """Build (or fetch from the cache) a tiny model; return its checkpoint directory.

    `settings` are `TinyModelConfig` fields (e.g. `warmup_steps=150`). With `out_dir`, the model
    is built there (reused when that directory already holds the same settings); without it, under
    the cache directory, keyed by the settings' hash. Safe to call from parallel processes.
    """
    unknown = set(settings) - {f for f in TinyModelConfig.__dataclass_fields__ if f != "seed"}
    if unknown:
        raise TypeError(f"build_tiny_model: unknown settings {sorted(unknown)}; see TinyModelConfig")
    if "extra_text" in settings:
        settings["extra_text"] = tuple(settings["extra_text"])
    cfg = TinyModelConfig(seed=seed, **settings)
    cfg.validate()
    target = Path(out_dir) if out_dir is not None else default_cache_dir() / cfg.key()
    marker = target / "tiny_model.json"
    if marker.exists():
        saved = json.loads(marker.read_text())
        if (
            saved.get("builder_version") == BUILDER_VERSION
            and TinyModelConfig(
                **{
                    k: tuple(v) if k == "extra_text" else v
                    for k, v in saved.items()
                    if k != "builder_version"
                }
            )
            == cfg
        ):
            return target
        if out_dir is None:
            raise RuntimeError(f"tiny-model cache entry {target} holds other settings; delete it and retry")
        raise FileExistsError(f"{target} holds a tiny model with other settings; choose another out_dir")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _build(cfg, tmp)
        if target.exists() and not any(target.iterdir()):
            target.rmdir()
        try:
            tmp.rename(target)  # atomic: a parallel builder either wins or finds ours
        except OSError:
            if not marker.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


__all__ = [
    "CHAT_TEMPLATE",
    "PROTOCOL_TAGS",
    "TinyModelConfig",
    "build_tiny_model",
    "corpus",
    "default_cache_dir",
]
