"""Golden data: the stored set is intact and agrees with the live oracle; regen is
byte-deterministic and refuses silent reference changes; verify names every
corrupted, truncated or missing file; diff reports drift; check --golden makes no
oracle call."""

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import sdpa_probe.backends as backends
import sdpa_probe.reference as reference
from sdpa_probe import golden, native
from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.cli import app
from sdpa_probe.cli.output import dumps
from sdpa_probe.oracle import prepare_case

runner = CliRunner()
ENV = {"COLUMNS": "400"}  # no wrapping: messages are matched whole
GOLDEN = golden.default_dir()


def invoke(*argv):
    res = runner.invoke(app, [str(a) for a in argv], env=ENV)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def _small_ids() -> list[str]:
    """A few cheap stored cases: a fully-masked-rows f32 case, an f16 case, a decode case."""
    cases = suite("default")
    picks = [next(c for c in cases if c.family == "masked-rows" and c.dtype == "f32"),
             next(c for c in cases if c.dtype == "f16" and c.kv_len < 1000),
             next(c for c in cases if c.family == "decode" and c.dtype == "f32")]
    return [c.id for c in picks]


# regenerating the small set's own cases (without it, a regen of its folder would add
# every other default case too, and verify them all)
_SMALL = ("--cases", ",".join(_small_ids()))


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    """A golden set of three cases, made once; tests copy it before changing it."""
    root = tmp_path_factory.mktemp("golden") / "base"
    res = invoke("golden", "regen", "--dir", root, "--cases", ",".join(_small_ids()))
    assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def gset(small_set, tmp_path):
    root = tmp_path / "g"
    shutil.copytree(small_set, root)
    return root


def _files(root):
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _manifest(root):
    return json.loads((root / "manifest.json").read_text())


# ---- the checked-in set ---------------------------------------------------------------

def test_stored_set_is_intact():
    res = golden.verify(GOLDEN)
    assert res.ok, [p.message for p in res.problems]
    man = res.manifest
    assert man["semantics"]["fully_masked_rows"] == "zeros"
    assert {"torch", "numpy"} <= set(man["versions"])
    size = sum(p.stat().st_size for p in GOLDEN.iterdir())
    assert size < 5 * 2**20


def test_stored_set_covers_the_default_suite():
    stored = {e["id"] for e in golden.read_manifest(GOLDEN)[0]["cases"]}
    missing = [c.id for c in golden.reference_suite("default") if c.id not in stored]
    assert not missing, (f"default-suite cases without golden data: {missing}; "
                         f"run `probe golden regen` and review the result")
    families = {c.family for c in golden.reference_suite("default")}
    assert families <= {e["params"]["family"] for e in golden.read_manifest(GOLDEN)[0]["cases"]}


