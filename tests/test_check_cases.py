"""The case matrix: the pairs family's coverage, random slices and their ids, the cases a
Case refuses, and bugs each caught only by the family of cases written for them (head
groups, head_dims, empty caches, long contexts, explicit scales, one dtype's path)."""

import pytest
from kernels_for_tests import BUGS, SRC, cli_records

from sdpa_probe.cases import Case, suite
from sdpa_probe.inputs import materialise
from sdpa_probe.pairwise import missing_pairs


def test_pairs_family_covers_every_pair_of_code_path_factors():
    """The `pairs` family alone meets every pair of values of two factors a kernel
    branches on (decode / prefill, dtype, GQA / MHA / MQA, threads, batch, stale slots,
    a mask, a strided layout, a head_dim tail, large logits, an F32 query over a
    low-precision cache, int8 without zero points), so does the default suite; the
    hand-written families alone miss dozens of such pairs, and four of the holes had let
    a bug pass every case (a decode path that reads the whole cache past a causal edge,
    one that serves batch 0 alone, a threaded F16 prefill, symmetric int8's scales read
    without their batch stride)."""
    default = [c for c in suite("default") if not c.invalid]
    pairs = [c for c in default if c.family == "pairs"]
    assert 0 < len(pairs) <= 16
    assert missing_pairs(pairs) == [] and missing_pairs(default) == []
    assert len(missing_pairs([c for c in default if c.family != "pairs"])) > 0


def test_a_case_cannot_ask_for_a_small_stack_it_would_not_get():
    """run_one takes the two-caller and reuse paths before the small-stack one, so a
    case combining them would silently run on the default stack: refused instead."""
    for extra in ({"reuse": True}, {"callers": 2}):
        with pytest.raises(ValueError, match="stack_kib"):
            Case("bug", kv_len=20, stack_kib=256, **extra)
    assert Case("bug", kv_len=20, stack_kib=256).stack_kib == 256


def test_random_slices_are_stable_valid_and_found_again_by_id():
    import dataclasses

    from sdpa_probe.cases import RANDOM_CASES, all_cases, find_case, random_cases

    a, b = random_cases(5), random_cases(5)
    assert [c.id for c in a] == [c.id for c in b] and len(a) == RANDOM_CASES
    assert {c.id for c in a}.isdisjoint({c.id for c in random_cases(6)})
    assert len({c.id for c in a}) == len(a)
    for c in a:
        assert find_case(c.id) == c
        materialise(c)  # (every drawn combination is one the inputs can be made for)
    assert len({(c.dtype, c.layout) for c in a}) > 8  # a spread, not one corner
    assert find_case("random-h8gqa4-q1-kv9-d64-f32-s999999") is None
    # a fixed case under --seed, and ids no suite has (a cache-sizing record's)
    fixed = all_cases()
    first = next(iter(fixed.values()))
    assert find_case(first.id + "-s7", fixed) == dataclasses.replace(first, seed=7)
    assert find_case("ring-w3-s2-c4-minimum", fixed) is None


def test_a_shift_for_the_kv_head_is_caught_only_by_groups_not_a_power_of_two(tmp_path):
    """h >> floor(log2(group)) maps every head right when the group is 1, 2, 4, 8 or 16,
    as every GQA case was before real models' groups; Qwen2.5's 7, SmolLM2's 3 and Falcon-7B's 71
    catch it."""
    recs = cli_records(tmp_path, "shift.c", SRC.replace(*BUGS["gqa-shift"]), "gqa-")
    bad = {c for c, r in recs.items() if r["status"] != "pass"}
    assert bad == {c for c in recs if any(g in c for g in ("gqa7", "gqa3", "h71mqa"))}, recs
    assert len(bad) == 5


def test_an_unsigned_loop_bound_is_caught_by_a_head_dim_under_the_unroll(tmp_path):
    """An unrolled dot product bounded by `(size_t)D - 3`: right for every head_dim >= 3,
    a read far past the row (a crash, in its worker) for head_dim 1."""
    dot = "for (int64_t d = 0; d < D; d++) s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);"
    term = "load(&a->q, b, i, h, d + {0}) * load(&a->k, b, j, hk, d + {0})"
    unrolled = ("size_t d = 0;\n          for (; d < (size_t)D - 3; d += 4) s += "
                + " + ".join(term.format(u) for u in range(4))
                + ";\n          for (; d < (size_t)D; d++) s += " + term.format(0) + ";")
    recs = cli_records(tmp_path, "unsigned.c", SRC.replace(dot, unrolled), "hdim-")
    bad = {c: r["status"] for c, r in recs.items() if r["status"] != "pass"}
    assert list(bad) == ["hdim-h4gqa2-q2-kv70-d1-f32"] and bad[list(bad)[0]] in ("crash", "fail")


