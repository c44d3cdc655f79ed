"""The bugs of docs/examples/mutants.py that few cases catch stay caught, one
catching case each (the whole study: `python docs/examples/mutants.py`,
docs/check.md; the unmutated online_sdpa.c passes the default suite in
tests/test_check_broken_kernels.py)."""

import importlib.util
import json

import pytest
from conftest import EXAMPLE_KERNEL

from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

ONLINE_KERNEL = EXAMPLE_KERNEL.with_name("online_sdpa.c")


def _study():
    spec = importlib.util.spec_from_file_location("mutants", EXAMPLE_KERNEL.with_name("mutants.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


study = _study()
DEFAULT = {c.id: c for c in suite("default")}

# (mutant, a default-suite case that catches it, reason fragment): the rare catches
EXPECT = [
    ("no-empty-block-skip", "masked-rows-h4gqa2-q4-kv389-d64-f32-rowsfar", "NaN in"),
    ("max-starts-at-zero", "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsfirst", "NaN in"),
    ("merge-no-empty-guard", "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsfirst", "NaN in"),
    ("causal-block-granular", "decode-h8gqa4-q4-kv100-d64-f32-causal96", "error above"),
    ("causal-decode-only", "decode-h8gqa4-q4-kv100-d64-f32-causal96", "error above"),
    ("mask-block-local", "decode-h16gqa8-q2-kv77-d64-f32-random", "error above"),
    ("v-quant-params-of-k", "decode-h8gqa4-q1-kv63-d64-i8", "error above"),
    ("alpha-no-log2e", "gqa-h8gqa1-q1-kv129-d64-f32", "error above"),
    ("split-drops-key", "gqa-h8gqa1-q1-kv129-d64-f32", "error above"),
    ("q-prescaled-in-f16", "logits-h8gqa4-q1-kv130-d128-f16-x10", "error above"),
    ("decode-causal-ignored", "decode-h8gqa4-q1-kv300-d64-f32-causal200", "NaN in"),
    ("decode-batch0-kv", "decode-b3-h8gqa4-q1-kv150-d64-f32-causal120", "error above"),
    ("decode-batch0-only", "decode-b3-h8gqa4-q1-kv150-d64-f16-causal120", "never written"),
    ("sym-scales-no-batch-stride", "pairs-b2-h8gqa4-q5-kv77-d20-i8-random-x10-sym-qf32-t2",
     "error above"),
    ("pv-fixed-point", "dtype-h8gqa4-q1-kv300-d64-i8-zero-tokens-v0.01", "error above"),
    ("pv-fixed-point", "dtype-h8gqa4-q1-kv300-d64-i8-zero-tokens-v0.01-sym", "error above"),
]


def test_every_mutant_applies_to_the_example():
    src = ONLINE_KERNEL.read_text()
    for name, (_what, edits) in study.MUTANTS.items():
        assert study.mutate(src, edits, name) != src, name


# (mutant, BLOCK, SPLITS, the catching case): bugs a large block hides from short caches
EXPECT_RETILED = [
    ("no-empty-block-skip", 512, 1, "window-h8gqa4-q1-kv2100-d64-f32-causal2099-window64"),
    ("no-empty-block-skip", 1024, 1, "window-h4gqa2-q3-kv2100-d64-i8-causal2097-window64"),
    ("mask-block-local", 512, 1, "window-h8gqa4-q1-kv2100-d64-f32-causal2099-window64"),
]


def _caught(tmp_path, src, bug, case_id, reason):
    path = tmp_path / f"{bug}.c"
    path.write_text(study.mutate(src, study.MUTANTS[bug][1], bug))
    case = DEFAULT.get(case_id)
    assert case is not None, case_id
    rec = run_one(NativeBackend(bug, load_user_kernel(path)), case, prepare_case(case))
    assert rec["status"] == "fail", rec
    assert reason in rec["reason"], rec["reason"]


@pytest.mark.parametrize("bug,case_id,reason", EXPECT, ids=[f"{e[0]}-{e[1]}" for e in EXPECT])
def test_online_mutant_is_caught(tmp_path, bug, case_id, reason):
    _caught(tmp_path, ONLINE_KERNEL.read_text(), bug, case_id, reason)


@pytest.mark.parametrize("bug,block,splits,case_id", EXPECT_RETILED,
                         ids=[f"{e[0]}-block{e[1]}-splits{e[2]}" for e in EXPECT_RETILED])
def test_retiled_mutant_is_caught(tmp_path, bug, block, splits, case_id):
    src = study.retile(ONLINE_KERNEL.read_text(), block, splits)
    assert f"#define BLOCK {block}\n" in src and f"#define SPLITS {splits}\n" in src
    _caught(tmp_path, src, bug, case_id, "")


def test_retiled_example_still_passes_the_long_window_cases(tmp_path):
    path = tmp_path / "online_512.c"
    path.write_text(study.retile(ONLINE_KERNEL.read_text(), 512, 1))
    backend = NativeBackend("online_512", load_user_kernel(path))
    for cid, case in DEFAULT.items():
        if "kv2100" in cid:
            rec = run_one(backend, case, prepare_case(case))
            assert rec["status"] == "pass", rec


def test_retile_rejects_a_block_of_zero():
    with pytest.raises(SystemExit, match="--block must be at least 1"):
        study.retile(ONLINE_KERNEL.read_text(), 0, None)


def test_study_rejects_an_unknown_mutant(capsys):
    with pytest.raises(SystemExit) as exc:
        study.main(["--only", "no-such-bug"])
    assert exc.value.code == 2
    assert "no-such-bug" in capsys.readouterr().err


def test_study_counts_catches(tmp_path):
    out = tmp_path / "m.json"
    args = ["--only", "no-empty-block-skip", "--suite", "smoke", "--json", str(out)]
    assert study.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["baseline"]["caught"] == 0 and doc["baseline"]["run"] > 0
    assert (doc["block"], doc["splits"]) == (32, 2)  # the example's own tiling
    assert doc["mutants"]["no-empty-block-skip"]["run"] == doc["baseline"]["run"]
