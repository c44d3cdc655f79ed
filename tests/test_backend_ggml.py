"""llama.cpp's ggml attention as the `ggml` and `ggml-nofa` backends: the build's key,
source check and cache (fast, nothing built), and, where ggml is built here (`probe
build --ggml`), its verdicts: a pass, an unsupported case with its reason, and the cases
where ggml's conventions differ from the oracle."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import pytest

from sdpa_probe import ggml_build
from sdpa_probe.backends import ggml_attention as ga
from sdpa_probe.backends import make
from sdpa_probe.bench.inputs import make_inputs
from sdpa_probe.bench.shapes import parse_shape
from sdpa_probe.build_cache import seal
from sdpa_probe.cases import Case
from sdpa_probe.check.calls import run_one
from sdpa_probe.errors import BuildError
from sdpa_probe.oracle import prepare_case

TOOLS = ggml_build.Toolchain(("gcc",), "gcc 12.2.0", ("g++",), "g++ 12.2.0", "/usr/bin/cmake",
                             "cmake version 3.25.1")


def test_the_build_key_covers_the_compilers_cmake_and_the_cpu():
    key = ggml_build.build_key(TOOLS, "Xeon", "avx512f amx_tile")
    assert key == ggml_build.build_key(TOOLS, "Xeon", "avx512f amx_tile")
    others = [ggml_build.build_key(dataclasses.replace(TOOLS, **{field: value}), "Xeon",
                                   "avx512f amx_tile")
              for field, value in (("cc_version", "gcc 13.1.0"), ("cxx", ("clang++",)),
                                   ("cmake_version", "cmake version 3.31.0"))]
    others += [ggml_build.build_key(TOOLS, "Epyc", "avx512f amx_tile"),
               ggml_build.build_key(TOOLS, "Xeon", "avx512f")]
    assert len({key, *others}) == 1 + len(others)


def test_an_sdist_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / ggml_build.SDIST_FILE
    fake.write_bytes(b"not llama.cpp")
    with pytest.raises(BuildError, match="is not the llama-cpp-python 0.3.36 sdist: its sha256"):
        ggml_build.verify_sdist(fake)
    monkeypatch.setenv(ggml_build.SDIST_ENV, str(fake))
    with pytest.raises(BuildError, match=ggml_build.SDIST_SHA256):
        ggml_build.sdist_path(tmp_path)
    monkeypatch.setenv(ggml_build.SDIST_ENV, str(tmp_path / "missing.tar.gz"))
    with pytest.raises(BuildError, match="cannot read"):
        ggml_build.sdist_path(tmp_path)


def _sdist(path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_vendored_tree_is_extracted_and_its_commit_read(tmp_path):
    commit = "ab" * 20
    _sdist(tmp_path / "s.tar.gz", {
        ggml_build.HEAD_MEMBER: commit.encode() + b"\n",
        ggml_build.VENDOR + "CMakeLists.txt": b"project(llama.cpp)\n",
        ggml_build.VENDOR + "ggml/CMakeLists.txt": b"set(GGML_VERSION_MAJOR 0)\n",
        ggml_build.VENDOR + "models/big.gguf": b"weights",
        "llama_cpp_python-0.3.36/README.md": b"the bindings"})
    assert ggml_build.extract(tmp_path / "s.tar.gz", tmp_path / "src") == commit
    got = sorted(str(p.relative_to(tmp_path / "src")) for p in (tmp_path / "src").rglob("*")
                 if p.is_file())
    assert got == ["CMakeLists.txt", "ggml/CMakeLists.txt"]


def test_a_build_whose_library_was_altered_is_not_used(tmp_path):
    (tmp_path / "lib").mkdir()
    lib = tmp_path / "lib" / "libggml-cpu.so.0.25.3"
    lib.write_bytes(b"\x7fELF library")
    manifest = {"files": {"lib/libggml-cpu.so.0.25.3": ggml_build.file_sha256(lib)}}
    (tmp_path / ggml_build.MANIFEST).write_text(json.dumps(manifest))
    assert ggml_build.intact(tmp_path) is None  # (not sealed: a build cut short)
    seal(tmp_path / ggml_build.MANIFEST)
    assert ggml_build.intact(tmp_path) == manifest
    lib.write_bytes(b"\x7fELF librarY")
    assert ggml_build.intact(tmp_path) is None


def test_a_build_says_its_ggml_its_llama_cpp_commit_and_openmp():
    manifest = {"ggml_version": "0.25.3", "llama_cpp_commit": ggml_build.LLAMA_CPP_COMMIT,
                "cmake_flags": list(ggml_build.CMAKE_FLAGS)}
    said = ggml_build.GgmlBuild(Path("/nowhere"), manifest).description
    assert said == ("ggml 0.25.3 (llama.cpp 0c1e57098, from the llama-cpp-python 0.3.36 "
                    "sdist; GGML_OPENMP=OFF)")


def test_unbuilt_it_says_what_to_run(monkeypatch):
    monkeypatch.setattr(ggml_build, "find", lambda: None)
    ga.adapter.cache_clear()
    try:
        why = ga.GgmlBackend.why_unavailable()
    finally:
        ga.adapter.cache_clear()
    assert why is not None and "not built: run `probe build --ggml`" in why


@pytest.fixture(scope="module")
def built():
    why = ga.GgmlBackend.why_unavailable()
    if why:
        pytest.skip(why)


def _record(backend: str, case: Case) -> dict:
    return run_one(make(backend), case, prepare_case(case))


@pytest.mark.ggml
@pytest.mark.parametrize("backend", ["ggml", "ggml-nofa"])
def test_decode_over_an_f32_cache_passes(built, backend):
    case = Case("decode", kv_len=100, causal=True, start_pos=99, layout="bhsd")
    rec = _record(backend, case)
    assert rec["status"] == "pass", rec["reason"]
    assert "llama.cpp 0c1e57098" in make(backend).version()


@pytest.mark.ggml
def test_an_int8_cache_is_unsupported_with_its_reason(built):
    rec = _record("ggml", Case("dtype", dtype="i8"))
    assert (rec["status"], rec["reason"]) == ("unsupported", ga.INT8_REASON)


@pytest.mark.ggml
def test_with_flash_off_a_row_that_sees_no_key_is_nan(built):
    """ggml_soft_max_ext over a row of -inf gives NaN (exp(-inf - -inf)); the oracle's
    row is zeros. Flash attention skips -inf keys and gives the zeros."""
    case = Case("masked-rows", q_len=4, kv_len=40, mask="rows:first", v_magnitude=1.0)
    rec = _record("ggml-nofa", case)
    assert rec["status"] == "fail" and "fully masked rows" in rec["reason"], rec["reason"]


@pytest.mark.ggml
def test_flash_attention_rounds_the_mask_to_f16_by_convention(built):
    """An F32 case's random additive mask, rounded to F16 for ggml_flash_attn_ext, errs
    beyond the F32 tolerance against the float64 oracle and passes under its declared
    convention (the mask stored in F16); with flash off the F32 mask passes plainly."""
    case = Case("masked-rows", q_len=4, kv_len=40, mask="random")
    flash, nofa = _record("ggml", case), _record("ggml-nofa", case)
    assert flash["status"] == "pass", flash["reason"]
    assert flash["convention"] == "the mask stored in F16"
    assert "against the float64 oracle: error above tolerance" in flash["reason"]
    assert (nofa["status"], nofa["convention"]) == ("pass", None), nofa["reason"]


@pytest.mark.ggml
def test_flash_attention_over_f16_fails_on_its_f16_accumulator(built):
    """Its vector loop sums P.V in F16 (ggml_vec_mad_f16) although llama.cpp asks the op
    for F32 precision: not a declared convention, so beyond the F16 tolerance it fails
    even under the one it declares (Q rounded to F16); with flash off (F32 sums, Q and
    the normalised P rounded to F16) the case passes."""
    case = Case("dtype", kv_len=129, dtype="f16")
    rec = _record("ggml", case)
    assert rec["status"] == "fail" and "even under its convention" in rec["reason"], rec
    assert make("ggml-nofa").convention(case).p_normalised
    nofa = _record("ggml-nofa", case)
    assert nofa["status"] == "pass", nofa["reason"]


@pytest.mark.ggml
def test_a_slot_past_the_causal_edge_reaches_every_row(built):
    """The harness's NaN in the cache slots no query sees: ggml-nofa multiplies every
    slot (a -inf score, then 0 x NaN), and so does flash attention's tiled path (q_len
    >= 64) on the tile that holds the edge; its vector path skips -inf keys and passes."""
    prefill = Case("causal", q_len=64, kv_len=200, causal=True, start_pos=100)
    decode = Case("decode", kv_len=64, causal=True)
    for backend, case in (("ggml", prefill), ("ggml-nofa", decode)):
        rec = _record(backend, case)
        assert rec["status"] == "fail" and rec["reason"].startswith("NaN in"), rec["reason"]
    assert _record("ggml", decode)["status"] == "pass"


@pytest.mark.ggml
def test_bench_times_the_graph_per_input_set(built):
    shape = parse_shape("decode-h8kv2d64-kv256-f16")
    party = make("ggml").timer(shape, make_inputs(shape, 2), 1)
    seconds = party.run(3)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    with pytest.raises(ga.Unsupported, match="per-token int8"):
        make("ggml").timer(parse_shape("decode-h8kv2d64-kv256-i8"), [], 1)
