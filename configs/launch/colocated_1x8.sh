#!/usr/bin/env bash
# 1 node x 8 GPUs, colocated: 8 FSDP learner ranks, each with its own in-process vLLM engine on
# its GPU (engine: vllm, tensor parallel 1). After each optimizer step every rank joins the
# gather of the full weights and loads them into its engine (docs/scaling.md).
# For 7B-8B policies on 80 GB GPUs (python -m algorithms.core.capacity says what fits).
#   bash configs/launch/colocated_1x8.sh                       # GRPO, Qwen2.5-7B reasoning preset
#   PRESET=configs/dapo_qwen3_8b.yaml ALGO=dapo bash configs/launch/colocated_1x8.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source configs/launch/common.sh
ALGO="${ALGO:-grpo}"
PRESET="${PRESET:-configs/grpo_qwen2.5_7b.yaml}"
OUT="${OUT:-runs/colocated_1x8}"
# vLLM takes this share of each GPU for weights + KV cache; FSDP's shard, activations and the
# gathered layer must fit in the rest
GPU_MEM="${GPU_MEM:-0.5}"

run accelerate launch --config_file configs/accelerate/fsdp.yaml \
    -m agent_envs.cli train --algo "$ALGO" --config "$PRESET" \
    output_dir="$OUT" engine=vllm \
    engine_kwargs.gpu_memory_utilization="$GPU_MEM" engine_kwargs.dtype=bfloat16 \
    gradient_checkpointing=true
