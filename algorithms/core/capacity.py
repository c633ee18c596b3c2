"""A memory and time model of one RL step, per model size and GPU layout (docs/scaling.md).

Back-of-the-envelope numbers, stated so that a run on real GPUs can check them
(tests/gpu/README.md): what each GPU holds for training and for a colocated vLLM engine, and how
long the rollout and the update of one step take.

    python -m algorithms.core.capacity                 # the table of docs/scaling.md
    python -m algorithms.core.capacity --gpus 16 --gpu h200 --seq-len 12000

The hand-computed case: 7e9 parameters take 14 GB as bf16 weights, Adam's two fp32 moments
take 56 GB, and FSDP or ZeRO-3 over 8 GPUs leaves 7 GB of them on each.

    >>> weights_gb(7e9, "bf16"), adam_gb(7e9), adam_gb(7e9) / 8
    (14.0, 56.0, 7.0)
    >>> round(QWEN25["7B"].params() / 1e9, 2)      # Qwen2.5-7B's model card: 7.61B
    7.61
    >>> QWEN25["7B"].kv_bytes_per_token()          # 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 B
    57344
"""

from __future__ import annotations

import argparse
import dataclasses
import math

GB = 1e9  # decimal gigabytes, as GPU memory is quoted (80 GB H100, 141 GB H200)
BYTES = {"fp32": 4, "bf16": 2}

# Bytes per parameter of the trained model's state, per precision of the parameters:
# - fp32: what the learner does (it loads float32 and trains under bf16 autocast, the
#   `mixed_precision: bf16` of the presets): fp32 weights 4 + fp32 grads 4 + Adam m, v 8;
# - bf16: bf16 weights 2 + bf16 grads 2 + Adam m, v in fp32 8 (no fp32 master copy).
TRAIN_STATE_BYTES = {"fp32": 16, "bf16": 12}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes (Qwen2.5 configs: GQA, SwiGLU MLP, q/k/v biases)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151936
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (+bias), k and v (+biases), o
        return attn + 3 * h * self.intermediate + 2 * h  # gate, up, down; two RMSNorms

    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return embed + self.layers * self.layer_params() + self.hidden

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES[dtype]


QWEN25 = {
    "0.5B": ModelShape(896, 24, 14, 2, 4864, tied=True),
    "1.5B": ModelShape(1536, 28, 12, 2, 8960, tied=True),
    "3B": ModelShape(2048, 36, 16, 2, 11008, tied=True),
    "7B": ModelShape(3584, 28, 28, 4, 18944),
    "14B": ModelShape(5120, 48, 40, 8, 13824),
    "32B": ModelShape(5120, 64, 40, 8, 27648),
}


@dataclasses.dataclass(frozen=True)
class GPU:
    memory_gb: float
    bf16_tflops: float  # dense peak
    bandwidth_tbs: float  # HBM


GPUS = {"h100": GPU(80, 989, 3.35), "h200": GPU(141, 989, 4.8)}


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What the time model takes as given; measure them with tests/gpu/ and pass your own."""

    mfu: float = 0.35  # training: 30-40 % of peak is typical of FSDP/ZeRO-3 with checkpointing
    decode_efficiency: float = 0.5  # share of HBM bandwidth a decode step achieves
    concurrency: int = 256  # sequences decoding at once per vLLM engine
    mean_fill: float = 0.5  # mean trajectory length as a share of seq_len
    overhead_gb: float = 4.0  # CUDA context, NCCL buffers, allocator fragmentation


def weights_gb(params: float, dtype: str = "bf16") -> float:
    return params * BYTES[dtype] / GB


def adam_gb(params: float) -> float:
    """Adam's first and second moments, fp32."""
    return params * 8 / GB


def train_state_gb(params: float, precision: str = "fp32", shards: int = 1) -> float:
    """Weights + grads + Adam moments per GPU; FSDP and ZeRO-3 split all three over `shards`."""
    return params * TRAIN_STATE_BYTES[precision] / GB / shards


def activation_gb(m: ModelShape, tokens: int) -> float:
    """Peak activations of one micro-batch of `tokens` tokens under gradient checkpointing.

    Checkpointing keeps each layer's bf16 input (layers x hidden x 2 B per token) and recomputes
    one layer at a time, whose backward holds about (10 hidden + 4 intermediate) bf16 values per
    token (q, k, v, attention output, norms, gate/up/activation; flash attention, no
    sequence-squared term). The logits are the largest single piece: vocab x (2 B bf16 logits +
    4 B fp32 log-softmax kept for backward) per token.
    """
    per_token = m.layers * m.hidden * 2 + (10 * m.hidden + 4 * m.intermediate) * 2 + m.vocab * 6
    return tokens * per_token / GB


