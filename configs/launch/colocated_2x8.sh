#!/usr/bin/env bash
# 2 nodes x 8 GPUs, colocated: 16 FSDP learner ranks (the model sharded over both nodes), each
# with its own in-process vLLM engine. Run the same script on both nodes:
#   node 0:  MASTER_ADDR=10.0.0.1 MACHINE_RANK=0 bash configs/launch/colocated_2x8.sh
#   node 1:  MASTER_ADDR=10.0.0.1 MACHINE_RANK=1 bash configs/launch/colocated_2x8.sh
# MASTER_ADDR is node 0's address as node 1 reaches it. The output folder must be on a file
# system both nodes see if you resume (checkpoints are written by node 0's main process).
# ZeRO-3 instead of FSDP: ACCEL=configs/accelerate/deepspeed_zero3_2x8.yaml.
set -euo pipefail
cd "$(dirname "$0")/../.."
source configs/launch/common.sh
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0 (the same on both nodes)}"
: "${MACHINE_RANK:?set MACHINE_RANK: 0 on the first node, 1 on the second}"
MASTER_PORT="${MASTER_PORT:-29500}"
ACCEL="${ACCEL:-configs/accelerate/fsdp_2x8.yaml}"
ALGO="${ALGO:-grpo}"
PRESET="${PRESET:-configs/grpo_qwen3_14b.yaml}"
OUT="${OUT:-runs/colocated_2x8}"
GPU_MEM="${GPU_MEM:-0.5}"

run accelerate launch --config_file "$ACCEL" \
    --machine_rank "$MACHINE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" \
    -m agent_envs.cli train --algo "$ALGO" --config "$PRESET" \
    output_dir="$OUT" engine=vllm \
    engine_kwargs.gpu_memory_utilization="$GPU_MEM" engine_kwargs.dtype=bfloat16 \
    gradient_checkpointing=true
