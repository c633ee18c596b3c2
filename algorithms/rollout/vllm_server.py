"""`VLLMServerEngine`: rollouts from a vLLM server in another process or on another node, with
weight sync from the learner.

Generation is `OpenAIEngine` against vLLM's OpenAI-compatible completions endpoint, token ids in
and out (the prompt is a list of ids; the generated ids and their log-probs come back exactly).
`sync_weights(model)` hands the learner's weights over through a folder both sides can read: it
writes the full state dict as one safetensors file into `sync_dir` (`/dev/shm` on one machine, a
shared file system across nodes), atomically, then asks the server to load it in place and drop
its prefix cache. It uses vLLM's development endpoints `POST /collective_rpc` (`reload_weights`
with `weights_path`), `POST /reset_prefix_cache` and `POST /update_weight_version`, so the server
runs with `VLLM_SERVER_DEV_MODE=1`. `agent-envs serve-rollout` starts one with every flag training
needs:

    agent-envs serve-rollout runs/sft/final --port 8000          # in another shell or on another node

    from algorithms.rollout.vllm_server import VLLMServerEngine
    engine = VLLMServerEngine("http://127.0.0.1:8000/v1", tokenizer="runs/sft/final")
    engine.sync_weights(learner_model)        # the server now samples from the learner's weights
    engine.server_weight_version()            # '1'

(not a doctest: it needs a running server; tests/rollout/test_vllm_server.py starts one.)

The file handoff costs a write and a read of the weights per sync: about 1 s per GB on local
memory (`/dev/shm`). On GPUs, vLLM's NCCL weight-transfer endpoints (`/init_weight_transfer_engine`,
`/update_weights`) move tensors without the file (see docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from algorithms.rollout.openai import OpenAIEngine

WEIGHTS_FILE = "model.safetensors"


class VLLMServerEngine(OpenAIEngine):
    """An `OpenAIEngine` that can also receive the learner's weights.

    Args:
        base_url: the server's OpenAI root, e.g. `http://127.0.0.1:8000/v1`.
        model: the served model name (`serve-rollout` serves it as `policy`).
        tokenizer: the policy's tokenizer (object or path): prompts are token ids.
        sync_dir: where weights are handed over; a new folder under /dev/shm (or the temp folder)
            by default. Across nodes pass a folder on a file system both can read.
        timeout_s: per request, also for a weight load.
    """

    def __init__(self, base_url: str, model: str = "policy", tokenizer: Any = None, *,
                 sync_dir: str | os.PathLike | None = None, **kwargs: Any) -> None:
        if tokenizer is None:
            raise ValueError("VLLMServerEngine needs the policy's tokenizer (object or path): prompts are token ids")
        super().__init__(base_url, model, tokenizer, prompt_mode="ids", **kwargs)
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.server_root = root
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.sync_dir = Path(sync_dir) if sync_dir else Path(tempfile.mkdtemp(prefix="agent-envs-weights-", dir=base))
        self.weight_version = 0

    async def agenerate(self, prompts: Any, params: Any) -> list[Any]:
        try:
            return await super().agenerate(prompts, params)
        except RuntimeError as e:  # retries spent: the server is gone or broken
            raise RuntimeError(self._gone(e)) from e

    def sync_weights(self, model: Any, config: Any = None) -> None:
        """Write the weights to `sync_dir` and have the server load them in place.

        `model` is a torch module or a full state dict (what `accelerator.get_state_dict` gathers
        from FSDP or ZeRO-3 shards); `config`, the model config, is written once beside them."""
        from safetensors.torch import save_file

        if hasattr(model, "state_dict"):
            from algorithms.models.lora import merged_state_dict

            module = getattr(model, "module", model)  # unwrap DDP
            # LoRA adapters merged into a copy, under the base model's names
            tensors, config = merged_state_dict(module), config or getattr(module, "config", None)
        else:
            tensors = model
        # clone shared tensors (a tied lm_head) so safetensors stores each name on its own
        seen: set[int] = set()
        state = {}
        for name, tensor in tensors.items():
            t = tensor.detach().cpu().contiguous()
            if t.data_ptr() in seen:
                t = t.clone()
            seen.add(t.data_ptr())
            state[name] = t
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        if config is not None and not (self.sync_dir / "config.json").exists():
            config.to_json_file(str(self.sync_dir / "config.json"))
        partial = self.sync_dir / (WEIGHTS_FILE + ".partial")
        save_file(state, str(partial))
        os.replace(partial, self.sync_dir / WEIGHTS_FILE)  # the server never reads half a file
        self._call_server("POST", "/collective_rpc", {"method": "reload_weights",
                                       "kwargs": {"weights_path": str(self.sync_dir)}})
        self._call_server("POST", "/reset_prefix_cache", None)
        self.weight_version += 1
        self._call_server("POST", "/update_weight_version", {"new_version": str(self.weight_version)})

    def _gone(self, why: object) -> str:
        return (f"the rollout server {self.server_root} stopped answering ({why}). Is it running? Start it "
                "again (`agent-envs serve-rollout ...`) and continue the run with `agent-envs train ... --resume`")

    def server_weight_version(self) -> str:
        """The version the server reports (`default` before the first sync)."""
        return self._call_server("GET", "/weight_info", None)["weight_version"]

    def _call_server(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        url = self.server_root + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            hint = (" (start the server with VLLM_SERVER_DEV_MODE=1, e.g. `agent-envs serve-rollout`)"
                    if e.code == 404 else "")
            raise RuntimeError(f"{method} {url} failed: HTTP {e.code} {e.read()[:300]!r}{hint}") from None
        except OSError as e:
            raise RuntimeError(self._gone(f"{method} {url} failed: {e}")) from None
        return json.loads(text) if text.strip() else None


def server_command(model: str, port: int, host: str = "127.0.0.1", extra: list[str] | None = None) -> list[str]:
    """The vLLM server command line with what training needs: exact log-probs of the sampled
    distribution, enough top-k log-probs for entropy, float32 on CPU, a fixed seed."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "policy", "--host", host, "--port", str(port),
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "20", "--seed", "0",
            *(extra or [])]


def _serve(args: argparse.Namespace) -> int:
    import socket

    with socket.socket() as probe:  # a port in use: one line now, not vLLM's traceback after loading
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((args.host, args.port))
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    cmd = server_command(args.model, args.port, args.host, shlex.split(args.vllm_args))
    print("serving the policy for rollouts:", " ".join(cmd[:3]), "...", flush=True)
    os.execve(cmd[0], cmd, env)  # the server replaces this process: signals reach vLLM directly
    return 0  # pragma: no cover


def add_cli(subparsers: Any) -> None:
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser(
        "serve-rollout", help="serve a policy with vLLM for server-mode rollouts (weight sync enabled)",
        description="Runs vLLM's OpenAI-compatible server with the development endpoints the learner's "
                    "weight sync uses.")
    p.add_argument("model", help="checkpoint folder the server starts from")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other nodes")
    p.add_argument("--vllm-args", default="", help="further vLLM options as one string, e.g. "
                   "'--dtype float32 --max-model-len 4096 --tensor-parallel-size 8'")
    p.set_defaults(func=_serve)


__all__ = ["VLLMServerEngine", "server_command"]
