"""One `probe profile` run from its Settings: the memory plan, a trial call of a user
kernel, the native builds, then per context the logits check and the timed steps of
every graph, the token rates, and the result document."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from .. import TOOL
from ..caller_state import Guard
from ..errors import KernelProblem, ProbeError
from ..machine import mem_available
from ..trial_call import LEFT_CHANGED, trial_call
from . import builds, decode, user_allocs
from .attention import Attention, check_pairs, resolve_attention
from .measure import Run, Session, check_outputs, measure, token_rate
from .settings import Settings, required_capacity, validate
from .summaries import ab_summary, growth, roofline_numbers, summarize


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


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


_tried: set = set()


def try_user_kernel(att: Attention, s: Settings) -> None:
    """One call of the user kernel on this model's attention shape in a child process, so
    that a kernel that crashes is a one-line error rather than the end of this process."""
    sh = s.shape
    shape = {"kind": "decode", "n_heads": sh.heads, "n_kv_heads": sh.kv_heads,
             "head_dim": sh.head_dim, "q_len": 1, "kv_len": max(s.contexts) + 1,
             "causal": False, "dtype": s.cache}
    key = (str(att.user.result.path), tuple(shape.values()), s.threads)
    if key in _tried:
        return
    died = trial_call(att.user.result, shape, s.threads)
    if died:
        what = "failed" if died.startswith(LEFT_CHANGED) else "crashed in"
        raise KernelProblem(f"attention {att.label} ({att.user.name}) {what} a trial call: "
                         f"{died}; reproduce: probe run --kernel {att.user.path} --heads "
                         f"{sh.heads} --kv-heads {sh.kv_heads} --head-dim {sh.head_dim} "
                         f"--kv-len {shape['kv_len']} --dtype {s.cache}")
    _tried.add(key)


@dataclasses.dataclass
class _Plan:
    """What a run was set up with before its first step."""

    atts: list[Attention]                    # the graphs asked for (two with --ab)
    pairs: list[tuple[Attention, Attention]]  # the logits checks
    memory: dict
    used: dict                               # cflags -> builds.Build
    record_ns: dict                          # cflags -> the cost of one op record
    roof: dict | None
    head: dict                               # the document's setup keys

    def summary(self, r: Run, s: Settings) -> dict:
        sm = summarize(r, s, self.record_ns[r.attention.cflags], self.roof)
        b = self.used[r.attention.cflags]
        return sm | {"build": b.label, "module": b.result.module_name}


def _prepare(s: Settings, note: Callable[[str], None]) -> _Plan:
    """Everything before the first step: the graphs, the memory plan, a trial call of
    each user kernel, the native builds, the document's setup keys."""
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
    return _Plan(atts, pairs, plan, used, record_ns, roof, head)


@dataclasses.dataclass
class _Measured:
    checks: list = dataclasses.field(default_factory=list)
    runs: list[Run] = dataclasses.field(default_factory=list)
    summaries: dict = dataclasses.field(default_factory=dict)  # (graph, context) -> summary
    abs_: list = dataclasses.field(default_factory=list)      # one A/B per context
    rates: dict = dataclasses.field(default_factory=lambda: {"pp": [], "tg": []})
    left: dict = dataclasses.field(default_factory=dict)  # graph -> what it left changed


def _live_hook(p: _Plan, s: Settings, live, interval: float):
    """on_step for measure(): live(head, partial summaries) at most every interval s."""
    if live is None:
        return None
    last = [0.0]

    def on_step(rs: list[Run]) -> None:
        now = time.monotonic()
        if now - last[0] >= interval:
            last[0] = now
            live(p.head, [p.summary(r, s) for r in rs])

    return on_step


