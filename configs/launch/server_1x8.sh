#!/usr/bin/env bash
# 1 node x 8 GPUs, server mode: a vLLM server with tensor parallel 4 on GPUs 4-7, the learner
# (FSDP) on GPUs 0-3. Every learner rank sends its rollouts to the one server; after each
# optimizer step the learner gathers the full weights and the server reloads them from SYNC_DIR
# (docs/scaling.md, "Server-mode rollouts"). For policies whose vLLM copy would not fit beside
# the learner's shard on each GPU. 14B on 4 learner GPUs is tight on H100 (77 of 80 GB by
# `python -m algorithms.core.capacity --gpus 4 --server-gpus 4 --tp 4`); roomy on H200.
#   bash configs/launch/server_1x8.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source configs/launch/common.sh
ALGO="${ALGO:-grpo}"
PRESET="${PRESET:-configs/grpo_qwen3_14b.yaml}"
MODEL="${MODEL:-Qwen/Qwen3-14B}"   # the server's starting checkpoint; the learner syncs at start
OUT="${OUT:-runs/server_1x8}"
PORT="${PORT:-8000}"
SYNC_DIR="${SYNC_DIR:-/dev/shm/agent-envs-sync}"
MAX_LEN="${MAX_LEN:-8200}"         # the preset's engine_kwargs.max_model_len

CUDA_VISIBLE_DEVICES=4,5,6,7 run_bg agent-envs serve-rollout "$MODEL" --port "$PORT" \
    --vllm-args "--tensor-parallel-size 4 --dtype bfloat16 --max-model-len $MAX_LEN --gpu-memory-utilization 0.9"
# the learner connects when the server answers
[ -n "${DRY_RUN:-}" ] || until curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; do sleep 10; done
CUDA_VISIBLE_DEVICES=0,1,2,3 run accelerate launch --config_file configs/accelerate/fsdp_4gpu.yaml \
    -m agent_envs.cli train --algo "$ALGO" --config "$PRESET" \
    output_dir="$OUT" engine=vllm-server \
    "engine_kwargs={\"base_url\": \"http://127.0.0.1:$PORT/v1\", \"sync_dir\": \"$SYNC_DIR\"}" \
    gradient_checkpointing=true
