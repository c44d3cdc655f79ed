"""Kernel sources the `probe check` tests break on purpose: the example kernel's source, the
named one-line bugs in it, and the ways the tests run such a copy (a tmp file, `probe check`
in worker processes)."""

import json

from conftest import EXAMPLE_KERNEL
from typer.testing import CliRunner

from sdpa_probe.cli import app

runner = CliRunner()


SRC = EXAMPLE_KERNEL.read_text()


BUGS = {
    "ignore-start-pos": (
        "if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;",
        "if (a->is_causal && i + 1 < n) n = i + 1;"),
    "gqa-modulo": ("const int64_t hk = h / group;", "const int64_t hk = h % a->n_kv_heads;"),
    # the softmax's max over the raw scores, hidden keys' too (the mask added after it, a
    # row without a visible key tracked apart): with large logits a hidden key's score
    # sets the max and the visible keys' weights underflow to zero
    "max-over-hidden-keys": (
        "          s *= scale;\n          if (a->mask) s += a->mask[i * a->mask_row_stride + j];\n"
        "          p[j] = s;\n"
        "          if (s > mx || s != s) mx = s; /* a NaN sticks: the row is NaN, not unseen */",
        "          s *= scale;\n          if (s > mx || s != s) mx = s;\n"
        "          if (a->mask) s += a->mask[i * a->mask_row_stride + j];\n"
        "          if (s != -INFINITY) seen_ = 1;\n          p[j] = s;"),
    # the scores' scratch never freed: every call keeps kv_len floats
    "leak-scores": ("  free(p);\n  free(acc);\n  return SDPA_OK;\n}",
                    "  free(acc);\n  return SDPA_OK;\n}"),
    # the kv head by a shift of floor(log2(group)): right for every power-of-two group
    "gqa-shift": ("const int64_t hk = h / group;",
                  "const int64_t hk = h >> (63 - __builtin_clzll((unsigned long long)group));"),
    # a group's query rows in a 16-row tile: rows past the 16th reuse the last one's query
    "group-tile-16": ("s += load(&a->q, b, i, h, d)",
                      "s += load(&a->q, b, i, h % group < 16 ? h : hk * group + 15, d)"),
    # one dtype assumed for the call: Q read as K's (a float query over an F16 cache)
    "q-read-as-kv-dtype": ("if (a->batch == 0 || a->q_len == 0) return SDPA_OK;",
                           "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n"
                           "  sdpa_args a_ = *a;\n  if (a->kv_len > 0) a_.q.dtype = a->k.dtype;\n"
                           "  a = &a_;"),
    # Q rounded to the cache's F16 for the dot products (F16 x F16 products)
    "q-rounded-to-kv-dtype": (
        "s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);",
        "s += (a->k.dtype == SDPA_F16 ? f16_to_f32(f32_to_f16(load(&a->q, b, i, h, d)))"
        " : load(&a->q, b, i, h, d)) * load(&a->k, b, j, hk, d);"),
    # a given start_pos taken for a causal edge although is_causal is off
    "start-pos-implies-causal": (
        "if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;",
        "if ((a->is_causal || a->start_pos > 0) && a->start_pos + i + 1 < n)"
        " n = a->start_pos + i + 1;"),
    "drop-partial-block": ("int64_t n = kv; ", "int64_t n = kv >= 64 ? kv / 64 * 64 : kv; "),
    "f16-accumulation": (
        "sum += w;",
        "sum = a->k.dtype == SDPA_F16 ? f16_to_f32(f32_to_f16(sum + w)) : sum + w;"),
    "last-head-unwritten": ("for (int64_t h = 0; h < a->n_heads; h++) {",
                            "for (int64_t h = 0; h < a->n_heads - (a->n_heads > 1); h++) {"),
    "write-past-end": ("for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);",
                       "for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);\n"
                       "        if (b == a->batch - 1 && i == a->q_len - 1 && h == a->n_heads - 1)"
                       " store(&a->out, b, i, h, D, 0.0f);"),
    "nan-masked-rows": ("if (mx != -INFINITY) {", "{"),
    "no-write": ("if (a->batch == 0 || a->q_len == 0) return SDPA_OK;", "return SDPA_OK;"),
    "over-read": ("int64_t n = kv; ", "int64_t n = kv + !a->is_causal; "),
    # head_dim assumed innermost (unit stride): wrong on a transposed V cache
    "unit-dim-stride": ("+ d * t->stride[3];\n  switch", "+ d;\n  switch"),
    # kv_len taken for the mask's row stride (a slice of a [max_seq, max_seq] mask)
    "mask-stride-is-kv": ("if (a->mask) s += a->mask[i * a->mask_row_stride + j];",
                          "if (a->mask) s += a->mask[i * kv + j];"),
    # V read with K's strides (one cache layout assumed for both)
    "v-with-k-strides": ("acc[d] += w * load(&a->v, b, j, hk, d);",
                         "{ sdpa_tensor v_ = a->v;"
                         " memcpy(v_.stride, a->k.stride, sizeof v_.stride);"
                         " acc[d] += w * load(&v_, b, j, hk, d); }"),
    # int8 scales / zero points of batch 0 for every batch entry
    "int8-batch-params": (
        "int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];",
        "int64_t qo = s * t->qstride[1] + h * t->qstride[2];"),
    # F16 subnormals flushed to zero: outputs below 6.1e-5, or V read so
    "f16-flush-out": ("return (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));",
                      "return (uint16_t)sign;"),
    "f16-flush-in": ("float f = ldexpf((float)man, -24); /* zero or subnormal */",
                     "float f = 0.0f * (float)man; /* zero or subnormal */"),
    # Q pre-scaled in place (one multiply fewer a score; the loop is added by the
    # fixture): the output is right, the caller's Q is not
    "q-scaled-in-place": ("s *= scale;", "if (a->q.dtype != SDPA_F32) s *= scale;"),
    # the rounding mode changed for the kernel and left so (the caller's arithmetic after
    # the call rounds up); the output itself is within tolerance
    "fp-rounding-left-up": ("int st = sdpa_validate_args(a);",
                            "fesetround(FE_UPWARD);\n  int st = sdpa_validate_args(a);"),
    # the running max blind to NaN (s > mx is false for it): a row whose every score is
    # NaN (a NaN in its query) looks unseen and gives zeros, hiding the corruption
    "nan-row-unseen": ("if (s > mx || s != s) mx = s;", "if (s > mx) mx = s;"),
    # causal as an additive -inf over every slot's score: stale cache slots reach P.V
    "additive-causal": (
        "if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;",
        "const int64_t lim_ = a->is_causal && a->start_pos + i + 1 < n"
        " ? a->start_pos + i + 1 : n;"),
}


def write_variant(tmp_path, name, inject):
    p = tmp_path / f"{name}.c"
    p.write_text(SRC.replace("if (a->batch == 0 || a->q_len == 0) return SDPA_OK;",
                             "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n  " + inject))
    return p


def cli_records(tmp_path, name: str, src: str, *filters: str, args: tuple = (),
                 exit_code: int = 1) -> dict:
    """`probe check --kernel` on a broken kernel source (in worker processes, so a crash
    is a record), the given -k filters and other args; its records by case id (the exit
    code asserted: 1, some check failed, unless told)."""
    path = tmp_path / name
    path.write_text(src)
    out = tmp_path / "r.json"
    argv = ["check", "--kernel", str(path), "--json", str(out), *args]
    for f in filters:
        argv += ["-k", f]
    res = runner.invoke(app, argv)
    assert res.exit_code == exit_code, res.output
    return {r["case"]: r for r in json.loads(out.read_text())["records"]}