@pytest.fixture
def one_thread():
    """As in a check worker (and in regen): torch's own error depends on the thread count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_stored_references_agree_with_the_live_oracle(one_thread):
    """Every stored case: the live float64 oracle gives the stored reference (to float64
    rounding), and torch's own error moves no case's atol (the regen criterion)."""
    st = golden.store(GOLDEN)
    # torch_err is checked where torch dispatches to the ISA the data was made under
    comparable = golden.torch_err_comparable(golden.read_manifest(GOLDEN)[0],
                                             {"versions": golden.versions()})
    for cid, ent in st.entries.items():
        case = Case(**ent["params"])
        live = prepare_case(case)
        ref, terr = st.reference(case, live.data)
        np.testing.assert_allclose(ref, live.ref, rtol=1e-12, atol=1e-14, err_msg=cid)
        row = golden.compare(case, ref, terr, ent["inputs_sha256"], live.ref, live.torch_err,
                             golden.inputs_digest(live.data), torch_comparable=comparable)
        assert row["status"] in ("same", "within"), (cid, row["reasons"])


def test_golden_prepare_makes_no_oracle_or_torch_call(monkeypatch):
    case = next(c for c in suite("default") if c.mask == "rows:first")
    live = prepare_case(case)

    def boom(*a, **k):
        raise AssertionError("the oracle or torch SDPA was called on the golden path")

    monkeypatch.setattr(reference, "sdpa_reference", boom)
    monkeypatch.setattr(backends, "torch_error", boom)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", boom)
    prep = prepare_case(case, golden=GOLDEN)
    # the stored data, not the live oracle: equal to float64 rounding (the oracle's BLAS
    # rounds differently on another CPU), and torch_err the stored value
    np.testing.assert_allclose(prep.ref, live.ref, rtol=1e-12, atol=1e-14)
    stored = golden.store(GOLDEN).entries[case.id]
    with np.load(GOLDEN / stored["file"]) as z:
        np.testing.assert_array_equal(prep.ref, z["ref"])
        assert prep.torch_err == float(z["torch_err"])
    assert np.all(prep.ref[:, 0] == 0)                 # the fully masked row


def test_npz_files_are_plain_numpy():
    ent = golden.read_manifest(GOLDEN)[0]["cases"][0]
    with np.load(GOLDEN / ent["file"]) as z:
        assert z["ref"].dtype == np.float64 and list(z["ref"].shape) == ent["shape"]
        assert z["torch_err"].shape == ()


# ---- regen ------------------------------------------------------------------------------

def test_regen_twice_is_byte_identical(small_set, tmp_path):
    other = tmp_path / "again"
    res = invoke("golden", "regen", "--dir", other, "--cases", ",".join(_small_ids()))
    assert res.exit_code == 0, res.output
    assert _files(other) == _files(small_set)
    before = {p.name: p.stat().st_mtime_ns for p in other.iterdir()}
    res = invoke("golden", "regen", "--dir", other, "--cases", ",".join(_small_ids()))
    assert res.exit_code == 0 and "3 same" in res.output, res.output
    assert {p.name: p.stat().st_mtime_ns for p in other.iterdir()} == before  # untouched


def test_npz_bytes_do_not_depend_on_time_or_order():
    a = {"ref": np.arange(6.0).reshape(2, 3), "torch_err": np.float64(np.nan)}
    b = dict(reversed(list(a.items())))
    assert golden.npz_bytes(a) == golden.npz_bytes(b)


def _nan_rows(monkeypatch):
    """The oracle as torch < 2.5 behaved: NaN, not zeros, for rows that see no key."""
    orig = reference.sdpa_reference

    def old(q, k, v, **kw):
        out = orig(q, k, v, **kw)
        bias = reference.bias_matrix(q.shape[1], k.shape[1], mask=kw.get("mask"),
                                     is_causal=kw.get("is_causal", False),
                                     start_pos=kw.get("start_pos", 0))
        out[:, torch.isneginf(bias).all(dim=-1)] = float("nan")
        return out

    monkeypatch.setattr(reference, "sdpa_reference", old)


def _scaled(monkeypatch, factor):
    orig = reference.sdpa_reference
    monkeypatch.setattr(reference, "sdpa_reference", lambda *a, **k: orig(*a, **k) * factor)


def test_regen_refuses_a_changed_reference(gset, monkeypatch):
    masked = _small_ids()[0]
    before = _files(gset)
    _nan_rows(monkeypatch)
    res = invoke("golden", "regen", "--dir", gset, *_SMALL)
    assert res.exit_code == 1, res.output
    assert "refusing to overwrite" in res.output
    assert f"changed  {masked}" in res.output
    assert "NaN/Inf in" in res.output and "zeros in the old: fully masked rows" in res.output
    assert "fully_masked_rows was 'zeros', the oracle now gives 'nan'" in res.output
    assert _files(gset) == before                       # nothing written
    res = invoke("golden", "regen", "--dir", gset, *_SMALL, "--accept", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["written"] and doc["accepted"]
    assert _manifest(gset)["semantics"]["fully_masked_rows"] == "nan"


def test_regen_reports_numeric_drift_beyond_tolerance(gset, monkeypatch):
    _scaled(monkeypatch, 1 + 1e-3)
    res = invoke("golden", "regen", "--dir", gset, *_SMALL, "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert not doc["written"]
    changed = [r for r in doc["rows"] if r["status"] == "changed"]
    assert {r["case"] for r in changed} == set(_small_ids())
    assert all(r["tol_fraction"] > golden.DRIFT_FRACTION for r in changed)
    assert any("moved by more than" in why for r in changed for why in r["reasons"])


def test_regen_writes_drift_within_tolerance(gset, monkeypatch):
    _scaled(monkeypatch, 1 + 1e-13)
    res = invoke("golden", "regen", "--dir", gset, *_SMALL)
    assert res.exit_code == 0, res.output
    assert "within" in res.output
    assert golden.verify(gset).ok


def test_regen_removing_cases_needs_accept(gset):
    # the small set is not a suite: a full regen of the smoke suite would drop its cases
    res = invoke("golden", "regen", "--dir", gset, "--suite", "smoke", "--dry-run")
    assert res.exit_code == 1 and "would be removed" in res.output, res.output


def test_partial_regen_refuses_to_mix_machines(gset):
    """torch_err depends on the ISA / CPU and the manifest records one of each: keeping
    cases made elsewhere beside fresh ones would pass their torch_err off as this
    machine's. Regenerating every stored case is fine."""
    man = _manifest(gset)
    man["versions"]["torch_cpu"] = "SOME_OTHER_ISA"
    (gset / "manifest.json").write_text(json.dumps(man))
    before = _files(gset)
    ids = _small_ids()
    res = invoke("golden", "regen", "--dir", gset, "--cases", ids[0])
    assert res.exit_code == 2, res.output
    assert "2 stored case(s) this regen would keep were made under torch_cpu SOME_OTHER_ISA" \
        in res.output
    assert _files(gset) == before
    res = invoke("golden", "regen", "--dir", gset, "--cases", ",".join(ids))
    assert res.exit_code == 0, res.output
    assert _manifest(gset)["versions"] == golden.versions()
    assert golden.verify(gset).ok


