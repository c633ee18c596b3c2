# Sourced by the launch scripts in this folder. DRY_RUN=1 prints each command instead of running
# it (the CPU test reads the printed commands to check presets, keys and flags).
run() {
    if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; echo; else "$@"; fi
}
# Started in the background; a dry run prints it like the others.
run_bg() {
    if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; echo; else "$@" & fi
}
# Multi-node NCCL settings. Set NCCL_SOCKET_IFNAME to the interface the nodes reach each other
# on (`ip addr`); leave InfiniBand on where the nodes have it (NCCL_IB_DISABLE=0) and set
# NCCL_IB_HCA to the adapters (`ibv_devinfo`). NCCL_DEBUG=WARN prints why a ring fails to form.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"
# a rank stuck in a collective (a node died) raises instead of hanging for ever
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
