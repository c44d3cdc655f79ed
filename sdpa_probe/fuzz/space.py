"""The parameter space `probe fuzz` draws from: hypothesis strategies over Case's own
fields, so that a drawn case is an ordinary Case (an id, a spec, the same verdicts).
Every draw is valid by construction; each field shrinks towards the simplest value
(one sequence, one head, short lengths, f32, no mask, bshd, one thread, no relation)."""

from __future__ import annotations

from hypothesis import strategies as st

from ..cases import DTYPES, LAYOUTS, Case
from ..cases.case import RELATIONS
from ..check.relations import applies

MAX_FLOPS = 2e7   # a drawn case's work: a call in milliseconds, the oracle's too
MAX_KV = 300
MAX_Q = 40
HEAD_DIMS = (64, 128, 80, 96, 256, 67, 20, 3, 17)   # besides 1..32
THREADS = (1, 2, 3, 4, 8, 64, 0, -1)                 # <= 0: the kernel's default
SCALES = (0.0, -1.0, 0.125, 1.0, 0.01, 8.0)          # <= 0: the default 1/sqrt(D)
MAGNITUDES = (1.0, 10.0, 0.01, 100.0)
ROW_MASKS = ("rows:first", "rows:middle", "rows:last", "rows:block", "rows:far",
             "rows:negfinite")


@st.composite
def shapes(draw) -> dict:
    batch = draw(st.integers(1, 3) | st.just(0))
    n_kv = draw(st.integers(1, 4))
    group = draw(st.integers(1, 4) | st.sampled_from((7, 8)))
    head_dim = draw(st.integers(1, 32) | st.sampled_from(HEAD_DIMS))
    q_len = draw(st.integers(1, MAX_Q) | st.just(0))
    kv_len = draw(st.integers(1, MAX_KV) | st.just(0))
    while kv_len > 1 and 4 * max(batch, 1) * n_kv * group * max(q_len, 1) * kv_len \
            * head_dim > MAX_FLOPS:
        kv_len //= 2
    return dict(batch=batch, n_heads=n_kv * group, n_kv_heads=n_kv, head_dim=head_dim,
                q_len=q_len, kv_len=kv_len)


@st.composite
def masking(draw, s: dict) -> dict:
    kv, q = s["kv_len"], s["q_len"]
    causal = kv > 0 and draw(st.booleans())
    start_pos = 0
    if causal:
        bottom = max(0, kv - q)
        start_pos = draw(st.sampled_from((bottom, 0)) | st.integers(0, bottom))
    else:
        start_pos = draw(st.just(0) | st.integers(0, kv))  # (no edge: every key seen)
    mask = "none"
    if kv > 0 and q > 0:  # (a recipe's rows need a row; its NaN sites a sequence)
        kinds = ["none", "random", *ROW_MASKS, "window", "ring", "sink", "zero-tokens",
                 "constant-token"]
        if s["n_kv_heads"] >= 3 and s["batch"] > 0:
            kinds.append("nan-inputs")
        mask = draw(st.sampled_from(kinds))
        if mask in ("rows:far", "rows:negfinite") and (q < 2 or kv < 5):
            mask = "random"
        if mask == "window":
            mask = f"window:{draw(st.integers(1, kv))}"
        elif mask == "ring":
            mask = f"ring:{draw(st.integers(1, kv))}"
        elif mask == "sink":
            mask = f"sink:{draw(st.integers(0, kv - 1))}:{draw(st.integers(1, kv))}"
    return dict(causal=causal, start_pos=start_pos, mask=mask)


@st.composite
def storage(draw, s: dict) -> dict:
    dtype = draw(st.sampled_from(DTYPES))
    q_dtype = draw(st.sampled_from(("", "f32"))) if dtype != "f32" else ""
    layouts = [x for x in LAYOUTS if not (x == "far" and s["batch"] < 2)
               and not (x == "qfused" and q_dtype)]
    layout = draw(st.sampled_from(layouts))
    quant = draw(st.sampled_from(("asym", "sym"))) if dtype == "i8" else "asym"
    v_magnitude = 1.0
    if dtype == "f16" and draw(st.booleans()):
        v_magnitude = 1e-5      # subnormal V and outputs
    elif dtype == "i8" and draw(st.booleans()):
        v_magnitude = 0.01
    return dict(dtype=dtype, q_dtype=q_dtype, layout=layout, quant=quant,
                v_magnitude=v_magnitude, scale=draw(st.sampled_from(SCALES)),
                magnitude=draw(st.sampled_from(MAGNITUDES)))


@st.composite
def calling(draw, s: dict) -> dict:
    n_threads = draw(st.sampled_from(THREADS))
    kind = draw(st.sampled_from(("plain", "reuse", "callers", "stack")))
    callers = 2 if kind == "callers" and s["layout"] != "far" else 1
    reuse = kind == "reuse" and s["layout"] != "far"
    stack_kib = 256 if kind == "stack" else 0
    return dict(n_threads=n_threads, callers=callers, reuse=reuse, stack_kib=stack_kib,
                seed=draw(st.integers(0, 1 << 16)))


@st.composite
def cases(draw, with_relations: bool = True, family: str = "fuzz") -> Case:
    """A case from the whole space; with_relations: some with a metamorphic relation."""
    s = draw(shapes())
    s |= draw(masking(s))
    s |= draw(storage(s))
    s |= draw(calling(s))
    case = Case(family, **s)
    if with_relations:
        rel = draw(st.sampled_from(("",) * 3 + RELATIONS))
        if rel and applies(rel, case) is None:
            case = Case(family, **s, relation=rel)
    return case
