"""Measurement for `probe profile`: warm-up, timed steps, A/B interleaving, context
sweeps, llama-bench-style pp/tg, the decomposed-vs-fused output check."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np

from .. import TOOL, native
from ..errors import KernelError, ProbeError, SdpaUnsupported
from ..machine import mem_available
from . import builds, decode, graph, stats
from .models import ModelShape

GRAPH_LABELS = ("decomposed", "fused")
# logits agreement between two attention graphs: max |a - b| / rms(b). The graphs
# round differently (the fused one stores roped keys, the decomposed one ropes
# after the cache read), which an F16 or int8 cache turns into visible noise.
CHECK_TOL = {"f32": 1e-3, "f16": 1e-2, "i8": 1e-1}


USER = "user"  # the attention name of --kernel PATH


@dataclasses.dataclass(frozen=True)
class Attention:
    label: str            # what the user asked for: decomposed, fused, a kernel name, user;
                          # with @CFLAGS: the same in a native build with those flags
    graph: int            # decode.GRAPH_DECOMPOSED or decode.GRAPH_KERNEL
    kernel_index: int = -1
    kernel: str | None = None  # the kernel in the attention slot (user:FILE for --kernel)
    cflags: str | None = None  # extra compiler flags of its native build (None: the default)
    user: builds.UserKernel | None = None

    @property
    def base(self) -> str:
        return split_build(self.label)[0]

    @property
    def build_label(self) -> str:
        return builds.DEFAULT if self.cflags is None else self.cflags

    @property
    def title(self) -> str:
        if self.kernel and self.base != self.kernel:
            return f"{self.label} ({self.kernel})"
        return self.label


def split_build(label: str) -> tuple[str, str | None]:
    """GRAPH@CFLAGS -> (GRAPH, CFLAGS); no @ -> (GRAPH, None)."""
    base, at, flags = label.strip().partition("@")
    if not at:
        return base.strip(), None
    if not flags.strip():
        raise ProbeError(f"{label!r}: no compiler flags after @ (e.g. fused@-O1)")
    return base.strip(), " ".join(flags.split())


def with_build(base: str, cflags: str | None) -> str:
    return base if cflags is None else f"{base}@{cflags}"


def resolve_attention(label: str, cache: str, kernel_path: str | None = None) -> Attention:
    """decomposed | fused | KERNEL (any registered kernel; kernel:NAME for a name clash) |
    user (the --kernel file), each optionally @CFLAGS (a native build with those flags)."""
    label = " ".join(label.split())
    base, cflags = split_build(label)
    if base == "decomposed":
        return Attention(label, decode.GRAPH_DECOMPOSED, cflags=cflags)
    if base == USER:
        if kernel_path is None:
            raise ProbeError(f"attention {label!r} is the --kernel file: give --kernel PATH.c "
                             "or PATH.so")
        uk = builds.user_kernel(kernel_path, cflags)
        return Attention(label, decode.GRAPH_KERNEL, -1, uk.name, cflags, uk)
    kernels = native.builtin_kernels()  # the registry is the same in every build
    if base == "fused":
        name = "quant_int8" if cache == "i8" else "flash"
    else:
        name = base[len("kernel:"):] if base.startswith("kernel:") else base
    if name not in kernels:
        raise ProbeError(f"unknown attention {label!r}; use decomposed, fused, user (with "
                         "--kernel) or a kernel: " + ", ".join(kernels))
    k = kernels[name]
    if cache not in k.info.dtypes:
        raise ProbeError(f"kernel {name} does not read a {cache} cache (it takes "
                         f"{' '.join(k.info.dtypes)}); pick another --cache or --attention")
    return Attention(label, decode.GRAPH_KERNEL, k.info.index, name, cflags)


def check_pairs(atts: list[Attention], cache: str,
                kernel_path: str | None = None) -> list[tuple[Attention, Attention]]:
    """The output checks: every non-decomposed attention against the decomposed graph of
    its own build; a decomposed graph alone against the fused graph of its build."""
    pairs = []
    for a in atts:
        if a.graph != decode.GRAPH_DECOMPOSED:
            ref = resolve_attention(with_build("decomposed", a.cflags), cache)
            pairs.append((ref, a))
    if not pairs:
        for a in atts:
            pairs.append((a, resolve_attention(with_build("fused", a.cflags), cache)))
    return pairs


@dataclasses.dataclass
class Settings:
    shape: ModelShape
    weights: str = "f16"
    cache: str = "f16"
    attention: tuple[str, ...] = ("fused",)  # one label, or two for --ab
    ab: bool = False
    contexts: tuple[int, ...] = (1000,)
    steps: int = 20
    warmup: int = 3
    threads: int = 0
    seed: int = 0
    capacity: int | None = None
    pp: int = 0
    tg: int = 0
    rope_style: str = "half"
    kernel_path: str | None = None  # --kernel: the user kernel behind attention `user`
    untimed_every: int = 4  # one untimed step per this many timed ones (overhead cross-check)
    roofline: bool = True
    token: int = 1


@dataclasses.dataclass
class Run:
    """Raw samples of one attention graph at one context."""

    attention: Attention
    context: int
    ops: list[decode.OpInfo]
    rec: list = dataclasses.field(default_factory=list)       # [n_ops, 4] per step
    wall_ns: list = dataclasses.field(default_factory=list)
    native_ns: list = dataclasses.field(default_factory=list)
    untimed_ns: list = dataclasses.field(default_factory=list)

    def records(self) -> np.ndarray:
        return np.stack(self.rec) if self.rec else np.zeros((0, len(self.ops), 4), np.int64)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


MAX_CONTEXTS = 256


def parse_contexts(text: str) -> tuple[int, ...]:
    """--context: comma-separated token counts and START:STOP:STEP ranges (STOP included
    when it is on the grid), mixed freely: "100,1000,2000", "500:4000:500",
    "0,100:300:100". Sorted, duplicates dropped."""
    vals: list[int] = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        if not item:
            continue
        if ":" in item:
            parts = item.split(":")
            try:
                a, b, step = (int(x) for x in parts)
            except ValueError:
                raise ProbeError(f"--context range {item!r} wants START:STOP:STEP integers, "
                                 "e.g. 500:4000:500") from None
            if step <= 0:
                raise ProbeError(f"--context range {item!r}: STEP must be positive")
            if b < a:
                raise ProbeError(f"--context range {item!r}: STOP is below START")
            if (b - a) // step + 1 > MAX_CONTEXTS:
                raise ProbeError(f"--context range {item!r} has more than {MAX_CONTEXTS} "
                                 "points")
            vals.extend(range(a, b + 1, step))
        else:
            try:
                vals.append(int(item))
            except ValueError:
                raise ProbeError("--context wants comma-separated integers or START:STOP:STEP "
                                 f"ranges, got {text!r}") from None
    if not vals:
        raise ProbeError("--context is empty")
    out = tuple(sorted(set(vals)))
    if len(out) > MAX_CONTEXTS:
        raise ProbeError(f"--context has more than {MAX_CONTEXTS} points")
    return out


def validate(s: Settings) -> None:
    """Everything checkable before any allocation; raises ProbeError."""
    if s.weights not in decode.WEIGHT_DTYPES:
        raise ProbeError(f"--weights must be one of {', '.join(decode.WEIGHT_DTYPES)}")
    if s.cache not in decode.CACHE_DTYPES:
        raise ProbeError(f"--cache must be one of {', '.join(decode.CACHE_DTYPES)}")
    if s.rope_style not in decode.ROPE_STYLES:
        raise ProbeError(f"--rope must be one of {', '.join(decode.ROPE_STYLES)}")
    if not s.contexts or any(c < 0 for c in s.contexts):
        raise ProbeError("--context wants non-negative token counts")
    if s.steps < 1 or s.warmup < 0 or s.pp < 0 or s.tg < 0:
        raise ProbeError("--steps must be >= 1; --warmup, --pp, --tg >= 0")
    if s.threads < 0 or s.threads > 64:
        raise ProbeError("--threads must be between 1 and 64 (0: default)")
    need = required_capacity(s)
    if s.capacity is not None:
        if s.capacity < 1:
            raise ProbeError("--cache-size must be positive")
        if need > s.capacity:
            raise ProbeError(f"context {max(s.contexts)} (+{max(s.tg, 1)} new token(s)) is "
                             f"larger than the cache: needs {need} positions, --cache-size is "
                             f"{s.capacity}")


def required_capacity(s: Settings) -> int:
    return max(max(s.contexts) + max(s.tg, 1), s.pp, 1)


def memory_plan(s: Settings, atts: list[Attention]) -> dict:
    cap = s.capacity or required_capacity(s)
    mb1 = decode.model_bytes(s.shape, s.weights)
    if mb1 < 0:
        raise ProbeError("the model shape is too large to address")
    n_builds = len({a.cflags for a in atts})
    mb = mb1 * n_builds  # one copy of the weights per native build
    states = {}
    for a in atts:
        b = decode.state_bytes(s.shape, a.graph, s.cache, cap)
        if b < 0:
            raise ProbeError("the KV cache for this shape and capacity is too large to address")
        states[a.label] = b
    total = mb + sum(states.values())
    avail = mem_available()
    if avail is not None and total > 0.85 * avail:
        raise ProbeError(f"out of memory: weights {_gib(mb)} + caches/scratch "
                         f"{_gib(sum(states.values()))} = {_gib(total)}, but only "
                         f"{_gib(avail)} is available (try --weights f16, a smaller --vocab "
                         "or --cache-size)")
    return {"weights_bytes": mb, "builds": n_builds, "state_bytes": states,
            "total_bytes": total, "available_bytes": avail, "capacity": cap}


class Session:
    """One model per native build and one state per attention graph, all over the same
    weights (a function of the seed) and the same history."""

    def __init__(self, s: Settings, capacity: int):
        self.s, self.capacity = s, capacity
        self.models: dict[str | None, decode.DecodeModel] = {}
        self.states: dict[str, decode.DecodeState] = {}

    def model(self, cflags: str | None) -> decode.DecodeModel:
        if cflags not in self.models:
            s = self.s
            self.models[cflags] = decode.DecodeModel(s.shape, s.weights, s.seed, s.threads,
                                                     s.rope_style, build=builds.get(cflags))
        return self.models[cflags]

    def state(self, att: Attention) -> decode.DecodeState:
        if att.label not in self.states:
            st = decode.DecodeState(self.model(att.cflags), att.graph, att.kernel_index,
                                    self.s.cache, self.capacity, self.s.threads)
            if att.user is not None:
                st.set_forward(att.user.address, keep=att.user)
            st.fill_history(0, self.capacity, self.s.seed + 1)
            self.states[att.label] = st
        return self.states[att.label]

    def restore(self, begin: int, end: int) -> None:
        """Put the synthetic history back where steps wrote new tokens."""
        for st in self.states.values():
            st.fill_history(begin, min(end, self.capacity), self.s.seed + 1)

    def close(self) -> None:
        for st in self.states.values():
            st.close()
        self.states.clear()
        for m in self.models.values():
            m.close()
        self.models.clear()


def _step(st: decode.DecodeState, att: Attention, token: int, pos: int, **kw):
    try:
        return st.step(token, pos, **kw)
    except KernelError as exc:
        hint = ""
        if isinstance(exc, SdpaUnsupported):
            hint = f" (the kernel refused this call: a {st.cache_dtype} cache, GQA, strides)"
        raise ProbeError(f"attention {att.title} failed at context {pos}: {exc}{hint}") \
            from None


def check_outputs(sess: Session, a: Attention, b: Attention, context: int) -> dict:
    """One step of each graph from the same state; compare the logits."""
    s = sess.s
    _step(sess.state(a), a, s.token, context, logits=True, timed=False)
    xa = sess.state(a).last_logits.copy()
    _step(sess.state(b), b, s.token, context, logits=True, timed=False)
    xb = sess.state(b).last_logits.copy()
    sess.restore(context, context + 1)
    diff = float(np.max(np.abs(xa - xb)))
    rms = float(np.sqrt(np.mean(xb.astype(np.float64) ** 2))) or 1e-30
    err = diff / rms
    tol = CHECK_TOL[s.cache]
    ok = bool(np.isfinite(xa).all() and np.isfinite(xb).all() and err <= tol)
    return {"context": context, "a": a.label, "b": b.label, "max_abs_diff": diff,
            "rel_err": err, "tol": tol, "ok": ok,
            "argmax_equal": bool(int(np.argmax(xa)) == int(np.argmax(xb)))}


def measure(sess: Session, atts: list[Attention], context: int,
            progress: Callable[[str], None] | None = None,
            on_step: Callable[[list[Run]], None] | None = None, guard=None) -> list[Run]:
    """Warm-up, then steps timed op by op, graphs interleaved (ABAB, BABA, ...).
    on_step (if given) sees the partial runs after every round. A graph whose step
    leaves the caller changed (its attention kernel pinned the thread, set FTZ or
    OMP_NUM_THREADS: what `probe check` fails) would time the other graph in that state:
    it is put back after each step to `guard`'s state (caller_state.Guard, which keeps
    what changed by graph label; default: the caller as it is now)."""
    from ..caller_state import Guard

    s = sess.s
    guard = guard or Guard()
    states = [sess.state(a) for a in atts]
    runs = [Run(a, context, st.ops) for a, st in zip(atts, states, strict=True)]
    pairs = list(zip(atts, states, runs, strict=True))

    def step(a: Attention, st, **kw):
        res = _step(st, a, s.token, context, **kw)
        guard.put_back(a.label)
        return res

    for _ in range(s.warmup):
        for a, st, _run in pairs:
            step(a, st)
    for i in range(s.steps):
        order = pairs if i % 2 == 0 else pairs[::-1]
        for a, st, run in order:
            wall, nat, rec, _ = step(a, st)
            run.wall_ns.append(wall)
            run.native_ns.append(nat)
            run.rec.append(rec)
        if s.untimed_every and i % s.untimed_every == 0:
            for a, st, run in order:
                run.untimed_ns.append(step(a, st, timed=False)[0])
        if on_step:
            on_step(runs)
        if progress and (i + 1) % max(1, s.steps // 4) == 0:
            progress(f"  context {context}: {i + 1}/{s.steps} steps")
    sess.restore(context, context + 1)
    return runs


def token_rate(sess: Session, att: Attention, start: int, n: int) -> dict:
    """n greedy steps from position start (llama-bench pp / tg style), untimed per op."""
    st = sess.state(att)
    tok, total = sess.s.token, 0
    for i in range(n):
        wall, _, _, tok = _step(st, att, tok, start + i, timed=False)
        total += wall
    sess.restore(start, start + n)
    ms = total / n / 1e6
    return {"attention": att.label, "start": start, "tokens": n, "ms_per_token": ms,
            "tokens_per_s": 1000.0 / ms}


# ---- summaries ------------------------------------------------------------------

def roofline_numbers(s: Settings) -> dict | None:
    if not s.roofline:
        return None
    try:
        from .. import machine  # another part of the package; optional
    except ImportError:
        return None
    try:
        r = machine.roofline()
    except Exception:  # noqa: BLE001 -- a missing roofline only drops a column
        return None
    one = s.threads == 1 or (s.threads == 0 and (os.cpu_count() or 1) == 1)
    bw = r.get("read_bw_gbs_1t" if one else "read_bw_gbs_all")
    fl = r.get("fma_gflops_1t" if one else "fma_gflops_all")
    if not bw or not fl:
        return None
    return {"read_bw_gbs": float(bw), "fma_gflops": float(fl),
            "threads": "1t" if one else "all", "cached": r.get("cached")}


def summarize(run: Run, s: Settings, record_ns: float, roof: dict | None) -> dict:
    rec = run.records()                            # [steps, n_ops, 4]
    wall = np.asarray(run.wall_ns, np.float64) / 1e6
    dur = rec[:, :, 1].astype(np.float64) / 1e6
    names: list[str] = []
    idx: dict[str, list[int]] = {}
    for i, op in enumerate(run.ops):
        if op.name not in idx:
            names.append(op.name)
            idx[op.name] = []
        idx[op.name].append(i)
    step_med = stats.median(wall)
    L = run.context + 1
    ops = []
    for name in names:
        ii = idx[name]
        t = dur[:, ii].sum(axis=1)
        kind = run.ops[ii[0]].kind
        b1, f1 = graph.op_cost(name, s.shape, L, s.weights, s.cache)
        nb, nf = b1 * len(ii), f1 * len(ii)
        med = stats.median(t)
        sec = med / 1e3
        gbs = nb / sec / 1e9 if sec > 0 else float("nan")
        gfs = nf / sec / 1e9 if sec > 0 else float("nan")
        roof_pct = None
        if roof and sec > 0:
            bound = max(nb / (roof["read_bw_gbs"] * 1e9), nf / (roof["fma_gflops"] * 1e9))
            roof_pct = 100.0 * bound / sec
        ops.append({
            "name": name, "kind": kind, "calls": len(ii),
            "median_ms": med, "iqr_ms": stats.iqr(t), "mean_ms": float(t.mean()),
            "share": med / step_med if step_med > 0 else float("nan"),
            "bytes": nb, "flops": nf, "gb_s": gbs, "gflop_s": gfs, "roofline_pct": roof_pct,
            "allocs_per_step": stats.median(rec[:, ii, 2].sum(axis=1)),
            "alloc_bytes_per_step": stats.median(rec[:, ii, 3].sum(axis=1)),
            "description": graph.DESCRIPTIONS.get(name, ""),
        })
    ops.sort(key=lambda o: -o["median_ms"])
    kinds: dict[str, np.ndarray] = {}
    for i, op in enumerate(run.ops):
        kinds[op.kind] = kinds.get(op.kind, 0) + dur[:, i]
    kind_rows = sorted(({"kind": k, "median_ms": stats.median(v), "iqr_ms": stats.iqr(v),
                         "share": stats.median(v) / step_med if step_med > 0 else float("nan"),
                         "ops": [o["name"] for o in ops if o["kind"] == k]}
                        for k, v in kinds.items()), key=lambda r: -r["median_ms"])
    op_sum = dur.sum(axis=1)
    unattr = wall - op_sum
    overhead_ms = len(run.ops) * record_ns / 1e6
    untimed = np.asarray(run.untimed_ns, np.float64) / 1e6
    return {
        "attention": run.attention.label, "kernel": run.attention.kernel,
        "context": run.context, "kv_len": L, "steps": len(run.wall_ns),
        "step_ms": {"median": step_med, "iqr": stats.iqr(wall), "mean": float(wall.mean()),
                    "min": float(wall.min())},
        "native_step_ms": stats.median(np.asarray(run.native_ns, np.float64) / 1e6),
        "tokens_per_s": 1000.0 / step_med if step_med > 0 else float("nan"),
        "op_sum_ms": stats.median(op_sum),
        "op_sum_share": stats.median(op_sum / wall),
        "unattributed_ms": stats.median(unattr),
        "unattributed_share": stats.median(unattr) / step_med if step_med > 0 else float("nan"),
        "overhead_ms": overhead_ms,
        "overhead_pct": 100.0 * overhead_ms / step_med if step_med > 0 else float("nan"),
        # an upper bound: all time outside the ops plus the calibrated bookkeeping
        "overhead_upper_ms": max(stats.median(unattr), 0.0) + overhead_ms,
        "overhead_upper_pct": (100.0 * (max(stats.median(unattr), 0.0) + overhead_ms) / step_med
                               if step_med > 0 else float("nan")),
        "untimed_step_ms": stats.median(untimed) if untimed.size else None,
        "untimed_steps": int(untimed.size),
        "n_ops_per_step": len(run.ops), "record_cost_ns": record_ns,
        "allocs_per_step": stats.median(rec[:, :, 2].sum(axis=1)),
        "alloc_bytes_per_step": stats.median(rec[:, :, 3].sum(axis=1)),
        "ops": ops, "kinds": kind_rows,
    }


def ab_summary(ra: Run, rb: Run) -> dict:
    ratio, lo, hi = stats.bootstrap_ratio_ci(ra.wall_ns, rb.wall_ns)
    v = stats.verdict(lo, hi)
    a, b = ra.attention.label, rb.attention.label
    if v == "faster":
        text = f"{b} is {ratio:.2f}x faster than {a}"
    elif v == "slower":
        text = f"{b} is {1 / ratio:.2f}x slower than {a}"
    else:
        text = f"no significant difference between {a} and {b}"
    return {"a": a, "b": b, "context": ra.context,
            "a_ms": stats.median(np.asarray(ra.wall_ns) / 1e6),
            "b_ms": stats.median(np.asarray(rb.wall_ns) / 1e6),
            "ratio": ratio, "ci": [lo, hi], "confidence": 0.95, "verdict": v,
            "summary": text}


def growth(summaries: list[dict]) -> list[dict]:
    """Per op: ms at each context and the least-squares growth per 1000 tokens."""
    ctx = [sm["context"] for sm in summaries]
    by_name: dict[str, dict] = {}
    for sm in summaries:
        for op in sm["ops"]:
            e = by_name.setdefault(op["name"], {"name": op["name"], "kind": op["kind"],
                                                "ms": {}})
            e["ms"][sm["context"]] = op["median_ms"]
    rows = []
    for e in by_name.values():
        xs = [c for c in ctx if c in e["ms"]]
        ys = [e["ms"][c] for c in xs]
        rows.append({"name": e["name"], "kind": e["kind"],
                     "ms_by_context": {str(c): e["ms"][c] for c in xs},
                     "per_1000_tokens_ms": stats.slope_per_1000(xs, ys)})
    step = {"name": "step", "kind": "total",
            "ms_by_context": {str(sm["context"]): sm["step_ms"]["median"] for sm in summaries},
            "per_1000_tokens_ms": stats.slope_per_1000(
                ctx, [sm["step_ms"]["median"] for sm in summaries])}
    rows.sort(key=lambda r: -(r["per_1000_tokens_ms"]
                              if np.isfinite(r["per_1000_tokens_ms"]) else -1e30))
    return [step] + rows


_tried: set = set()


def try_user_kernel(att: Attention, s: Settings) -> None:
    """One call of the user kernel on this model's attention shape in a child process, so
    that a kernel that crashes is a one-line error rather than the end of this process."""
    from ..harness import trial_call

    sh = s.shape
    shape = {"kind": "decode", "n_heads": sh.heads, "n_kv_heads": sh.kv_heads,
             "head_dim": sh.head_dim, "q_len": 1, "kv_len": max(s.contexts) + 1,
             "causal": False, "dtype": s.cache}
    key = (str(att.user.result.path), tuple(shape.values()), s.threads)
    if key in _tried:
        return
    died = trial_call(att.user.result, shape, s.threads)
    if died:
        raise ProbeError(f"attention {att.label} ({att.user.name}) crashed in a trial call: "
                         f"{died}; reproduce: probe run --kernel {att.user.path} --heads "
                         f"{sh.heads} --kv-heads {sh.kv_heads} --head-dim {sh.head_dim} "
                         f"--kv-len {shape['kv_len']} --dtype {s.cache}")
    _tried.add(key)


def profile(s: Settings, progress: Callable[[str], None] | None = None,
            live: Callable[[dict, list[dict]], None] | None = None,
            live_interval: float = 0.5) -> tuple[dict, list[Run]]:
    """Run everything the settings ask for; returns (result document, raw runs).
    live (if given) gets (header, partial per-graph summaries) at most every live_interval s."""
    from ..caller_state import Guard

    note = progress or (lambda _msg: None)
    validate(s)
    atts = [resolve_attention(a, s.cache, s.kernel_path) for a in s.attention]
    if len({a.label for a in atts}) != len(atts):
        raise ProbeError("--ab wants two different attention graphs")
    pairs = check_pairs(atts, s.cache, s.kernel_path)
    every = list({a.label: a for a in atts + [x for p in pairs for x in p]}.values())
    plan = memory_plan(s, every)
    for a in every:
        if a.user is not None:
            try_user_kernel(a, s)
    for cflags in dict.fromkeys(a.cflags for a in every if a.cflags is not None):
        note(f"native library with extra flags {cflags!r}: building (cached after the first "
             "time)")
    used = {a.cflags: builds.get(a.cflags) for a in every}
    threads = s.threads or used[atts[0].cflags].lib.sdpa_probe_default_threads()
    note(f"model {s.shape.name}: {s.shape.params() / 1e6:.0f}M weights ({s.weights}), "
         f"cache {s.cache} x {plan['capacity']} positions, {threads} thread(s); "
         f"allocating {_gib(plan['total_bytes'])}")
    record_ns = {c: decode.record_cost_ns(build=b) for c, b in used.items()}
    roof = roofline_numbers(s)
    head = {"tool": dict(TOOL), "model": s.shape.as_dict(), "weights": s.weights, "cache": s.cache,
            "threads": threads, "kernels": {a.label: a.kernel for a in atts}, "roofline": roof,
            "machine": builds.machine_meta(threads),
            "builds": {b.label: b.meta() for b in used.values()},
            "attention_builds": {a.label: a.build_label for a in every}}
    users = {a.user.name: a.user.meta() for a in every if a.user is not None}
    if users:
        head["user_kernels"] = users
    on_step = None

    def summary(r: Run) -> dict:
        sm = summarize(r, s, record_ns[r.attention.cflags], roof)
        b = used[r.attention.cflags]
        return sm | {"build": b.label, "module": b.result.module_name}

    if live is not None:
        last = [0.0]

        def on_step(rs: list[Run]) -> None:
            now = time.monotonic()
            if now - last[0] >= live_interval:
                last[0] = now
                live(head, [summary(r) for r in rs])

    sess = Session(s, plan["capacity"])
    left: dict[str, list[str]] = {}  # graph -> what its steps left changed in the caller
    guard = Guard(left)
    try:
        checks, runs, summaries, abs_ = [], [], {}, []
        for ctx in sorted(set(s.contexts)):
            for ref, other in pairs:
                chk = check_outputs(sess, ref, other, ctx)
                guard.put_back(other.label)
                checks.append(chk)
                if not chk["ok"]:
                    raise ProbeError(f"{other.title} disagrees with {ref.title} at context "
                                     f"{ctx}: max |diff| / rms of the logits = "
                                     f"{chk['rel_err']:.3g} > {chk['tol']}")
            agree = ", ".join(f"{c['b']} vs {c['a']} rel err {c['rel_err']:.2g}"
                              for c in checks[-len(pairs):])
            note(f"context {ctx}: {' vs '.join(a.title for a in atts)}, "
                 f"{s.warmup} warm-up + {s.steps} steps (logits agree: {agree})")
            rs = measure(sess, atts, ctx, None if live else progress, on_step, guard)
            runs.extend(rs)
            for r in rs:
                summaries[(r.attention.label, ctx)] = summary(r)
            if s.ab:
                abs_.append(ab_summary(rs[0], rs[1]))
        rates = {"pp": [], "tg": []}
        for a in atts:
            if s.pp:
                note(f"pp{s.pp}: {a.title}")
                rates["pp"].append(token_rate(sess, a, 0, s.pp))
                guard.put_back(a.label)
            if s.tg:
                for ctx in sorted(set(s.contexts)):
                    note(f"tg{s.tg} at context {ctx}: {a.title}")
                    rates["tg"].append(token_rate(sess, a, ctx, s.tg) | {"context": ctx})
                    guard.put_back(a.label)
    finally:
        sess.close()

    contexts = sorted(set(s.contexts))
    primary = summaries[(atts[0].label, contexts[-1])]
    doc = head | {
        "steps": s.steps, "warmup": s.warmup, "seed": s.seed,
        "capacity": plan["capacity"], "memory": plan, "rope": s.rope_style,
        "attention": [a.label for a in atts], "record_cost_ns": record_ns[atts[0].cflags],
        # the contract: the first graph at the largest context
        "graph": primary["attention"], "context": primary["context"],
        "contexts": contexts,
        "step_ms": primary["step_ms"], "ops": primary["ops"], "kinds": primary["kinds"],
        "unattributed_ms": primary["unattributed_ms"], "overhead_ms": primary["overhead_ms"],
        "overhead_pct": primary["overhead_pct"], "tokens_per_s": primary["tokens_per_s"],
        "runs": list(summaries.values()),
        "checks": checks,
        # graph -> what its steps left changed in the caller (put back after each step)
        "caller_changed": left,
    }
    if len(contexts) > 1:
        doc["sweep"] = [{"context": c,
                         "runs": {a.label: summaries[(a.label, c)] for a in atts},
                         **({"ab": next(x for x in abs_ if x["context"] == c)} if s.ab else {})}
                        for c in contexts]
        doc["growth"] = {a.label: growth([summaries[(a.label, c)] for c in contexts])
                         for a in atts}
    if s.ab:
        last = abs_[-1]
        doc["ab"] = dict(last)
        if len(abs_) > 1:
            doc["ab"]["by_context"] = abs_
    if s.pp:
        doc["pp"] = rates["pp"]
    if s.tg:
        doc["tg"] = rates["tg"]
    return doc, runs
