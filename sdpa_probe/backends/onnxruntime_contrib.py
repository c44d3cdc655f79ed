"""ONNX Runtime's contrib attention ops (domain com.microsoft) as backends, driven as
onnxruntime_attention.py drives the standard op (one-node graph, cached sessions,
IOBinding, the same unsupported layouts and dtypes).

onnxruntime-gqa, `GroupQueryAttention`: the op LLM exports run, in their decode
form. The KV cache is `past_key` / `past_value` in ORT's [B, Hkv, S, D] form (the
case's whole cache, a transposed copy), bound as `present_key` / `present_value` too
(a shared buffer, as exports run it); K and V are the Lq new tokens' keys, which the
op writes into the cache at [P, P + Lq); `seqlens_k` = P + Lq - 1 and
`total_sequence_length` = P + Lq tell it how much of the cache to read. The op takes
exactly Lq new keys, so P = start_pos for a causal case (query i then sees keys j <=
start_pos + i, the oracle's edge; the stale slots past P + Lq stay in the buffer,
unread) and P = kv_len - Lq for a non-causal one, which is `causal` = 0 (a one-query
call stays causal = 1, the decode step exports make: for the last position, the same
function). A batch of several queries each passes `query_seqlens` (all Lq): without
it ORT refuses batch > 1 with a past, and with it only causal = 1. It cannot express
kv_len < q_len, nor a causal edge past the cache's end; it refuses head_dim not a
multiple of 8. The mask is `attention_bias` [1, 1, Lq, P + Lq].

onnxruntime-mha, `MultiHeadAttention`: one kv head per query head, so K and V of a
GQA case are repeated per group (a copy, as an exported graph's Expand makes).
Causal: `unidirectional` = 1 is bottom-right only with a `past_key` and exactly Lq
new keys (measured: with q 4 < kv 16 and no past it matches neither alignment, nor
with a past and 6 new keys), so a causal case passes the keys before start_pos as the
past and the next Lq as K and V (the stale slots past them are left out); when the
cache ends before start_pos + Lq, the causal edge goes into `attention_bias` as -inf
instead, the only faithful way there.

Both give NaN for a row whose every score is -inf (all of its attention_bias row;
GroupQueryAttention in F32 only with causal = 0), where the oracle gives zeros."""

from __future__ import annotations

import numpy as np

from .onnxruntime_attention import (
    BF16_REFUSAL,
    Call,
    Geometry,
    OnnxRuntimeBackend,
    heads_first,
    rows,
)

CONTRIB = "com.microsoft"


def causal_bias(g: Geometry, mask: np.ndarray | None, dtype) -> np.ndarray:
    """The mask plus -inf above the causal edge (query i sees keys j <= start_pos + i),
    dense [Lq, Lkv]."""
    i, j = np.arange(g.q_len)[:, None], np.arange(g.kv_len)[None, :]
    edge = np.where(j > g.start_pos + i, -np.inf, 0.0).astype(dtype)
    return edge if mask is None else (mask + edge).astype(dtype)


def bias_input(mask: np.ndarray | None, total: int) -> np.ndarray | None:
    """A dense [Lq, Lkv] mask as attention_bias [1, 1, Lq, total]."""
    if mask is None:
        return None
    return np.ascontiguousarray(mask[:, :total]).reshape(1, 1, mask.shape[0], total)


