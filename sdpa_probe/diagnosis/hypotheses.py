"""The nearby semantics a wrong output is compared with: each a named counterfactual
oracle on the case's own stored inputs (a Setting changed in one place), with the case
predicate it needs and the sentence that says what a match means."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..cases import Case
from ..inputs import OUT_NP, POISON
from .counterfactual import Setting, attend, rounded

# key block sizes a kernel is likely tiled by (ours: 16 to 128; others' up to 256)
BLOCKS = (16, 32, 64, 128, 256)
TENSORS = {"q": "Q", "k": "K", "v": "V", "kv": "K and V"}


@dataclasses.dataclass(frozen=True)
class Context:
    case: Case
    truth: Setting
    mask_view: np.ndarray | None   # the stored mask (a view into its padded rows)


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    name: str
    applies: Callable[[Case], bool]
    predict: Callable[[Context], np.ndarray]
    computed_with: Callable[[Case], str]   # "your output equals the reference computed
    meaning: Callable[[Case], str]         # with {computed_with}: {meaning}"


def _setting(**changes) -> Callable[[Context], np.ndarray]:
    return lambda ctx: attend(ctx.truth.but(**changes))


def _has_mask(c: Case) -> bool:
    return c.mask not in ("none", "constant-token", "zero-tokens", "nan-inputs")


def _mask_with_row_stride_kv(ctx: Context) -> np.ndarray:
    m = ctx.mask_view
    flat = np.lib.stride_tricks.as_strided(m, shape=m.shape, strides=(m.shape[1] * 4, 4))
    return attend(ctx.truth.but(mask=flat.astype(np.float64)))


def _rounded_inputs(which: str, dtype: str) -> Callable[[Context], np.ndarray]:
    def predict(ctx: Context) -> np.ndarray:
        t = ctx.truth
        names = ("k", "v") if which == "kv" else (which,)
        return attend(t.but(**{n: rounded(getattr(t, n), dtype) for n in names}))
    return predict


def _stored_as(c: Case, which: str) -> str:
    return c.out_dtype if which == "q" else c.dtype


def _nan_as_zero(ctx: Context) -> np.ndarray:
    t = ctx.truth
    z = {n: np.where(np.isnan(getattr(t, n)), 0.0, getattr(t, n)) for n in ("q", "k", "v")}
    if ctx.case.causal:  # (stale slots past the causal edge stay as they are: never read)
        for n in ("k", "v"):
            z[n][:, ctx.case.start_pos + ctx.case.q_len:] = getattr(t, n)[
                :, ctx.case.start_pos + ctx.case.q_len:]
    return attend(t.but(**z))


def poison_value(out_dtype: str) -> float:
    """The value an output element left unwritten reads as (inputs.POISON)."""
    dt = np.dtype(OUT_NP[out_dtype])
    bits_t, bits = POISON[dt]
    if dt == np.uint16:  # bf16
        return float(np.array([bits << 16], np.uint32).view(np.float32)[0])
    return float(np.array([bits], bits_t).view(dt)[0])


def _first_batch_only(ctx: Context) -> np.ndarray:
    out = attend(ctx.truth)
    out[1:] = poison_value(ctx.case.out_dtype)
    return out


def _batch0_kv(ctx: Context) -> np.ndarray:
    t = ctx.truth
    return attend(t.but(k=np.broadcast_to(t.k[:1], t.k.shape),
                        v=np.broadcast_to(t.v[:1], t.v.shape)))


def _scale(c: Case) -> float:
    return c.scale if c.scale > 0 else c.head_dim ** -0.5


def _causal_hypotheses() -> list[Hypothesis]:
    def key_cut(c: Case) -> int:  # (the causal edge of the last row, +1)
        return c.start_pos + c.q_len
    return [
        Hypothesis("start-pos-zero", lambda c: c.causal and c.start_pos > 0,
                   lambda ctx: attend(ctx.truth.but(offset=0)),
                   lambda c: "start_pos = 0 (query row i sees keys j <= i: top-left causal)",
                   lambda c: f"the causal offset is ignored (start_pos is {c.start_pos})"),
        Hypothesis("end-aligned",
                   lambda c: c.causal and c.kv_len >= c.q_len and c.start_pos != c.kv_len - c.q_len,
                   lambda ctx: attend(ctx.truth.but(offset=ctx.case.kv_len - ctx.case.q_len)),
                   lambda c: f"start_pos = kv_len - q_len = {c.kv_len - c.q_len} (the query "
                             "rows taken as the cache's last positions)",
                   lambda c: f"start_pos ({c.start_pos}) is not read: the causal edge is "
                             "aligned to the end of the cache"),
        Hypothesis("causal-one-late", lambda c: c.causal,
                   lambda ctx: attend(ctx.truth.but(offset=ctx.case.start_pos + 1)),
                   lambda c: "the causal edge one key later (row i sees keys j <= start_pos "
                             "+ i + 1)",
                   lambda c: "the causal bound is off by one: each row reads one key past "
                             "its own position"),
        Hypothesis("causal-one-early", lambda c: c.causal,
                   lambda ctx: attend(ctx.truth.but(offset=ctx.case.start_pos - 1)),
                   lambda c: "the causal edge one key earlier (row i sees keys j < start_pos "
                             "+ i)",
                   lambda c: "the causal bound is off by one: each row stops one key short "
                             "of its own position"),
        Hypothesis("causal-ignored", lambda c: c.causal and key_cut(c) - 1 < c.kv_len,
                   lambda ctx: attend(ctx.truth.but(causal=False)),
                   lambda c: "is_causal = 0 (every row sees every key)",
                   lambda c: "the causal flag is ignored"),
        Hypothesis("start-pos-implies-causal", lambda c: not c.causal and c.start_pos > 0,
                   lambda ctx: attend(ctx.truth.but(causal=True)),
                   lambda c: f"is_causal = 1 at start_pos {c.start_pos}",
                   lambda c: "a given start_pos is taken for a causal edge although "
                             "is_causal is 0"),
    ]


def _mask_and_scale_hypotheses() -> list[Hypothesis]:
    return [
        Hypothesis("mask-ignored", _has_mask, _setting(mask=None),
                   lambda c: "no mask", lambda c: "the mask is not applied"),
        Hypothesis("mask-row-stride-kv", lambda c: _has_mask(c) and c.q_len > 1,
                   _mask_with_row_stride_kv,
                   lambda c: f"the mask read with row stride kv_len = {c.kv_len}",
                   lambda c: "mask_row_stride is not used (the mask is a view into wider "
                             "rows here): rows past the first read the wrong elements"),
        Hypothesis("gqa-modulo", lambda c: c.group > 1 and c.n_kv_heads > 1,
                   lambda ctx: attend(ctx.truth.but(
                       kv_head=np.arange(ctx.case.n_heads) % ctx.case.n_kv_heads)),
                   lambda c: "query head h reading kv head h % n_kv_heads",
                   lambda c: f"the GQA head mapping is h % {c.n_kv_heads}; the ABI's is "
                             f"h / (n_heads / n_kv_heads) = h / {c.group}"),
        Hypothesis("scale-1/d", lambda c: c.scale <= 0,
                   lambda ctx: attend(ctx.truth.but(scale=1.0 / ctx.case.head_dim)),
                   lambda c: f"scale 1/head_dim = 1/{c.head_dim}",
                   lambda c: "the scale is 1/d where it should be 1/sqrt(d)"),
        Hypothesis("scale-one", lambda c: _scale(c) != 1.0, _setting(scale=1.0),
                   lambda c: "scale 1", lambda c: "the scale is not applied"),
        Hypothesis("scale-default", lambda c: c.scale > 0,
                   lambda ctx: attend(ctx.truth.but(scale=ctx.case.head_dim ** -0.5)),
                   lambda c: f"scale 1/sqrt(head_dim) instead of the given {c.scale:g}",
                   lambda c: "the explicit scale is ignored"),
    ]


def _block_hypotheses() -> list[Hypothesis]:
    out = []
    for n in BLOCKS:
        def tail_applies(c: Case, n=n) -> bool:
            cut = c.kv_len // n * n
            return c.kv_len > n and c.kv_len % n != 0 and cut < c.keys_in_reach
        out.append(Hypothesis(
            f"tail-block-dropped-{n}", tail_applies,
            lambda ctx, n=n: attend(ctx.truth.but(key_limit=ctx.case.kv_len // n * n)),
            lambda c, n=n: f"the keys from {c.kv_len // n * n} on dropped (kv_len {c.kv_len} "
                           f"rounded down to a multiple of {n})",
            lambda c, n=n: f"the last partial block of keys is skipped (blocks of {n})"))
        out.append(Hypothesis(
            f"first-block-only-{n}", lambda c, n=n: c.keys_in_reach > n,
            lambda ctx, n=n: attend(ctx.truth.but(key_limit=n)),
            lambda c, n=n: f"only the first {n} keys",
            lambda c, n=n: f"keys past the first block boundary ({n}) are dropped"))
    return out


def _value_hypotheses() -> list[Hypothesis]:
    out = []
    for which, label in TENSORS.items():
        for dt in ("f16", "bf16"):
            def applies(c: Case, which=which) -> bool:
                return all(_stored_as(c, w) == "f32"
                           for w in (("k", "v") if which == "kv" else (which,)))
            out.append(Hypothesis(
                f"{which}-rounded-{dt}", applies, _rounded_inputs(which, dt),
                lambda c, label=label, dt=dt: f"{label} rounded to {dt.upper()}",
                lambda c, label=label, dt=dt: f"{label} is rounded to {dt.upper()} before "
                                              "use (stored F32)"))
    out += [
        Hypothesis("nan-as-zero", lambda c: c.mask == "nan-inputs", _nan_as_zero,
                   lambda c: "NaN inputs read as 0",
                   lambda c: "NaN inputs are dropped, where the reference propagates them"),
        Hypothesis("first-batch-only", lambda c: c.batch > 1, _first_batch_only,
                   lambda c: "batch 0 only (batches 1 and up left unwritten)",
                   lambda c: "only the first batch is written"),
        Hypothesis("batch0-kv", lambda c: c.batch > 1, _batch0_kv,
                   lambda c: "batch 0's K and V for every batch",
                   lambda c: "the batch stride of K and V is not applied"),
    ]
    return out


HYPOTHESES: tuple[Hypothesis, ...] = (*_causal_hypotheses(), *_mask_and_scale_hypotheses(),
                                      *_block_hypotheses(), *_value_hypotheses())
BY_NAME = {h.name: h for h in HYPOTHESES}
