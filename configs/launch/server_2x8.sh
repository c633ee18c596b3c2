#!/usr/bin/env bash
# 2 nodes x 8 GPUs, server mode: node 1 runs a vLLM server over its 8 GPUs (tensor parallel 8),
# node 0 runs the learner on its 8 GPUs (FSDP). The weights go through SYNC_DIR, a folder on a
# file system both nodes read and write (NFS, Lustre; not /dev/shm).
#   node 1:  ROLE=server bash configs/launch/server_2x8.sh
#   node 0:  ROLE=learner ROLLOUT_ADDR=10.0.0.2 bash configs/launch/server_2x8.sh
# ROLLOUT_ADDR is node 1's address as node 0 reaches it. The learner waits for the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
source configs/launch/common.sh
: "${ROLE:?set ROLE=server on the rollout node, ROLE=learner on the training node}"
: "${SYNC_DIR:?set SYNC_DIR to a folder both nodes can read and write (a shared file system)}"
ALGO="${ALGO:-grpo}"
PRESET="${PRESET:-configs/grpo_qwen3_14b.yaml}"
MODEL="${MODEL:-Qwen/Qwen3-14B}"
OUT="${OUT:-runs/server_2x8}"
PORT="${PORT:-8000}"
MAX_LEN="${MAX_LEN:-8200}"

if [ "$ROLE" = server ]; then
    run agent-envs serve-rollout "$MODEL" --host 0.0.0.0 --port "$PORT" \
        --vllm-args "--tensor-parallel-size 8 --dtype bfloat16 --max-model-len $MAX_LEN --gpu-memory-utilization 0.9"
else
    : "${ROLLOUT_ADDR:?set ROLLOUT_ADDR to the address of the server node}"
    [ -n "${DRY_RUN:-}" ] || until curl -sf "http://$ROLLOUT_ADDR:$PORT/v1/models" >/dev/null; do sleep 10; done
    run accelerate launch --config_file configs/accelerate/fsdp.yaml \
        -m agent_envs.cli train --algo "$ALGO" --config "$PRESET" \
        output_dir="$OUT" engine=vllm-server \
        "engine_kwargs={\"base_url\": \"http://$ROLLOUT_ADDR:$PORT/v1\", \"sync_dir\": \"$SYNC_DIR\"}" \
        gradient_checkpointing=true
fi
