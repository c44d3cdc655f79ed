"""Model shape presets for `probe profile` (random weights; nothing is downloaded)."""

from __future__ import annotations

import dataclasses

from ..errors import ProbeError


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    note: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def params(self) -> int:
        """Weight count (the LM head is tied with the embedding)."""
        per_layer = (2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
                     + 3 * self.hidden * self.ffn + 2 * self.hidden)
        return self.layers * per_layer + self.vocab * self.hidden + self.hidden

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, ModelShape] = {
    "smollm2-135m": ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, 1e-5),
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, 1000000.0, 1e-6),
    "llama-3.2-1b": ModelShape("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 500000.0, 1e-5),
    # OpenELM-270M varies heads (12..20), kv heads (3..5) and the FFN multiplier
    # (0.5..4.0) per layer; this is a uniform stand-in with the same width, depth,
    # head_dim, GQA ratio and about the same weight count.
    "openelm-270m": ModelShape("openelm-270m", 16, 1280, 16, 4, 64, 2816, 32000, 10000.0, 1e-6,
                               note="uniform approximation of OpenELM-270M's per-layer shapes"),
}

SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")
DEFAULT_CUSTOM_VOCAB = 32000


def validate(shape: ModelShape) -> ModelShape:
    for f in SHAPE_FIELDS:
        v = getattr(shape, f)
        if not isinstance(v, int) or v <= 0:
            raise ProbeError(f"--{f.replace('_', '-')} must be a positive integer, got {v}")
    if shape.heads % shape.kv_heads:
        raise ProbeError(f"heads ({shape.heads}) is not a multiple of kv heads "
                         f"({shape.kv_heads})")
    if shape.head_dim % 2:
        raise ProbeError(f"RoPE needs an even head_dim, got {shape.head_dim}")
    if max(shape.layers, shape.hidden, shape.heads, shape.head_dim, shape.ffn,
           shape.vocab) > 1 << 24:
        raise ProbeError("a shape dimension above 16M is not a decoder anyone runs")
    return shape


def resolve(model: str | None, custom: bool, overrides: dict[str, int | None],
            vocab: int | None = None) -> ModelShape:
    """The shape from a preset (with any overrides) or fully from --custom options."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if custom:
        missing = [f for f in SHAPE_FIELDS[:-1] if f not in given]
        if missing:
            raise ProbeError("--custom needs " + ", ".join(
                "--" + m.replace("_", "-") for m in missing))
        shape = ModelShape("custom", vocab=vocab or DEFAULT_CUSTOM_VOCAB, **given)
        return validate(shape)
    name = model or "llama-3.2-1b"
    if name not in PRESETS:
        raise ProbeError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)} "
                         "(or --custom)")
    shape = PRESETS[name]
    if vocab is not None:
        given["vocab"] = vocab
    if given:
        shape = dataclasses.replace(shape, name=f"{name}*", **given)
    return validate(shape)