def _measure_all(s: Settings, p: _Plan, progress, live, live_interval: float) -> _Measured:
    """Per context the logits checks, then the timed steps; then the token rates. A
    graph's steps that leave the caller changed are put back after each (Guard)."""
    note = progress or (lambda _msg: None)
    on_step = _live_hook(p, s, live, live_interval)
    m = _Measured()
    sess = Session(s, p.memory["capacity"])
    guard = Guard(m.left)
    try:
        for ctx in sorted(set(s.contexts)):
            for ref, other in p.pairs:
                chk = check_outputs(sess, ref, other, ctx)
                guard.put_back(other.label)
                m.checks.append(chk)
                if not chk["ok"]:
                    raise KernelProblem(f"{other.title} disagrees with {ref.title} at context "
                                     f"{ctx}: max |diff| / rms of the logits = "
                                     f"{chk['rel_err']:.3g} > {chk['tol']}")
            agree = ", ".join(f"{c['b']} vs {c['a']} rel err {c['rel_err']:.2g}"
                              for c in m.checks[-len(p.pairs):])
            note(f"context {ctx}: {' vs '.join(a.title for a in p.atts)}, "
                 f"{s.warmup} warm-up + {s.steps} steps (logits agree: {agree})")
            rs = measure(sess, p.atts, ctx, None if live else progress, on_step, guard)
            m.runs.extend(rs)
            for r in rs:
                m.summaries[(r.attention.label, ctx)] = p.summary(r, s)
            if s.ab:
                m.abs_.append(ab_summary(rs[0], rs[1]))
        for a in p.atts:
            if s.pp:
                note(f"pp{s.pp}: {a.title}")
                m.rates["pp"].append(token_rate(sess, a, 0, s.pp))
                guard.put_back(a.label)
            if s.tg:
                for ctx in sorted(set(s.contexts)):
                    note(f"tg{s.tg} at context {ctx}: {a.title}")
                    m.rates["tg"].append(token_rate(sess, a, ctx, s.tg) | {"context": ctx})
                    guard.put_back(a.label)
    finally:
        sess.close()
    return m


def _document(s: Settings, p: _Plan, m: _Measured) -> dict:
    atts, summaries = p.atts, m.summaries
    contexts = sorted(set(s.contexts))
    primary = summaries[(atts[0].label, contexts[-1])]
    doc = p.head | {
        "steps": s.steps, "warmup": s.warmup, "seed": s.seed,
        "capacity": p.memory["capacity"], "memory": p.memory, "rope": s.rope_style,
        "attention": [a.label for a in atts], "record_cost_ns": p.record_ns[atts[0].cflags],
        # the contract: the first graph at the largest context
        "graph": primary["attention"], "context": primary["context"],
        "contexts": contexts,
        "step_ms": primary["step_ms"], "ops": primary["ops"], "kinds": primary["kinds"],
        "unattributed_ms": primary["unattributed_ms"], "overhead_ms": primary["overhead_ms"],
        "overhead_pct": primary["overhead_pct"], "tokens_per_s": primary["tokens_per_s"],
        "runs": list(summaries.values()),
        "checks": m.checks,
        # graph -> what its steps left changed in the caller (put back after each step)
        "caller_changed": m.left,
    }
    if len(contexts) > 1:
        doc["sweep"] = [{"context": c,
                         "runs": {a.label: summaries[(a.label, c)] for a in atts},
                         **({"ab": next(x for x in m.abs_ if x["context"] == c)}
                            if s.ab else {})}
                        for c in contexts]
        doc["growth"] = {a.label: growth([summaries[(a.label, c)] for c in contexts])
                         for a in atts}
    if s.ab:
        doc["ab"] = dict(m.abs_[-1])
        if len(m.abs_) > 1:
            doc["ab"]["by_context"] = m.abs_
    if s.pp:
        doc["pp"] = m.rates["pp"]
    if s.tg:
        doc["tg"] = m.rates["tg"]
    return doc


def run_profile(s: Settings, progress: Callable[[str], None] | None = None,
                live: Callable[[dict, list[dict]], None] | None = None,
                live_interval: float = 0.5) -> tuple[dict, list[Run]]:
    """Run everything the settings ask for; returns (result document, raw runs).
    live (if given) gets (header, partial per-graph summaries) at most every live_interval s."""
    plan = _prepare(s, progress or (lambda _msg: None))
    measured = _measure_all(s, plan, progress, live, live_interval)
    if s.user_allocs:
        user_allocs.count(s, plan.atts, measured.summaries, plan.head["threads"],
                          progress or (lambda _msg: None))
    return _document(s, plan, measured), measured.runs