def vllm_gb(m: ModelShape, tp: int, sequences: int, seq_len: int, fill: float) -> tuple[float, float]:
    """(weights, KV cache) per GPU of a vLLM engine over `tp` GPUs holding `sequences` at once."""
    kv = sequences * seq_len * fill * m.kv_bytes_per_token() / GB / tp
    return weights_gb(m.params()) / tp, kv


def train_flops(m: ModelShape, tokens: float, seq_len: int, epochs: int = 1) -> float:
    """FLOPs of the update: per token 2N forward (+ causal attention 2 L h seq), x4 for
    forward + backward + the checkpointing recompute, once per PPO epoch, plus one forward for
    the old log-probs."""
    fwd = 2 * m.params() + 2 * m.layers * m.hidden * seq_len
    return tokens * fwd * (4 * epochs + 1)


def decode_tokens_per_s(m: ModelShape, gpu: GPU, tp: int, a: Assumptions, seq_len: int) -> float:
    """Per engine: each decode step reads the weights once and every live sequence's KV cache."""
    step_bytes = weights_gb(m.params()) * GB / tp + a.concurrency * seq_len * a.mean_fill / 2 * (
        m.kv_bytes_per_token() / tp
    )
    step_s = step_bytes / (gpu.bandwidth_tbs * 1e12 * a.decode_efficiency)
    return a.concurrency / step_s


@dataclasses.dataclass
class Row:
    size: str
    params_b: float
    weights_gb: float
    state_gb: float
    state_per_gpu_gb: float
    act_gb: float
    learner_peak_gb: float
    vllm_weights_gb: float
    kv_room_gb: float
    sequences: int  # sequences one colocated engine decodes at once in that room
    rollout_s: float
    train_s: float


def plan(size: str, *, gpus: int = 8, gpu: str = "h100", seq_len: int = 8192, micro_batch: int = 1,
         prompts: int = 128, group: int = 8, epochs: int = 1, precision: str = "fp32",
         tp: int = 1, server_gpus: int = 0, a: Assumptions = Assumptions()) -> Row:  # noqa: B008
    """One row of the table: `gpus` learner ranks sharding with FSDP/ZeRO-3, each with a colocated
    vLLM engine over `tp` of them (tp=1: one engine per rank, as `engine: vllm` runs today), or,
    with `server_gpus`, vLLM servers of `tp` GPUs each on that many GPUs of their own (taking
    90 % of each, as configs/launch/server_*.sh start them).

    What the learner and the engine's weights leave of the GPU is the KV cache; it bounds how
    many sequences decode at once (vLLM queues the rest), which sets the rollout time."""
    m, g = QWEN25[size], GPUS[gpu]
    n = m.params()
    state = train_state_gb(n, precision, shards=gpus)
    gathered = 2 * m.layer_params() * 2 / GB  # FSDP/ZeRO-3 all-gather one layer ahead (bf16)
    act = activation_gb(m, micro_batch * seq_len)
    learner = state + gathered + act + a.overhead_gb
    engines = (server_gpus or gpus) // tp
    seqs = prompts * group
    vw, _ = vllm_gb(m, tp, 0, seq_len, a.mean_fill)
    room = max(0.0, (0.9 * g.memory_gb if server_gpus else g.memory_gb - learner) - vw)
    per_seq_gb = seq_len * a.mean_fill * m.kv_bytes_per_token() / GB / tp
    fit = int(room / per_seq_gb)
    live = min(a.concurrency, math.ceil(seqs / engines), fit)
    tokens = seqs * seq_len * a.mean_fill
    train_s = train_flops(m, tokens, int(seq_len * a.mean_fill), epochs) / (gpus * g.bf16_tflops * 1e12 * a.mfu)
    generated = tokens * 0.75  # the rest is prompt and tool output, prefilled, not decoded
    speed = decode_tokens_per_s(m, g, tp, dataclasses.replace(a, concurrency=max(live, 1)), seq_len)
    rollout_s = generated / (engines * speed) if live else math.inf
    return Row(size, n / 1e9, weights_gb(n), train_state_gb(n, precision), state, act, learner,
               vw, room, fit, rollout_s, train_s)


