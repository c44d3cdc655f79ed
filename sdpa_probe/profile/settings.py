"""What one profile run is asked to do (Settings), the --context grammar, and the
checks that need no allocation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import native
from ..errors import ProbeError
from ..limits import MAX_POSITIONS, check_count, check_seed, check_threads
from . import decode, models
from .attention import USER, resolve_attention, split_build
from .models import ModelShape


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
    user_allocs: bool = True  # a --kernel file's heap allocations counted (user_allocs.py)


MAX_CONTEXTS = 256
MAX_STEPS = 100_000  # --steps, --warmup, --pp, --tg: hours of single steps already


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
    if max(s.contexts) > MAX_POSITIONS:
        raise ProbeError(f"--context must be at most {MAX_POSITIONS} positions, got "
                         f"{max(s.contexts)}")
    for option, value, lo in (("--steps", s.steps, 1), ("--warmup", s.warmup, 0),
                              ("--pp", s.pp, 0), ("--tg", s.tg, 0)):
        check_count(value, option, lo, MAX_STEPS, "each is timed one by one")
    check_seed(s.seed)
    check_threads(s.threads)
    need = required_capacity(s)
    if s.capacity is not None:
        check_count(s.capacity, "--cache-size", 1, MAX_POSITIONS, "positions")
        if need > s.capacity:
            raise ProbeError(f"context {max(s.contexts)} (+{max(s.tg, 1)} new token(s)) is "
                             f"larger than the cache: needs {need} positions, --cache-size is "
                             f"{s.capacity}")


def check_labels(s: Settings) -> None:
    """Each attention graph asked for names one there is, and the --kernel file is one
    that can be built, before anything is built or allocated."""
    if s.kernel_path is not None:
        native.user_kernel_spec(Path(s.kernel_path))  # (a file of a kind it builds)
    for label in s.attention:
        if split_build(label)[0] != USER:  # (the user kernel is built by resolving it)
            resolve_attention(label, s.cache)
        elif s.kernel_path is None:
            raise ProbeError(f"attention {label!r} is the --kernel file: give --kernel PATH.c "
                             "or PATH.so")


def required_capacity(s: Settings) -> int:
    return max(max(s.contexts) + max(s.tg, 1), s.pp, 1)



def settings_from_options(*, model: str | None, custom: bool, dims: dict[str, int | None],
                          vocab: int | None, attention: str | None, ab: str | None,
                          kernel: str | None, context: str, chart: bool = False,
                          **fields) -> Settings:
    """The Settings of `probe profile`'s options, checked: the model shape (a preset, or
    --custom), the attention graph(s) (--attention, or the two of --ab; default fused,
    user with --kernel), the contexts. fields: the Settings fields taken as given
    (weights, cache, steps, ...). chart: a chart is asked for, which needs a sweep."""
    for option, value in (("--model", model), ("--attention", attention)):
        if value is not None and not value.strip():
            raise ProbeError(f"{option} is empty")
    if model is not None and custom:
        raise ProbeError("--model and --custom exclude each other")
    shape = models.resolve(model, custom, dims, vocab)
    if ab is not None and attention is not None:
        raise ProbeError("--ab A,B picks both attention graphs; drop --attention")
    if ab is not None:
        labels = tuple(x.strip() for x in ab.split(",") if x.strip())
        if len(labels) != 2:
            raise ProbeError("--ab wants two attention graphs, e.g. --ab decomposed,fused "
                             "or --ab 'fused@-O3,fused@-O1'")
    else:
        labels = (attention or (USER if kernel else "fused"),)
    s = Settings(shape=shape, attention=labels, ab=ab is not None,
                 contexts=parse_contexts(context), kernel_path=kernel, **fields)
    validate(s)
    if kernel is not None and not any(split_build(x)[0] == USER for x in labels):
        raise ProbeError("--kernel is attention 'user': use --attention user or --ab "
                         "fused,user")
    check_labels(s)
    if chart and len(s.contexts) < 2:
        raise ProbeError("--chart draws a context sweep: give two or more contexts, e.g. "
                         "--context 500:4000:500")
    return s
