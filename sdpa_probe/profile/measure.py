"""Measurement: one model per native build and one state per attention graph, steps
timed op by op with the graphs interleaved, llama-bench-style token rates, and the
check that two graphs' logits agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..caller_state import Guard
from ..errors import KernelError, KernelProblem, ProbeError, SdpaUnsupported
from . import builds, decode
from .attention import Attention
from .settings import Settings

# logits agreement between two attention graphs: max |a - b| / rms(b). The graphs
# round differently (the fused one stores roped keys, the decomposed one ropes
# after the cache read), which an F16 or int8 cache turns into visible noise.
CHECK_TOL = {"f32": 1e-3, "f16": 1e-2, "i8": 1e-1}


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
        if isinstance(exc, SdpaUnsupported):  # (it does not take this: not a fault of it)
            raise ProbeError(f"attention {att.title} failed at context {pos}: {exc} (the "
                             f"kernel refused this call: a {st.cache_dtype} cache, GQA, "
                             "strides)") from None
        raise KernelProblem(f"attention {att.title} failed at context {pos}: {exc}") from None


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