def test_fixed_row_buffer_is_caught_by_head_dim_512(tmp_path):
    """The example with its accumulator a `float acc[256]` on the stack (head_dim <= 256
    assumed): right on every other head_dim, and the d512 case writes past it."""
    old = "float *acc = malloc((size_t)D * sizeof(float));"
    src = SRC.replace(old, "float acc_[256];\n  float *acc = acc_;")
    src = src.replace("free(acc);", "")
    assert src.count("acc_") == 2
    recs = cli_records(tmp_path, "acc256.c", src, "hdim-")
    assert recs["hdim-h4gqa2-q2-kv70-d512-f32"]["status"] in ("crash", "fail"), recs
    assert all(r["status"] == "pass" for c, r in recs.items() if "-d512-" not in c), recs


def test_a_hoisted_first_key_is_caught_by_an_empty_cache(tmp_path):
    """The example reading key 0 before its loops (a hoisted load): right whenever there
    is a key, a NULL dereference with kv_len 0 (K and V are NULL then)."""
    old = "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;"
    src = SRC.replace(old, old + "\n  volatile float k0_ = load(&a->k, 0, 0, 0, 0);\n  (void)k0_;")
    recs = cli_records(tmp_path, "first_key.c", src, "masked-rows-", "decode-h8gqa4-q1-kv1-")
    assert recs["masked-rows-h4gqa2-q2-kv0-d64-f32"]["status"] == "crash", recs
    assert all(r["status"] == "pass" for c, r in recs.items() if "-kv0-" not in c), recs


@pytest.mark.slow  # (70,001-key cases)
@pytest.mark.parametrize("old,new,dtype", [pytest.param(
    "int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];",
    "int64_t qo = b * t->qstride[0] + (int16_t)s * t->qstride[1] + h * t->qstride[2];", "i8",
    id="i8"), pytest.param(
    "case SDPA_F16: return f16_to_f32(((const uint16_t *)t->data)[off]);",
    "case SDPA_F16: return f16_to_f32(((const uint16_t *)t->data)[b * t->stride[0] + "
    "(uint16_t)s * t->stride[1] + h * t->stride[2] + d * t->stride[3]]);", "f16", id="f16")])
def test_a_16_bit_token_index_is_caught_past_65536_keys(tmp_path, old, new, dtype):
    """A token index kept in 16 bits on one dtype's path alone (int8's scales, F16's
    values): every case up to 2,049 keys passes; the `long` cases, 70,001 keys, read
    the wrong tokens (or before the tensor). The F16 one also needs the F16 atol not to
    grow with kv_len as the accumulation's part does: grown, it was 1.3e-2 there and
    this mutant's 8.2e-3 error passed."""
    assert SRC.count(old) == 1
    recs = cli_records(tmp_path, f"short_index_{dtype}.c", SRC.replace(old, new),
                        "long-", f"dtype-h8gqa4-q1-kv129-d64-{dtype}", args=("--dtype", dtype))
    bad = {c for c, r in recs.items() if r["status"] != "pass"}
    assert bad and all(c.startswith("long-") for c in bad), recs


def test_an_explicit_scale_ignored_off_the_f32_path_is_caught(tmp_path):
    """The explicit scale honoured on the F32 path alone (the F16 / BF16 / int8 paths
    falling back to 1/sqrt(head_dim)): while the one explicit-scale case was F32, this
    kernel passed all 166 cases."""
    old = "const float scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D);"
    assert SRC.count(old) == 1
    recs = cli_records(tmp_path, "scale_f32_only.c", SRC.replace(old, (
        "const float scale = a->scale > 0 && a->k.dtype == SDPA_F32 ? a->scale : "
        "1.0f / sqrtf((float)D);")), "logits-")
    bad = {c for c, r in recs.items() if r["status"] != "pass"}
    assert bad == {c for c in recs if "scale" in c and not c.endswith("-f32-scale0.5")}, recs
    assert len(bad) == 5


# One dtype's path alone wrong, where the suite had the feature in F32 (and
# int8) only; each passed every case before the cases it is caught by were added
def _v_with_k_strides(dt: str) -> tuple:
    """V read with K's strides on one dtype's path (one stride set per call assumed)."""
    return ([("for (int64_t d = 0; d < D; d++) acc[d] += w * load(&a->v, b, j, hk, d);",
              "for (int64_t d = 0; d < D; d++) acc[d] += w * load(&v_, b, j, hk, d);"),
             ("if (a->batch == 0 || a->q_len == 0) return SDPA_OK;",
              "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n  sdpa_tensor v_ = a->v;\n"
              f"  if (a->v.dtype == SDPA_{dt.upper()}) memcpy(v_.stride, a->k.stride, "
              "sizeof v_.stride);")],
            "layout-", {f"layout-h8gqa4-q1-kv200-d64-{dt}-vdmajor"}
            | ({"layout-h8gqa4-q1-kv200-d64-f16-causal150-vdmajor"} if dt == "f16" else set()))


