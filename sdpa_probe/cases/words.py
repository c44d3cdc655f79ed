"""A case's parameters in words, as a failure report states them: the reader should not
have to decode the case id to know the call was causal at start_pos 96."""

from __future__ import annotations

from .case import Case

_LAYOUTS = {
    "bshd": "[batch, seq, head, dim] contiguous",
    "bhsd": "[batch, head, seq, dim] (seq at dim 2)",
    "padded": "views into padded buffers (NaN slack past each head and dim)",
    "dmajor": "[batch, head, dim, seq] (head_dim not innermost)",
    "vdmajor": "K [batch, seq, head, dim], V [batch, head, dim, seq] (a transposed V cache)",
    "qfused": "Q a view of a fused QKV output",
    "offset": "every buffer one element past 64-byte alignment",
    "far": "batches 2^31 + 4096 elements apart (offsets past 32 bits)",
    "fenced": "each buffer's last byte just before an inaccessible page",
    "fenced-start": "each buffer's first byte just after an inaccessible page",
    "reversed": "negative position and dim strides",
}


def _heads(case: Case) -> str:
    if case.n_kv_heads == case.n_heads:
        return f"{case.n_heads} heads"
    kind = "MQA" if case.n_kv_heads == 1 else f"GQA, group {case.group}"
    return f"{case.n_heads} query heads over {case.n_kv_heads} kv heads ({kind})"


def _dtypes(case: Case) -> str:
    kv = case.dtype + (f" ({case.quant}metric per token)" if case.dtype == "i8" else "")
    if case.q_dtype:
        return f"Q and output {case.q_dtype}, K and V {kv}"
    return f"Q, K, V {kv}, output {case.out_dtype if case.dtype != 'i8' else 'f32'}"


def _causal(case: Case) -> str:
    if case.causal:
        return (f"causal, bottom-right with start_pos {case.start_pos} (query row i sees keys "
                f"j <= {case.start_pos} + i)")
    return "not causal" + (f" (start_pos {case.start_pos} given)" if case.start_pos else "")


def _mask(case: Case) -> str:
    m = case.mask
    if m == "none":
        return "no mask"
    if m == "nan-inputs":
        return "no mask; NaN in one element each of Q, K and V"
    if m in ("constant-token", "zero-tokens"):
        return f"no mask; inputs: {m.replace('-', ' ')}"
    return f"additive mask ({m}, rows padded past kv_len)"


def case_in_words(case: Case) -> str:
    """One line: shape, dtypes, causal and start_pos, mask, layout, threads (and what
    else sets the case apart: scale, magnitudes, callers, reuse)."""
    rows = f"{case.q_len} query row" + ("s" if case.q_len != 1 else "")
    parts = [f"batch {case.batch}, {_heads(case)}, {rows} over {case.kv_len} keys, "
             f"head_dim {case.head_dim}", _dtypes(case), _causal(case),
             _mask(case), f"layout {case.layout}: {_LAYOUTS[case.layout]}",
             f"{case.n_threads} thread" + ("s" if case.n_threads != 1 else "")]
    if case.scale > 0:
        parts.append(f"scale {case.scale:g} (not 1/sqrt(head_dim))")
    if case.magnitude != 1.0 or case.v_magnitude != 1.0:
        parts.append(f"Q, K x{case.magnitude:g}, V x{case.v_magnitude:g}")
    if case.callers > 1:
        parts.append(f"{case.callers} callers at once")
    if case.reuse:
        parts.append("called again on its buffers rewritten in place")
    if case.stack_kib:
        parts.append(f"on a {case.stack_kib} KiB stack")
    return "; ".join(parts)