def test_regen_usage_errors(tmp_path):
    res = invoke("golden", "regen", "--dir", tmp_path, "--cases", "no-such-case-id")
    assert res.exit_code == 2 and "no case id matches" in res.output
    res = invoke("golden", "regen", "--dir", tmp_path, "--suite", "nosuch")
    assert res.exit_code == 2 and "unknown suite" in res.output


# ---- verify -----------------------------------------------------------------------------

def test_verify_ok(gset):
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 0, res.output
    assert "3 intact cases" in res.output


def _first_file(root):
    return _manifest(root)["cases"][0]["file"]


def test_verify_detects_a_flipped_byte(gset):
    f = gset / _first_file(gset)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x01                               # one bit of a float
    f.write_bytes(bytes(b))
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 1
    assert f"{f.name}: sha256 mismatch (corrupted" in res.output


def test_verify_detects_a_truncated_file(gset):
    f = gset / _first_file(gset)
    n = f.stat().st_size
    f.write_bytes(f.read_bytes()[: n // 3])
    res = invoke("golden", "verify", "--dir", gset, "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert not doc["ok"]
    [p] = doc["problems"]
    assert p["file"] == f.name and p["kind"] == "truncated"
    assert f"truncated ({n // 3} of {n} bytes)" in p["message"]


def test_verify_detects_a_missing_file(gset):
    f = gset / _first_file(gset)
    f.unlink()
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 1
    assert f"{f.name}: missing" in res.output


@pytest.mark.parametrize("damage,msg", [
    (lambda t: t[: len(t) // 2], "not valid JSON (truncated"),
    (lambda t: t.replace(f'"schema_version": {golden.SCHEMA_VERSION}', '"schema_version": 99'),
     "version 99; this sdpa_probe reads"),
    (lambda t: t.replace('"sha256"', '"sha"', 1), "lacks a valid sha256"),
    (lambda t: "", "not valid JSON"),
])
def test_verify_detects_a_damaged_manifest(gset, damage, msg):
    m = gset / "manifest.json"
    m.write_text(damage(m.read_text()))
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 1
    assert "manifest.json" in res.output and msg in res.output, res.output


def test_verify_missing_directory(tmp_path):
    """A directory that is not there is a usage error (2), as for diff and --golden-dir,
    not a set with problems (1)."""
    res = invoke("golden", "verify", "--dir", tmp_path / "nowhere")
    assert res.exit_code == 2 and "no golden directory" in res.output


def test_verify_detects_input_drift(gset):
    """Inputs are regenerated from the seed: a different generator output is caught
    (by verify, and by the --golden check path) instead of silently accepted."""
    m = gset / "manifest.json"
    man = json.loads(m.read_text())
    ent = man["cases"][0]
    ent["inputs_sha256"] = "0" * 64
    arrays = {e["id"]: golden.read_case(gset, e) for e in man["cases"]}
    m.write_text(json.dumps(golden.seal(man, arrays), indent=1))  # its digests kept consistent
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 1
    assert "inputs regenerated from seed" in res.output
    case = Case(**ent["params"])
    with pytest.raises(golden.GoldenError, match="inputs regenerated from seed"):
        prepare_case(case, golden=gset)


# ---- diff -------------------------------------------------------------------------------

def test_diff_of_identical_sets_agrees(gset, small_set):
    res = invoke("golden", "diff", small_set, "--dir", gset)
    assert res.exit_code == 0, res.output
    assert "agree within tolerance" in res.output


def test_diff_reports_a_changed_reference(gset, small_set, monkeypatch):
    _nan_rows(monkeypatch)
    assert invoke("golden", "regen", "--dir", gset, *_SMALL, "--accept").exit_code == 0
    monkeypatch.undo()
    res = invoke("golden", "diff", gset, "--dir", small_set)
    assert res.exit_code == 1
    masked = _small_ids()[0]
    assert f"changed  {masked}" in res.output
    assert "semantics.fully_masked_rows: zeros (this) -> nan (other)" in res.output
    res = invoke("golden", "diff", gset, "--dir", small_set, "--json")
    doc = json.loads(res.stdout)
    assert doc["differs"] and doc["counts"]["changed"] >= 1


def test_diff_names_cases_on_one_side_only(gset, small_set):
    m = gset / "manifest.json"
    man = json.loads(m.read_text())
    gone = man["cases"].pop()["id"]
    m.write_text(json.dumps(man, indent=1))
    res = invoke("golden", "diff", gset, "--dir", small_set)
    assert res.exit_code == 1
    assert f"only-this  {gone}" in res.output


# ---- probe check --golden ------------------------------------------------------------------

@pytest.fixture
def default_build(monkeypatch):
    """The default compiler for the check workers, whatever an earlier in-process
    `probe build --cc ...` left in native's process-wide build options."""
    monkeypatch.setattr(native, "_build_opts", {})
    native.native_lib.cache_clear()


def test_check_golden_agrees_with_live_check(one_thread, default_build):
    """`probe check --golden` (worker processes, stored references) gives the very records
    that the stored references give in-process, and the live oracle's verdicts."""
    cid = _small_ids()[0]
    case = next(c for c in suite("default") if c.id == cid)
    res = invoke("check", "--golden", "-b", "flash,decomposed", "-k", cid, "--json", "-",
                 "-j", "1")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["reference"]["source"] == "golden"
    assert [r["family"] for r in doc["records"]] == [case.family] * 2  # no cache-sizing
    # in-process on the stored reference: the very record; on the live oracle (whose
    # BLAS rounds differently on another CPU than the data was made on): the verdict
    prep, live_prep = prepare_case(case, golden=GOLDEN), prepare_case(case)
    for rec in doc["records"]:
        stored = run_one(NativeBackend(rec["backend"]), case, prep)
        # (the leak probe runs only in a worker, without glibc's per-thread cache)
        same = {"seconds": None, "leak_bytes_per_call": None}
        assert json.loads(dumps(stored)) | same == rec | same
        live = json.loads(dumps(run_one(NativeBackend(rec["backend"]), case, live_prep)))
        assert live["status"] == rec["status"]
        assert live["max_abs_err"] == pytest.approx(rec["max_abs_err"], rel=1e-6)


@pytest.mark.parametrize("argv,msg", [
    (["--seed", "1", "-k", "decode"], "not in the golden set"),
    (["--suite", "full"], "not in the golden set"),
    (["--suite", "cache-sizing"], "no golden references"),
    (["--repro", "x"], "drop --golden"),
])
def test_check_golden_usage_errors(argv, msg):
    res = invoke("check", "--golden", "-b", "flash", *argv)
    assert res.exit_code == 2, res.output
    assert msg in res.output


def test_check_golden_refuses_a_corrupted_set(gset):
    f = gset / _first_file(gset)
    f.write_bytes(f.read_bytes()[:-10])
    cid = _manifest(gset)["cases"][0]["id"]
    res = invoke("check", "--golden-dir", gset, "-b", "flash", "-k", cid)
    assert res.exit_code == 2
    assert f"{f.name}: truncated" in res.output and "probe golden verify" in res.output