def _static_scratch(dt: str) -> tuple:
    """One static score buffer for every caller, on one dtype's path. A caller pauses
    0.2 ms between writing its scores and reading them back, as a longer kernel's work
    would: two callers started together then overlap there on every round, where
    without it the race showed in some runs only."""
    return ([("float *p = malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));",
              f"static float p_[1 << 16];\n  const int st_ = a->k.dtype == SDPA_{dt.upper()} && "
              "kv <= (1 << 16);\n  float *p = st_ ? p_ : "
              "malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));"),
             ("free(p);", "if (!st_) free(p);"),
             ("#include <math.h>", "#define _POSIX_C_SOURCE 200809L\n#include <math.h>\n"
              "#include <time.h>"),
             ("memset(acc, 0, (size_t)D * sizeof(float));",
              "if (st_) { struct timespec ts_ = {0, 200000}; nanosleep(&ts_, NULL); }\n"
              "        memset(acc, 0, (size_t)D * sizeof(float));")],
            "threads-", {f"threads-h8gqa4-q1-kv1030-d64-{dt}-c2"})


PATH_ALONE_MUTANTS = {
    "vstrides_f16": _v_with_k_strides("f16"),
    "static_f16": _static_scratch("f16"),
    "boolmask_f16": ([("if (a->mask) s += a->mask[i * a->mask_row_stride + j];",
                       "if (a->mask) { const float m_ = a->mask[i * a->mask_row_stride + j];\n"
                       "  s += (a->k.dtype == SDPA_F16 || a->k.dtype == SDPA_BF16) && "
                       "m_ != -INFINITY ? 0.0f : m_; }")],
                     "mask-", {"mask-h8gqa4-q1-kv300-d64-f16-random",
                               "mask-h4gqa2-q6-kv140-d64-f16-causal134-random",
                               "mask-h4gqa2-q2-kv140-d64-bf16-random"}),
    "nomax_i8": ([("float w = expf(p[j] - mx);",
                   "float w = expf(p[j] - (a->k.dtype == SDPA_I8 ? 0.0f : mx));")],
                 "mask-", {"mask-h8gqa4-q1-kv300-d64-i8-random-x100"}),
    "pos_causal_i8": ([("if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;",
                        "if ((a->is_causal || (a->k.dtype == SDPA_I8 && a->start_pos > 0)) && "
                        "a->start_pos + i + 1 < n) n = a->start_pos + i + 1;")],
                      "causal-", {"causal-h8gqa4-q2-kv70-d64-i8-pos30"}),
    "unit_dim_stride_bf16": ([("case SDPA_BF16: return bf16_to_f32(((const uint16_t *)"
                               "t->data)[off]);",
                               "case SDPA_BF16: return bf16_to_f32(((const uint16_t *)t->data)"
                               "[off - d * t->stride[3] + d]);")],
                             "layout-", {"layout-h8gqa4-q1-kv200-d64-bf16-dmajor",
                                         "layout-h8gqa4-q1-kv200-d64-bf16-vdmajor",
                                         "layout-h8gqa4-q1-kv90-d64-bf16-reversed"}),
    # the BF16 path's own offsets, strides and scratch: each passed all 200 cases before
    # the three BF16 cases and is caught by one of them
    "int32_offsets_bf16": ([("case SDPA_BF16: return bf16_to_f32(((const uint16_t *)"
                             "t->data)[off]);",
                             "case SDPA_BF16: return bf16_to_f32(((const uint16_t *)t->data)"
                             "[(int32_t)off]);")],
                           "layout-", {"layout-b2-h4gqa2-q2-kv70-d64-bf16-far"}),
    "vstrides_bf16": _v_with_k_strides("bf16"),
    "static_bf16": _static_scratch("bf16"),
    "kv0_i8": ([("if (a->batch == 0 || a->q_len == 0) return SDPA_OK;",
                 "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n  if (a->k.dtype == "
                 "SDPA_I8) { volatile float s0_ = a->k.scale[0]; (void)s0_; }")],
               "-kv0-", {"masked-rows-h8gqa4-q1-kv0-d64-i8",
                         "crossings-h4gqa2-q2-kv0-d64-i8-stack256k"}),
}


@pytest.mark.parametrize("name", list(PATH_ALONE_MUTANTS))
def test_a_bug_on_one_dtypes_path_alone_is_caught(tmp_path, name):
    """F16 V's strides taken from K (llama.cpp's transposed F16 V cache), a mask read
    as hidden / visible on the F16 / BF16 path, int8's softmax without its max, static
    scratch on the F16 path, int8's first scale read before the loop (an empty cache's
    NULL), and on the BF16 path 32-bit offsets, V read with K's strides and static
    scratch: each is caught by the cases that run that path (the kv0 one since the
    harness sets an empty cache's dtype)."""
    edits, family, expected = PATH_ALONE_MUTANTS[name]
    src = SRC
    for old, new in edits:
        assert src.count(old) == (2 if old == "free(p);" else 1), old
        src = src.replace(old, new)
    # (one worker: the two-caller case's threads then have both cores to race on)
    recs = cli_records(tmp_path, f"{name}.c", src, family, args=("-j", "1"))
    assert {c for c, r in recs.items() if r["status"] not in ("pass", "unsupported")} == expected
