"""LoRA for the learners: wrap a model with `peft` adapters, hand the engines merged weights, and
save / load the adapters alone.

The learner trains only the adapters (the base weights are frozen), while the rollout engines
(HF, vLLM in-process, vLLM server) know nothing of LoRA: they receive full weights under the base
model's names, each adapted projection merged as `W + (alpha / r) · B @ A`. The merge makes new
tensors; the trained model keeps its separate adapters (nothing is merged into it in place), so
the next optimizer step still updates `A` and `B` only.

    >>> import torch
    >>> from transformers import AutoModelForCausalLM
    >>> from algorithms.models.lora import LoRAConfig, merged_state_dict, wrap_lora
    >>> from algorithms.models.resolve import resolve_model
    >>> base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    >>> names = set(base.state_dict())
    >>> model = wrap_lora(base, LoRAConfig(enabled=True, r=4))
    >>> trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    >>> all(".lora_" in n for n in trainable)
    True
    >>> set(merged_state_dict(model)) == names   # what an engine's load_weights expects
    True

Checkpoints can keep the adapters only (`save_adapters` / `load_adapters`, peft's
`adapter_model.safetensors` + `adapter_config.json`); a final model for serving is a plain
checkpoint folder of the merged weights (`save_merged`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent_envs.base.config import check_types, option, require

# the attention and MLP projections of Llama / Qwen2 / Mistral-style decoders
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# how peft names a wrapped layer's tensors in a state dict: <module>.base_layer.<weight|bias>,
# <module>.lora_A.<adapter>.weight, <module>.lora_B.<adapter>.weight
_LORA_PART = re.compile(r"^(?P<module>.+)\.(?:base_layer\.(?P<base>weight|bias)|lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight)$")
_PEFT_PREFIX = "base_model.model."


@dataclass
class LoRAConfig:
    """LoRA settings (a learner's `lora` field: `lora.enabled=true lora.r=8` on the command line)."""

    enabled: bool = option(False, "train LoRA adapters instead of the full model")
    r: int = option(16, "adapter rank")
    alpha: float = option(32.0, "scale numerator: the update is (alpha / r) * B @ A")
    dropout: float = option(0.0, "dropout on the adapters' input (training only)")
    target_modules: tuple[str, ...] = option(
        DEFAULT_TARGETS, "module names that get adapters (default: every attention and MLP projection)"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_types(self, "lora.")
        require(self.r >= 1, "lora.r", "must be >= 1", self.r)
        require(self.alpha > 0, "lora.alpha", "must be > 0", self.alpha)
        require(0.0 <= self.dropout < 1.0, "lora.dropout", "must be in [0, 1)", self.dropout)
        require(len(self.target_modules) > 0, "lora.target_modules", "must name at least one module",
                self.target_modules)

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


def _unwrap(model: Any) -> Any:
    """The module inside DDP / Accelerate wrappers (`.module`), else `model`."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def is_lora(model: Any) -> bool:
    """Whether `model` (or the module a DDP wrapper holds) carries peft LoRA adapters."""
    peft = sys.modules.get("peft")  # a model can only be wrapped if peft was imported
    return peft is not None and isinstance(_unwrap(model), peft.PeftModel)


def wrap_lora(model: Any, cfg: LoRAConfig) -> Any:
    """`model` with LoRA adapters on `cfg.target_modules` and its base weights frozen; `model`
    itself when `cfg.enabled` is false (so callers wrap unconditionally).

    Raises ValueError naming `lora.target_modules` when a target matches no linear layer."""
    if not cfg.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    absent = [t for t in cfg.target_modules if t not in linear]
    if absent:
        raise ValueError(f"config field 'lora.target_modules': {absent} name no linear layer of this model "
                         f"(its linear layers: {sorted(linear)})")
    peft_cfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, peft_cfg)
    if getattr(model, "is_gradient_checkpointing", False):
        # checkpointed blocks need an input that requires grad, which frozen embeddings do not give
        wrapped.enable_input_require_grads()
    return wrapped


def _scalings(model: Any) -> dict[str, float]:
    """Per adapted module (named as in the base model's state dict): the active adapter's scale."""
    from peft.tuners.lora import LoraLayer

    peft_model = _unwrap(model)
    adapter = peft_model.active_adapter
    out = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.scaling:
            out[name.removeprefix(_PEFT_PREFIX)] = float(module.scaling[adapter])
    return out


def merged_weights(pairs: Iterable[tuple[str, torch.Tensor]], model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the merged full weights, from the pairs of the LoRA model's state
    dict (its own, or one gathered from FSDP / ZeRO-3 shards, or streamed rank to rank).

    Names come out as the base model has them; each adapted weight is yielded once its base
    weight and both factors have passed (peft stores them next to each other, so at most one
    module's tensors wait at a time). A model without adapters passes its pairs through.
    """
    if not is_lora(model):
        yield from pairs
        return
    scalings = _scalings(model)
    adapter = _unwrap(model).active_adapter
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    done: set[str] = set()
    for full_name, tensor in pairs:
        name = full_name.removeprefix(_PEFT_PREFIX)
        part = _LORA_PART.match(name)
        if part is None:
            yield name, tensor
            continue
        module = part["module"]
        if part["ab"] and part["adapter"] != adapter:
            continue  # an inactive adapter: not part of the policy
        if module in done:  # a bias after its module's weight was merged
            yield f"{module}.{part['base']}", tensor
            continue
        parts = waiting.setdefault(module, {})
        parts[part["ab"] or part["base"]] = tensor
        if {"weight", "A", "B"} <= parts.keys():
            del waiting[module]
            done.add(module)
            yield f"{module}.weight", _merge(parts["weight"], parts["A"], parts["B"], scalings[module])
            if "bias" in parts:  # a bias comes before the factors: kept back to keep the base order
                yield f"{module}.bias", parts["bias"]
    if waiting:
        raise RuntimeError(f"merged_weights: LoRA modules {sorted(waiting)[:3]} lack a base weight or a "
                           "factor in the state dict (was it gathered whole?)")


@torch.no_grad()
def _merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    # in float32 whatever the weights' dtype, then back: a bf16 sum would round the small update away
    delta = b.to(torch.float32) @ a.to(device=b.device, dtype=torch.float32)
    return (weight.to(torch.float32) + scaling * delta.to(weight.device)).to(weight.dtype)


def merged_state_dict(model: Any, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The full weights an engine loads: base model names, adapters merged (new tensors; `model`
    is left as it is). `state`: the model's state dict when gathered elsewhere (e.g.
    `accelerator.get_state_dict(model)` under FSDP); by default `model.state_dict()`.
    A model without adapters gives its own state dict."""
    if state is None:
        state = _unwrap(model).state_dict()
    return {name: t.detach() for name, t in merged_weights(state.items(), model)}


def save_merged(model: Any, out_dir: str | Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
    """`save_pretrained` the merged model: a plain checkpoint folder (no peft needed to load it)
    that transformers and vLLM load like any other; `state` as in `merged_state_dict`. A model
    without adapters is saved as it is. The tokenizer is the caller's to save beside it."""
    out = Path(out_dir)
    module = _unwrap(model)
    merged = merged_state_dict(module, state)
    base = module.get_base_model() if is_lora(module) else module
    # the base model's own config and generation config; the merged tensors under its names
    base.save_pretrained(out, state_dict=merged, safe_serialization=True)
    return out


def adapter_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Only the adapter tensors of `model`, under peft's portable names (no adapter name)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(_unwrap(model))


def save_adapters(model: Any, out_dir: str | Path) -> Path:
    """Write the adapters (`adapter_model.safetensors`) and their config (`adapter_config.json`)."""
    if not is_lora(model):
        raise ValueError("save_adapters: the model has no LoRA adapters (lora.enabled is false)")
    out = Path(out_dir)
    _unwrap(model).save_pretrained(out, safe_serialization=True)
    return out


def load_adapters(model: Any, in_dir: str | Path) -> None:
    """Load adapters saved by `save_adapters` into `model`, which was wrapped with the same
    settings; errors name the folder and what differs."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(in_dir)
    weights, config = folder / ADAPTER_WEIGHTS, folder / ADAPTER_CONFIG
    if not weights.is_file():
        raise FileNotFoundError(f"{folder}: no {ADAPTER_WEIGHTS} (a folder written by save_adapters)")
    if not is_lora(model):
        raise ValueError(f"load_adapters({folder}): wrap the model with wrap_lora first (lora.enabled: true)")
    peft_model = _unwrap(model)
    if config.is_file():
        saved = json.loads(config.read_text())
        ours = peft_model.peft_config[peft_model.active_adapter]
        for key in ("r", "lora_alpha"):
            if saved.get(key) != getattr(ours, key):
                raise ValueError(f"{config}: {key}={saved.get(key)} but the model's adapters have "
                                 f"{key}={getattr(ours, key)}; set lora.{'alpha' if key == 'lora_alpha' else key} to match")
    state = load_file(str(weights))
    result = set_peft_model_state_dict(peft_model, state)
    missing = [k for k in getattr(result, "missing_keys", []) if ".lora_" in k]
    unexpected = list(getattr(result, "unexpected_keys", []))
    if missing or unexpected:
        raise ValueError(f"{weights}: adapters do not fit the model (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); were they saved with the same lora.target_modules?")


__all__ = [
    "DEFAULT_TARGETS",
    "LoRAConfig",
    "adapter_state_dict",
    "is_lora",
    "load_adapters",
    "merged_state_dict",
    "merged_weights",
    "save_adapters",
    "save_merged",
    "wrap_lora",
]
