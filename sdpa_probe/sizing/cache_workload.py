"""What a ring (or attention-sink) KV cache must serve: a sliding window, pinned sinks,
the largest prefill chunk and the context limit; which keys each query sees; and the
closed-form minimum size."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ProbeError
from ..limits import MAX_POSITIONS, check_count

MAX_HORIZON = 1 << 16


@dataclasses.dataclass(frozen=True)
class CacheWorkload:
    """Sliding window W, pinned sinks S, largest prefill chunk C, max context N (None: no
    limit)."""

    window: int
    chunk: int
    sink: int = 0
    context: int | None = None

    def validate(self) -> CacheWorkload:
        if self.window < 1:
            raise ProbeError(f"--window must be >= 1, got {self.window}")
        if self.chunk < 1:
            raise ProbeError(f"--chunk must be >= 1, got {self.chunk}")
        if self.sink < 0:
            raise ProbeError(f"--sink must be >= 0, got {self.sink}")
        if self.context is not None:
            check_count(self.context, "--context", 1, MAX_POSITIONS, "positions")
        if self.horizon > MAX_HORIZON:
            raise ProbeError(f"workload needs {self.horizon} simulated positions; the limit is "
                             f"{MAX_HORIZON} (sink + window + 2 x chunk)")
        return self

    @property
    def horizon(self) -> int:
        """Positions simulated. Beyond S + W + 2C + 2 every chunk start s has s >= S + W - 1
        and the ring has wrapped, so the slot map seen by a chunk is a translate of one already
        simulated: nothing new can go wrong (docs/cache-sizing.md)."""
        h = self.sink + self.window + 2 * self.chunk + 2
        return h if self.context is None else min(h, self.context)

    @property
    def id(self) -> str:
        head = f"sink{self.sink}" if self.sink else "ring"
        tail = f"-n{self.context}" if self.context is not None else ""
        return f"{head}-w{self.window}-c{self.chunk}{tail}"

    def describe(self) -> str:
        sinks = f"{self.sink} sinks" if self.sink else "no sinks"
        ctx = f"context {self.context}" if self.context is not None else "context unbounded"
        return f"window {self.window}, chunk {self.chunk}, {sinks}, {ctx}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def visible(self, qpos: np.ndarray, kpos: np.ndarray) -> np.ndarray:
        """[len(qpos), len(kpos)] bool: key position kpos visible to query qpos (kpos < 0 is an
        empty slot)."""
        delta = qpos[:, None] - kpos[None, :]
        return (kpos[None, :] >= 0) & (delta >= 0) & ((delta < self.window) |
                                                      (kpos[None, :] < self.sink))

    def needed(self, qpos: np.ndarray) -> np.ndarray:
        """How many keys query qpos sees with the full history."""
        return np.where(qpos - self.window + 1 <= self.sink, qpos + 1, self.sink + self.window)


def closed_form_minimum(window: int, sink: int, chunk: int, context: int | None) -> int:
    """The smallest exact cache: min(N, S + W + C - 1)."""
    m = sink + window + chunk - 1
    return m if context is None else min(context, m)
