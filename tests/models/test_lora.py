"""LoRA on the tiny model: an optimizer step changes only the adapters; a weight sync hands the
engines the merged weights (HF, the vLLM server's file), after which their log-probs equal the
learner's within 2e-3; adapters save and load exactly. The vLLM engine's sync (the learner's
streaming path) is tested on SmolLM2 in test_smollm2.py, beside the vLLM engine it starts."""

from __future__ import annotations

import pytest
import torch
from model_helpers import TOL, max_gap
from transformers import AutoModelForCausalLM

from algorithms.core.weight_gather import every_rank_weights
from algorithms.models.lora import (
    LoRAConfig,
    adapter_state_dict,
    is_lora,
    load_adapters,
    merged_state_dict,
    merged_weights,
    save_adapters,
    save_merged,
    wrap_lora,
)
from algorithms.models.resolve import resolve_model

ON = LoRAConfig(enabled=True, r=8)


def base(path: str | None = None):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path or resolve_model("tiny"), dtype=torch.float32)


def trained_lora(path: str | None = None, steps: int = 3):
    """A LoRA model after a few Adam steps on a next-token loss, so the adapters are not zero."""
    model = wrap_lora(base(path), ON)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    ids = torch.arange(1, 33)[None] % model.config.vocab_size
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def test_config_checks_name_the_field():
    assert LoRAConfig().enabled is False and (LoRAConfig().r, LoRAConfig().alpha) == (16, 32.0)
    assert "gate_proj" in LoRAConfig().target_modules and LoRAConfig().scaling == 2.0
    with pytest.raises(ValueError, match="'lora.r' must be >= 1"):
        LoRAConfig(r=0)
    with pytest.raises(ValueError, match=r"'lora.dropout' must be in \[0, 1\)"):
        LoRAConfig(dropout=1.0)
    with pytest.raises(ValueError, match=r"'lora.target_modules': \['qkv'\] name no linear layer"):
        wrap_lora(base(), LoRAConfig(enabled=True, target_modules=("q_proj", "qkv")))
    plain = base()
    assert wrap_lora(plain, LoRAConfig()) is plain and not is_lora(plain)


def test_an_optimizer_step_changes_only_the_adapters():
    model = wrap_lora(base(), ON)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every attention and MLP projection of every layer got an adapter
    assert len(trainable) == 2 * 7 * model.config.num_hidden_layers
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # all parameters offered: frozen ones must not move
    ids = torch.arange(1, 25)[None]
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert any(".lora_B." in n for n in changed)  # B starts at zero: the first step moves it


def test_merged_weights_are_the_base_names_and_leave_the_model_alone():
    plain = base()
    names = list(plain.state_dict())
    model = trained_lora()
    own = {n: t.clone() for n, t in model.state_dict().items()}
    merged = merged_state_dict(model)
    assert list(merged) == names
    assert all(torch.equal(t, own[n]) for n, t in model.state_dict().items())  # nothing merged in place
    assert is_lora(model) and any(".lora_B." in n for n in model.state_dict())
    # W + (alpha / r) B A, checked on one projection
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    expect = q.base_layer.weight + ON.scaling * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], expect, atol=1e-6)
    # a plain model loads the merged weights strictly and computes what the LoRA model computes
    plain.load_state_dict(merged)
    ids = torch.arange(2, 30)[None]
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4)
    # the learner's colocated path: the gathered state dict streamed pair by pair
    streamed = dict(merged_weights(every_rank_weights(model.state_dict(), "cpu"), model))
    assert list(streamed) == names and all(torch.equal(streamed[n], merged[n]) for n in names)


def test_hf_engine_after_a_sync_matches_the_learner():
    from algorithms.rollout.hf import HFEngine

    model = trained_lora()
    engine = HFEngine(resolve_model("tiny"), seed=0)
    prompts = [[1, 5, 7, 9], [3, 4, 4, 8, 20, 11]]
    assert max_gap(engine, model, prompts) > 10 * TOL  # before: the engine holds the base weights
    engine.sync_weights(model)
    assert max_gap(engine, model, prompts) < TOL
    # colocated: the engine decodes with the learner's own LoRA module, no copy
    shared = HFEngine(model, engine.tokenizer, seed=0)
    shared.sync_weights(model)  # a no-op
    assert max_gap(shared, model, prompts) < TOL


def test_server_sync_writes_merged_weights(tmp_path, monkeypatch):
    """`VLLMServerEngine.sync_weights` writes the file the server loads. No server runs here: its
    HTTP calls are recorded instead, and the file is loaded the way the server would (strictly,
    into the base architecture); tests/rollout runs the real server."""
    from algorithms.rollout.vllm_server import WEIGHTS_FILE, VLLMServerEngine

    model = trained_lora()
    engine = VLLMServerEngine("http://127.0.0.1:9/v1", tokenizer=resolve_model("tiny"), sync_dir=tmp_path)
    calls = []
    monkeypatch.setattr(engine, "_call_server", lambda method, path, body: calls.append(path))
    engine.sync_weights(model)
    assert calls == ["/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]
    assert (tmp_path / WEIGHTS_FILE).is_file() and (tmp_path / "config.json").is_file()
    served = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ids = torch.arange(2, 30)[None]
    with torch.no_grad():
        assert torch.allclose(served(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4)


def test_the_merged_model_saves_as_a_plain_checkpoint(tmp_path):
    model = trained_lora()
    out = save_merged(model, tmp_path / "final_model")
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not is_lora(saved) and set(saved.state_dict()) == set(merged_state_dict(model))
    ids = torch.arange(2, 30)[None]
    with torch.no_grad():
        assert torch.allclose(saved(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4)
    assert is_lora(model)  # saving merged a copy


def test_adapters_save_and_load_exactly(tmp_path):
    model = trained_lora()
    out = save_adapters(model, tmp_path / "adapters")
    assert {p.name for p in out.iterdir()} >= {"adapter_model.safetensors", "adapter_config.json"}
    torch.manual_seed(1)  # another initialisation of A: loading must replace it
    fresh = wrap_lora(base(), ON)
    saved = adapter_state_dict(model)
    assert not all(torch.equal(t, adapter_state_dict(fresh)[n]) for n, t in saved.items())
    load_adapters(fresh, out)
    loaded = adapter_state_dict(fresh)
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[n], t) for n, t in saved.items())
    merged, again = merged_state_dict(model), merged_state_dict(fresh)
    assert all(torch.equal(merged[n], again[n]) for n in merged)
    with pytest.raises(ValueError, match="r=8 but the model's adapters have r=4; set lora.r to match"):
        load_adapters(wrap_lora(base(), LoRAConfig(enabled=True, r=4)), out)
    with pytest.raises(FileNotFoundError, match="no adapter_model.safetensors"):
        load_adapters(fresh, tmp_path)
