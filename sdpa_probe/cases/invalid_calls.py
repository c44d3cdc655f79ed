"""The calls a kernel must refuse (the ABI's SDPA_INVALID), by name: what each breaks in
an otherwise valid call, in a reason's words. A case names one in Case.invalid; how a
prepared call is broken, and how the answer is judged, is invalid_args.py's."""

from __future__ import annotations

INVALID_CALLS: dict[str, str] = {
    "abi-version": "abi_version 99, not SDPA_ABI_VERSION",
    "heads-not-multiple": "n_kv_heads 3, which does not divide n_heads 8",
    "zero-kv-heads": "n_kv_heads 0",
    "zero-heads": "n_heads 0",
    "zero-head-dim": "head_dim 0",
    "negative-q-len": "q_len -1",
    "negative-batch": "batch -2",
    "negative-kv-len": "kv_len -1",
    "negative-start-pos": "start_pos -1",
    "nan-scale": "scale NaN",
    "inf-scale": "scale +inf",
    "null-q": "q.data NULL",
    "null-k": "k.data NULL with kv_len > 0",
    "null-v": "v.data NULL with kv_len > 0",
    "null-out": "out.data NULL",
    # every head_dim element at one address: a view no kernel can read as D values
    "zero-dim-stride": "q.stride[3] 0 with head_dim 64",
    "bad-dtype": "k.dtype 7, no sdpa_dtype",
    "int8-out": "out.dtype SDPA_I8 (an int8 output)",
    "int8-without-scale": "k.dtype SDPA_I8 with k.scale NULL",
    "int8-v-without-scale": "v.dtype SDPA_I8 with v.scale NULL",
    "short-mask-rows": "mask_row_stride 1 with 2 query rows of 70 keys (rows overlap)",
}
