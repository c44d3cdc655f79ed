"""How a kernel is called: threads, the same buffers again, two callers at once, a small
stack, long contexts on the low-precision paths; and calls it must refuse."""

from __future__ import annotations

from ..case import Case
from ..invalid_calls import INVALID_CALLS
from ..kernel_blocks import KV_BLOCK


def threads() -> list[Case]:
    """Threads over decode and prefill, and more threads than keys."""
    cs: list[Case] = []
    for t in (1, 2, 3):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_threads=t, n_heads=8, n_kv_heads=2))
        cs.append(Case("threads", batch=2, q_len=33, kv_len=100, n_threads=t, causal=True,
                       start_pos=67, n_heads=4, n_kv_heads=2))
    # threaded prefill through the F16, BF16 and int8 paths (their own query-block splits:
    # every threaded prefill case before these was F32, or int8 under two callers)
    for dt, b in (("f16", 1), ("bf16", 2), ("i8", 2)):
        cs.append(Case("threads", batch=b, q_len=33, kv_len=100, n_threads=3, causal=True,
                       start_pos=67, n_heads=4, n_kv_heads=2, dtype=dt))
    # more threads than keys: a kv split per thread leaves one empty, whose partial state
    # (max -inf, sum 0) the merge must take as nothing
    for dt in ("f32", "i8"):
        cs.append(Case("threads", q_len=1, kv_len=2, n_threads=3, n_heads=8, n_kv_heads=2,
                       dtype=dt))
    return cs


def reuse() -> list[Case]:
    """The same buffers called again, rewritten in place."""
    cs: list[Case] = []
    # the same buffers called again, rewritten in place with new values, as a runtime's
    # static KV cache and mask are between decode steps: a kernel that keeps what it
    # derived from a buffer (dequantised or packed K / V, a mask's visible ranges) by its
    # address answers the second call with the first's
    cs.append(Case("reuse", kv_len=300, mask="random", n_heads=8, n_kv_heads=2, reuse=True))
    cs.append(Case("reuse", kv_len=KV_BLOCK + 1, dtype="i8", n_heads=8, n_kv_heads=2,
                   reuse=True))
    cs.append(Case("reuse", q_len=4, kv_len=300, mask="window:100", causal=True, start_pos=296,
                   n_heads=4, n_kv_heads=2, dtype="f16", reuse=True))
    return cs


def many_threads() -> list[Case]:
    """As many threads as a server has cores."""
    cs: list[Case] = []
    # as many threads as a server has cores: a kernel with a fixed-size array of per-thread
    # partial states or scratch (sized for a laptop) overflows it
    for dt in ("f32", "i8"):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_threads=64, n_heads=8, n_kv_heads=2,
                       dtype=dt))
    cs.append(Case("threads", batch=2, q_len=33, kv_len=100, n_threads=64, causal=True,
                   start_pos=67, n_heads=4, n_kv_heads=2))
    return cs


def concurrent_callers() -> list[Case]:
    """Two threads calling the kernel at once."""
    cs: list[Case] = []
    # two threads calling the kernel at once, each with its own inputs and output: a
    # kernel with static scratch, or a non-reentrant pool or cache, mixes their rows
    cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, callers=2))
    for dt in ("f16", "bf16"):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, callers=2,
                       dtype=dt))
    cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, n_threads=2,
                   dtype="bf16"))
    cs.append(Case("threads", q_len=9, kv_len=100, causal=True, start_pos=91, n_heads=4,
                   n_kv_heads=2, dtype="i8", n_threads=2, callers=2))
    return cs


def small_stack() -> list[Case]:
    """Called from a thread with a small stack."""
    cs: list[Case] = []
    # called from a thread with a 256 KiB stack, 100,000 keys: a kernel with a kv_len-long
    # array on its stack (a VLA, alloca) overflows it
    cs.append(Case("threads", q_len=1, kv_len=100_000, n_heads=4, n_kv_heads=1, stack_kib=256))
    return cs


def long_contexts() -> list[Case]:
    """Contexts past 2^16 keys in the low-precision caches."""
    cs: list[Case] = []
    # long contexts past 2^16 keys in the low-precision caches (the F32 one has the case
    # above): a token index or position kept in 16 bits, or scratch sized for a maximum
    # context, on the F16 / BF16 / int8 path alone, is right at every shorter length
    cs.append(Case("long", kv_len=70_001, dtype="i8", n_heads=4, n_kv_heads=1))
    cs.append(Case("long", kv_len=70_001, dtype="f16", n_heads=4, n_kv_heads=1, n_threads=2))
    cs.append(Case("long", q_len=3, kv_len=70_001, dtype="bf16", causal=True,
                   start_pos=69_998, n_heads=4, n_kv_heads=2))
    cs.append(Case("long", q_len=2, kv_len=70_001, dtype="i8", q_dtype="f32", causal=True,
                   start_pos=69_999, n_heads=8, n_kv_heads=2, n_threads=2))
    return cs


def refused_calls() -> list[Case]:
    """Calls the ABI says a kernel must refuse."""
    cs: list[Case] = []
    # calls the ABI says a kernel must refuse with SDPA_INVALID, writing nothing: each a
    # valid masked GQA call with one argument broken (a kernel that trusts its arguments
    # crashes, reads the wrong heads or answers SDPA_OK)
    for name in INVALID_CALLS:
        cs.append(Case("args", q_len=2, kv_len=70, mask="random", invalid=name))
    return cs
