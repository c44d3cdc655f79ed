"""Kernels the fuzzing tests break on purpose: the threaded split-K kernel
(tests/kernels/split_sdpa.c) with one of its BUG_* macros defined, and the example
kernel with a bug that breaks exactly one metamorphic relation (each relation's
violator passes the oracle on its case and every other relation there)."""

from pathlib import Path

from conftest import EXAMPLE_KERNEL

SPLIT_KERNEL = Path(__file__).parent / "kernels" / "split_sdpa.c"
SRC = EXAMPLE_KERNEL.read_text()

SCORE = "          if (a->mask) s += a->mask[i * a->mask_row_stride + j];"
ROW_LOOP = "        float mx = -INFINITY;\n        for (int64_t j = 0; j < n; j++) {"
NORMALISE = "          for (int64_t d = 0; d < D; d++) acc[d] /= sum;"
MALLOCS = ("  float *p = malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));\n"
           "  float *acc = malloc((size_t)D * sizeof(float));")
FREES = "  free(p);\n  free(acc);\n  return SDPA_OK;\n}"
K_LOAD = "s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);"

# relation -> (its violator's (old, new) edits of the example kernel, the case spec
# the relation is checked on)
VIOLATORS = {
    # a window's fast path: the mask added only outside the row's first..last visible
    # key (inside, a window's mask is all zeros): keys in another order break it
    "permute-keys": ([(ROW_LOOP,
                       "        int64_t lo_ = 0, hi_ = n - 1;\n"
                       "        if (a->mask) {\n"
                       "          while (lo_ < n && a->mask[i * a->mask_row_stride + lo_] == "
                       "-INFINITY) lo_++;\n"
                       "          while (hi_ > lo_ && a->mask[i * a->mask_row_stride + hi_] == "
                       "-INFINITY) hi_--;\n"
                       "        }\n" + ROW_LOOP),
                      (SCORE, "          if (a->mask && (j < lo_ || j > hi_)) "
                              "s += a->mask[i * a->mask_row_stride + j];")],
                     "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=12,"
                     "head_dim=4,start_pos=8,mask=window:4"),
    # a tail loop that forgets the mask: the last key is never hidden
    "masked-key": ([(SCORE, "          if (a->mask && j != kv - 1) "
                            "s += a->mask[i * a->mask_row_stride + j];")],
                   "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=1,head_dim=4"),
    # a single-sequence fast path that drops the scale argument
    "batch-split": ([("const float scale = a->scale > 0 ?",
                      "const float scale = a->scale > 0 && a->batch > 1 ?")],
                    "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=9,head_dim=4,"
                    "scale=0.25"),
    # a rounding bias on rows of several keys (1e-7, within tolerance): not linear in V
    "v-scale": ([(NORMALISE, "          for (int64_t d = 0; d < D; d++) acc[d] = acc[d] / sum"
                             " + (sum > 1.0f ? 1e-7f : 0.0f);")],
                "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=9,head_dim=4"),
    # the softmax's sum rounded up by 4e-6 (within tolerance): one key's weight is not 1
    "one-key": ([(NORMALISE, "          sum *= 1.000004f;\n" + NORMALISE)],
                "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=9,head_dim=4"),
    # K converted once per K address (this thread's): a cache rewritten in place is stale
    "rewritten": ([(MALLOCS, MALLOCS + "\n"
                    "  static _Thread_local const void *kaddr_;\n"
                    "  static _Thread_local float *kc_;\n"
                    "  const int64_t kn_ = a->batch * kv * a->n_kv_heads * D;\n"
                    "  if (kaddr_ != a->k.data) {\n"
                    "    free(kc_);\n"
                    "    kc_ = malloc((size_t)(kn_ > 0 ? kn_ : 1) * sizeof(float));\n"
                    "    for (int64_t b = 0; b < a->batch; b++)\n"
                    "      for (int64_t j = 0; j < kv; j++)\n"
                    "        for (int64_t h = 0; h < a->n_kv_heads; h++)\n"
                    "          for (int64_t d = 0; d < D; d++)\n"
                    "            kc_[((b * kv + j) * a->n_kv_heads + h) * D + d] = "
                    "load(&a->k, b, j, h, d);\n"
                    "    kaddr_ = a->k.data;\n"
                    "  }"),
                   (K_LOAD, "s += load(&a->q, b, i, h, d) * "
                            "kc_[((b * kv + j) * a->n_kv_heads + hk) * D + d];")],
                  "family=fuzz,batch=2,n_heads=2,n_kv_heads=1,q_len=3,kv_len=9,head_dim=4"),
    # scores kept in a static buffer (a pause between writing and reading them, so two
    # callers overlap there): concurrent callers read each other's
    "concurrent": ([("#include <string.h>", "#include <string.h>\n#include <unistd.h>"),
                    (MALLOCS, "  static float p[1 << 12];\n"
                              "  if (kv > (1 << 12)) return SDPA_UNSUPPORTED;\n"
                              "  float *acc = malloc((size_t)D * sizeof(float));"),
                    ("  if (!p || !acc) {\n    free(p);\n", "  if (!acc) {\n"),
                    ("        memset(acc, 0, (size_t)D * sizeof(float));",
                     "        usleep(200);\n        memset(acc, 0, (size_t)D * sizeof(float));"),
                    (FREES, "  free(acc);\n  return SDPA_OK;\n}")],
                   "family=fuzz,n_heads=2,n_kv_heads=1,q_len=2,kv_len=9,head_dim=4"),
}


def violator(tmp_path: Path, relation: str) -> Path:
    """The example kernel broken for `relation` alone, written into tmp_path."""
    src = SRC
    for old, new in VIOLATORS[relation][0]:
        assert src.count(old) == 1, (relation, old)
        src = src.replace(old, new)
    path = tmp_path / f"breaks_{relation.replace('-', '_')}.c"
    path.write_text(src)
    return path


def split_kernel(tmp_path: Path, bug: str | None = None) -> Path:
    """The split-K kernel with BUG_<bug> defined (none: as written, correct)."""
    src = SPLIT_KERNEL.read_text()
    path = tmp_path / f"split_{(bug or 'ok').lower()}.c"
    path.write_text((f"#define BUG_{bug} 1\n" if bug else "") + src)
    return path
