"""The one-op OpenVINO models openvino_sdpa.py compiles: opset-13
ScaledDotProductAttention over [B, S, H, D] inputs, with the views a case stores its
tensors in expressed in the graph (the Parameter is the view's whole C-contiguous block,
shared with numpy, and Slice, Reshape and Transpose nodes cut the view out of it), and
grouped-query K / V heads broadcast by Unsqueeze, Broadcast and Reshape nodes (the op
itself only broadcasts a head count of 1). Everything here runs inside OpenVINO.

openvino is imported by the caller (openvino_sdpa.ov_modules) and passed in: importing
it starts threads, which the rest of the tool keeps out of its own process."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import native


@dataclasses.dataclass(frozen=True)
class Frame:
    """How a strided view lies in one C-contiguous block of memory: `block` is the
    block's shape, `extents` the view's extents along the block's axes (the view is
    block[:e0, :e1, ...]), reshaped to `sorted_shape` (size-1 axes in front) and
    transposed by `axes` back to the view's own axis order."""

    block: tuple[int, ...]
    extents: tuple[int, ...]
    sorted_shape: tuple[int, ...]
    axes: tuple[int, ...]

    @property
    def plain(self) -> bool:
        return self.block == self.extents and list(self.axes) == sorted(self.axes)


def _memory_end(a: np.ndarray) -> int:
    """The address one past the last byte of the memory a view was cut from."""
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    return int(native.byte_bounds(base)[1])


def frame(a: np.ndarray) -> tuple[np.ndarray, Frame] | None:
    """The C-contiguous block a view `a` is the leading corner of, as an array sharing
    its memory (what ov.Tensor can share: it takes C-contiguous arrays only), and the
    Frame that cuts `a` out of it; None when no such block exists (negative strides,
    strides that do not nest, a block that would run past the memory's end)."""
    if a.flags.c_contiguous:
        return a, Frame(a.shape, a.shape, a.shape, tuple(range(a.ndim)))
    item = a.itemsize
    ones = [i for i in range(a.ndim) if a.shape[i] == 1]
    inner = sorted((i for i in range(a.ndim) if a.shape[i] > 1), key=lambda i: -a.strides[i])
    strides = [a.strides[i] for i in inner]
    if not inner or any(s <= 0 for s in strides) or strides[-1] != item:
        return None
    block = [a.shape[inner[0]]]
    for outer, nxt in zip(strides, strides[1:], strict=False):
        if outer % nxt:
            return None
        block.append(outer // nxt)
    extents = [a.shape[i] for i in inner]
    if any(b < e for b, e in zip(block[1:], extents[1:], strict=True)):
        return None  # (overlapping rows)
    start = a.__array_interface__["data"][0]
    if start + math.prod(block) * item > _memory_end(a):
        return None
    c_strides, step = [], item
    for n in reversed(block):
        c_strides.insert(0, step)
        step *= n
    buf = np.lib.stride_tricks.as_strided(a, shape=tuple(block), strides=tuple(c_strides))
    order = ones + inner
    return buf, Frame(tuple(block), tuple(extents), tuple(a.shape[i] for i in order),
                      tuple(order.index(j) for j in range(a.ndim)))


def _const(ops, values, dtype=np.int64):
    return ops.constant(np.array(values, dtype=dtype))


def cut(ops, node, f: Frame, flipped: tuple[int, ...] = ()):
    """The view out of its block's Parameter: Slice, Reshape, Transpose, and a Slice with
    step -1 along the axes a view walks backwards, each only where the view needs it."""
    if flipped:
        n = len(flipped)
        return ops.slice(cut(ops, node, f), _const(ops, [-1] * n),
                         _const(ops, [np.iinfo(np.int64).min] * n), _const(ops, [-1] * n),
                         _const(ops, flipped))
    if f.plain:
        return node
    if f.block != f.extents:
        n = len(f.block)
        node = ops.slice(node, _const(ops, [0] * n), _const(ops, f.extents), _const(ops, [1] * n))
    node = ops.reshape(node, _const(ops, f.sorted_shape), special_zero=False)
    if list(f.axes) != sorted(f.axes):
        node = ops.transpose(node, _const(ops, f.axes))
    return node


def broadcast_heads(ops, node, shape: tuple[int, int, int, int], n_heads: int):
    """[B, S, Hkv, D] -> [B, S, H, D], query head h reading kv head h // (H / Hkv)."""
    b, s, hkv, d = shape
    if hkv == n_heads:
        return node
    node = ops.unsqueeze(node, _const(ops, [3]))
    node = ops.broadcast(node, _const(ops, [b, s, hkv, n_heads // hkv, d]))
    return ops.reshape(node, _const(ops, [b, s, n_heads, d]), special_zero=False)


BHSD = [0, 2, 1, 3]  # [B, S, H, D] <-> [B, H, S, D]


def sdpa_model(ov, ops, inputs, compute, n_heads: int, *, causal: bool, scale: float | None,
               mask=None):
    """The model: `inputs` is ((element type, Frame, flipped axes, [B, S, H, D] shape)
    for Q, K, V); `mask` (element type, Frame, flipped axes) an additive [Lq, Lkv] mask
    or None; every input
    converted to `compute` (an ov.Type) in the graph; causal is the op's own (top-left);
    scale None is the op's default (1/sqrt(D)). Parameters in the order Q, K, V, mask."""
    params, nodes = [], []
    for i, (etype, f, flipped, shape) in enumerate(inputs):
        p = ops.parameter(list(f.block), etype)
        params.append(p)
        x = cut(ops, p, f, flipped)
        if etype != compute:
            x = ops.convert(x, compute)
        if i:
            x = broadcast_heads(ops, x, shape, n_heads)
        nodes.append(ops.transpose(x, _const(ops, BHSD)))
    args = list(nodes)
    if mask is not None:
        etype, f, flipped = mask
        p = ops.parameter(list(f.block), etype)
        params.append(p)
        m = cut(ops, p, f, flipped)
        args.append(ops.convert(m, compute) if etype != compute else m)
    elif scale is not None:
        # (the scale is the op's 5th input: a zero mask stands in the 4th)
        args.append(ops.convert(ops.constant(np.zeros((), np.float32)), compute))
    if scale is not None:
        args.append(ops.convert(ops.constant(np.float32(scale)), compute))
    o = ops.scaled_dot_product_attention(*args, causal=causal)
    return ov.Model([ops.transpose(o, _const(ops, BHSD))], params, "sdpa")
