"""Per-op bytes moved and FLOPs of one decode step, from the shapes alone.

Bytes count every operand once as read and every result once as written (the
minimum traffic of the op as written; caches may hide some of it). FLOPs count
a multiply-add as 2; elementwise work counts one FLOP per element-operation
(exp as one). L is the attended length (context + 1).
"""

from __future__ import annotations

from .models import ModelShape

WEIGHT_BYTES = {"f32": 4, "f16": 2}
CACHE_BYTES = {"f32": 4, "f16": 2, "i8": 1}

# op -> what it is, for the docs and `--json`
DESCRIPTIONS = {
    "embed": "token embedding row (tied LM head) to F32",
    "attn_norm": "RMSNorm before attention",
    "q_proj": "Q GEMV", "k_proj": "K GEMV", "v_proj": "V GEMV",
    "rope_q": "RoPE on the new token's Q (K is roped later, over the window)",
    "rope_qk": "RoPE on the new token's Q and K (K stored roped)",
    "kv_write": "write the new token's K and V into the cache",
    "kv_read_cast": "read the cached window with a cast to F32 (a copy for F32 caches)",
    "rope_window": "re-apply RoPE to every cached key",
    "gqa_broadcast": "materialise the repeat-interleave of K and V to all query heads",
    "pack_k": "pack K into matmul panels",
    "qk_matmul": "scores = Q K^T / sqrt(D)",
    "softmax": "row softmax over the scores",
    "pv_matmul": "out = P V",
    "sdpa": "SDPA kernel reading the cache directly (GQA in-kernel)",
    "o_proj": "output GEMV", "attn_residual": "residual add",
    "ffn_norm": "RMSNorm before the MLP",
    "gate_proj": "gate GEMV", "up_proj": "up GEMV", "silu_gate": "silu(gate) * up",
    "down_proj": "down GEMV", "ffn_residual": "residual add",
    "final_norm": "final RMSNorm", "lm_head": "LM-head GEMV", "argmax": "greedy next token",
}


def _cache_row_bytes(shape: ModelShape, cache: str) -> float:
    """Bytes of one token's K (or V) in the cache, int8 scale and zero point included."""
    b = shape.kv_dim * CACHE_BYTES[cache]
    if cache == "i8":
        b += shape.kv_heads * 5
    return b


def op_cost(name: str, shape: ModelShape, L: int, weights: str, cache: str) -> tuple[float, float]:
    """(bytes, flops) of one call of op `name` with attended length L."""
    E, H, D, F = shape.hidden, shape.heads, shape.head_dim, shape.ffn
    qd, kvd = shape.q_dim, shape.kv_dim
    wb = WEIGHT_BYTES[weights]
    f4 = 4.0

    def gemv(out: int, inp: int) -> tuple[float, float]:
        return out * inp * wb + (inp + out) * f4, 2.0 * out * inp

    P = -(-L // 8) * 8  # packed length
    table = L * D * f4  # cos + sin rows for L positions (D/2 each)
    match name:
        case "embed":
            return E * wb + E * f4, 0.0
        case "attn_norm" | "ffn_norm" | "final_norm":
            return 3 * E * f4, 4.0 * E
        case "q_proj":
            return gemv(qd, E)
        case "k_proj" | "v_proj":
            return gemv(kvd, E)
        case "o_proj":
            return gemv(E, qd)
        case "gate_proj" | "up_proj":
            return gemv(F, E)
        case "down_proj":
            return gemv(E, F)
        case "lm_head":
            return gemv(shape.vocab, E)
        case "rope_q":
            return 2 * qd * f4 + D * f4, 3.0 * qd
        case "rope_qk":
            return 2 * (qd + kvd) * f4 + D * f4, 3.0 * (qd + kvd)
        case "kv_write":
            return 2 * kvd * f4 + 2 * _cache_row_bytes(shape, cache), 2.0 * kvd
        case "kv_read_cast":
            return 2 * L * (_cache_row_bytes(shape, cache) + kvd * f4), 2.0 * L * kvd
        case "rope_window":
            return 2 * L * kvd * f4 + table, 3.0 * L * kvd
        case "gqa_broadcast":
            return 2 * L * kvd * f4 + 2 * H * L * D * f4, 0.0
        case "pack_k":
            return H * L * D * f4 + H * P * D * f4, 0.0
        case "qk_matmul":
            return H * P * D * f4 + qd * f4 + H * L * f4, 2.0 * H * L * D
        case "softmax":
            return 2 * H * L * f4, 5.0 * H * L
        case "pv_matmul":
            return H * L * f4 + H * L * D * f4 + qd * f4, 2.0 * H * L * D
        case "sdpa":
            return (2 * L * _cache_row_bytes(shape, cache) + 2 * qd * f4,
                    4.0 * H * L * D + 5.0 * H * L)
        case "attn_residual" | "ffn_residual":
            return 3 * E * f4, float(E)
        case "silu_gate":
            return 3 * F * f4, 5.0 * F
        case "argmax":
            return shape.vocab * f4, float(shape.vocab)
    return 0.0, 0.0