def table(**kw) -> str:
    head = (f"{'model':>5} {'params':>7} {'bf16 w':>7} {'state':>6} {'state/GPU':>9} {'act/GPU':>8} "
            f"{'learner':>8} {'vLLM w':>7} {'KV room':>8} {'seqs':>5} {'fits':>5} {'rollout':>8} {'update':>7}")
    lines = [head, "-" * len(head)]
    memory = GPUS[kw.get("gpu", "h100")].memory_gb
    for size in QWEN25:
        r = plan(size, **kw)
        # "tight": fewer than 16 sequences decode at once, so the rollout crawls
        fits = "no" if r.learner_peak_gb > memory or r.sequences == 0 else "tight" if r.sequences < 16 else "yes"
        rollout = f"{r.rollout_s:7.0f}s" if math.isfinite(r.rollout_s) else f"{'-':>8}"
        lines.append(
            f"{size:>5} {r.params_b:6.2f}B {r.weights_gb:6.1f}G {r.state_gb:5.0f}G {r.state_per_gpu_gb:8.1f}G "
            f"{r.act_gb:7.1f}G {r.learner_peak_gb:7.1f}G {r.vllm_weights_gb:6.1f}G {r.kv_room_gb:7.1f}G "
            f"{r.sequences:5d} {fits:>5} {rollout} {r.train_s:6.0f}s"
        )
    return "\n".join(lines)


def state_table() -> str:
    """Weights, grads and Adam moments per model size and precision, whole and sharded over 8 and 16."""
    head = f"{'model':>5} {'precision':>9} {'weights':>8} {'grads':>7} {'Adam m,v':>9} {'total':>7} {'/8 GPUs':>8} {'/16 GPUs':>9}"
    lines = [head, "-" * len(head)]
    for size, m in QWEN25.items():
        n = m.params()
        for precision in TRAIN_STATE_BYTES:
            w = weights_gb(n, precision)
            total = train_state_gb(n, precision)
            lines.append(f"{size:>5} {precision:>9} {w:7.1f}G {w:6.1f}G {adam_gb(n):8.1f}G {total:6.1f}G "
                         f"{total / 8:7.1f}G {total / 16:8.1f}G")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m algorithms.core.capacity", description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="learner ranks (FSDP/ZeRO-3 shards)")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument("--seq-len", type=int, default=8192, help="max_model_len: prompt + response")
    p.add_argument("--micro-batch", type=int, default=1, help="micro_batch_size (sequences)")
    p.add_argument("--prompts", type=int, default=128, help="prompts_per_step")
    p.add_argument("--group", type=int, default=8, help="group_size")
    p.add_argument("--epochs", type=int, default=1, help="ppo_epochs")
    p.add_argument("--precision", choices=sorted(TRAIN_STATE_BYTES), default="fp32")
    p.add_argument("--tp", type=int, default=1, help="vLLM tensor-parallel size per engine")
    p.add_argument("--server-gpus", type=int, default=0,
                   help="GPUs of vLLM servers of their own (server mode); 0: colocated engines")
    p.add_argument("--mfu", type=float, default=Assumptions.mfu)
    p.add_argument("--decode-efficiency", type=float, default=Assumptions.decode_efficiency)
    p.add_argument("--state", action="store_true", help="print the training-state table by precision and stop")
    args = p.parse_args(argv)
    if args.state:
        print(state_table())
        return 0
    a = Assumptions(mfu=args.mfu, decode_efficiency=args.decode_efficiency)
    print(f"{args.gpus} x {args.gpu}, seq_len {args.seq_len}, micro-batch {args.micro_batch}, "
          f"{args.prompts} prompts x {args.group}, {args.epochs} epoch(s), {args.precision} master weights, "
          f"vLLM TP {args.tp} {f'on {args.server_gpus} server GPUs' if args.server_gpus else 'colocated'}; "
          f"MFU {a.mfu}, decode at {a.decode_efficiency} of HBM bandwidth")
    print(table(gpus=args.gpus, gpu=args.gpu, seq_len=args.seq_len, micro_batch=args.micro_batch,
                prompts=args.prompts, group=args.group, epochs=args.epochs, precision=args.precision,
                tp=args.tp, server_gpus=args.server_gpus, a=a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
