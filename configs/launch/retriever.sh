#!/usr/bin/env bash
# One retrieval server for every learner rank and node (search envs): one BM25 index in memory
# instead of one per rank, and requests from all ranks batched together. Start it on any node
# (CPU only), then point the env at it with env_kwargs.retriever_url:
#   ROLE=server CORPUS=/data/wiki.jsonl bash configs/launch/retriever.sh          # on the retrieval node
#   ROLE=learner RETRIEVER_ADDR=10.0.0.3 bash configs/launch/retriever.sh         # a 1 x 8 colocated learner
# For 2 nodes, add the same override to colocated_2x8.sh or server_2x8.sh's train command.
set -euo pipefail
cd "$(dirname "$0")/../.."
source configs/launch/common.sh
: "${ROLE:?set ROLE=server on the retrieval node, ROLE=learner on the training node}"
PORT="${PORT:-8100}"
ALGO="${ALGO:-grpo}"
PRESET="${PRESET:-configs/grpo_qwen2.5_7b.yaml}"   # its env (AgentQA-ARPO-RL-v0) searches
OUT="${OUT:-runs/retriever_1x8}"

if [ "$ROLE" = server ]; then
    : "${CORPUS:?set CORPUS to the corpus JSONL (id, title, text or contents)}"
    run agent-envs serve-retriever --corpus "$CORPUS" --host 0.0.0.0 --port "$PORT"
else
    : "${RETRIEVER_ADDR:?set RETRIEVER_ADDR to the address of the retrieval node}"
    run accelerate launch --config_file configs/accelerate/fsdp.yaml \
        -m agent_envs.cli train --algo "$ALGO" --config "$PRESET" \
        output_dir="$OUT" engine=vllm engine_kwargs.gpu_memory_utilization=0.5 \
        env_kwargs.retriever_url="http://$RETRIEVER_ADDR:$PORT/retrieve"
fi