class OnnxRuntimeGqaBackend(OnnxRuntimeBackend):
    """com.microsoft GroupQueryAttention."""

    name = "onnxruntime-gqa"
    OP = "com.microsoft GroupQueryAttention"
    INT8_REASON = ("GroupQueryAttention's int8 KV cache takes per-tensor or per-channel "
                   "scales: no per-token scales or zero points")
    BF16_REASON = BF16_REFUSAL.format(
        op="GroupQueryAttention", said="Could not find an implementation for "
        "GroupQueryAttention(1)")

    def limits(self, g: Geometry) -> str | None:
        if g.kv_len < g.q_len:
            return "GroupQueryAttention takes as many new keys as queries: kv_len < q_len"
        if g.causal and g.start_pos + g.q_len > g.kv_len:
            return ("GroupQueryAttention takes as many new keys as queries: the causal edge "
                    "lies past the cache's end")
        if g.head_dim % 8:
            return "GroupQueryAttention refuses it (ORT: head_size must be a multiple of 8)"
        if g.batch > 1 and g.q_len > 1 and not g.causal:
            return ("GroupQueryAttention refuses it (ORT: batch_size must be 1 when "
                    "sequence_length > 1 and past context is given; query_seqlens, which "
                    "lifts that, requires causal=1)")
        return None

    def plan(self, g: Geometry, q, k, v, mask) -> Call:
        causal = g.causal or g.q_len == 1
        past = g.start_pos if g.causal else g.kv_len - g.q_len
        total = past + g.q_len
        attrs = {"num_heads": g.n_heads, "kv_num_heads": g.n_kv_heads, **g.scale_attr}
        if not causal:
            attrs["causal"] = 0
        inputs = [("query", rows(q)), ("key", rows(k[:, past:total])),
                  ("value", rows(v[:, past:total])),
                  ("past_key", heads_first(k)), ("past_value", heads_first(v)),
                  ("seqlens_k", np.full(g.batch, total - 1, np.int32)),
                  ("total_sequence_length", np.array(total, np.int32)),
                  ("cos_cache", None), ("sin_cache", None), ("position_ids", None),
                  ("attention_bias", bias_input(mask, total))]
        if g.batch > 1 and g.q_len > 1:  # (the op's own way to run a batch of chunks)
            inputs += [("head_sink", None), ("k_scale", None), ("v_scale", None),
                       ("q_norm_weight", None), ("k_norm_weight", None),
                       ("query_seqlens", np.full(g.batch, g.q_len, np.int32))]
        return Call("GroupQueryAttention", CONTRIB, attrs, inputs,
                    ["output", "present_key", "present_value"],
                    {"present_key": "past_key", "present_value": "past_value"})


    def timed_plan(self, g: Geometry, q, k, v) -> Call:
        """The call bench times: the decode step as exports make it (above)."""
        return self.plan(g, q, k, v, None)


class OnnxRuntimeMhaBackend(OnnxRuntimeBackend):
    """com.microsoft MultiHeadAttention."""

    name = "onnxruntime-mha"
    OP = "com.microsoft MultiHeadAttention"
    # (it has no kv head count: 3 kv heads of 8 cannot be said)
    INVALID = ("zero-heads", "zero-head-dim", "nan-scale", "inf-scale")
    INT8_REASON = "MultiHeadAttention takes float tensors only: no int8"
    BF16_REASON = BF16_REFUSAL.format(
        op="MultiHeadAttention", said="Could not find an implementation for "
        "MultiHeadAttention(1)")

    def limits(self, g: Geometry) -> str | None:
        return None

    def plan(self, g: Geometry, q, k, v, mask, bnsh: bool = False) -> Call:
        """With `bnsh`, a non-causal call's K and V as [B, H, S, D] copies (the op's
        cache form, which it reads without a transpose)."""
        group = g.n_heads // g.n_kv_heads if g.n_kv_heads else 1
        if group != 1:
            k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
        attrs = {"num_heads": g.n_heads, **g.scale_attr}
        past, new = 0, g.kv_len
        if g.causal and g.start_pos + g.q_len <= g.kv_len:
            attrs["unidirectional"] = 1
            past, new = g.start_pos, g.q_len
        elif g.causal:
            mask = causal_bias(g, mask, q.dtype)
        form = heads_first if bnsh and not g.causal else rows
        inputs = [("query", rows(q)), ("key", form(k[:, past:past + new])),
                  ("value", form(v[:, past:past + new])), ("bias", None),
                  ("key_padding_mask", None), ("attention_bias", bias_input(mask, past + new))]
        outputs = ["output"]
        if past:
            inputs += [("past_key", heads_first(k[:, :past])),
                       ("past_value", heads_first(v[:, :past]))]
            outputs += ["present_key", "present_value"]
        return Call("MultiHeadAttention", CONTRIB, attrs, inputs, outputs)

    def timed_plan(self, g: Geometry, q, k, v) -> Call:
        """The call bench times: K and V repeated per group before the timed region
        (the op reads H kv heads: H / Hkv times a GQA cache's bytes), in the op's
        cache form where it takes one (the 3D form costs a transpose every call)."""
        return self.plan(g, q, k, v, None, bnsh=True)
