"""Golden data integrity: an edit of a stored record that kept every digest consistent
(a torch_err floor, a reference, the semantics) is found by `probe golden verify`,
and by `probe check --golden` before it judges anything, with the same messages."""

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from sdpa_probe import golden
from sdpa_probe.cases import suite
from sdpa_probe.cli import app

runner = CliRunner()
ENV = {"COLUMNS": "400"}  # no wrapping: messages are matched whole


def invoke(*argv):
    res = runner.invoke(app, [str(a) for a in argv], env=ENV)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def _ids() -> list[str]:
    """Two cheap stored cases: an f32 decode case and an f16 one (torch_err set)."""
    cases = suite("default")
    return [next(c for c in cases if c.family == "decode" and c.dtype == "f32").id,
            next(c for c in cases if c.dtype == "f16" and c.kv_len < 200).id]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden") / "base"
    golden.regenerate(_ids(), root=root)
    return root


@pytest.fixture
def gset(base, tmp_path):
    root = tmp_path / "g"
    shutil.copytree(base, root)
    return root


def _manifest(root) -> dict:
    return json.loads((root / golden.MANIFEST).read_text())


def _rewrite(root, case_id, *, ref=None, torch_err="keep", **header) -> None:
    """A consistent edit: the case's file rewritten, its manifest entry (size, sha256,
    summary fields) and every digest updated to match, as a careful hand edit would."""
    man = _manifest(root)
    man.update(header)
    arrays = {e["id"]: golden.read_case(root, e) for e in man["cases"]}
    ent = next(e for e in man["cases"] if e["id"] == case_id)
    old_ref, old_terr = arrays[case_id]
    new_ref = old_ref if ref is None else ref
    new_terr = old_terr if torch_err == "keep" else torch_err
    blob = golden.npz_bytes({"ref": new_ref, "torch_err": np.float64(new_terr)})
    (root / ent["file"]).write_bytes(blob)
    ent.update(bytes=len(blob), sha256=golden.sha256(blob), torch_err=new_terr,
               max_abs=float(np.abs(new_ref).max()))
    arrays[case_id] = (new_ref, new_terr)
    (root / golden.MANIFEST).write_bytes(golden.manifest_bytes(golden.seal(man, arrays)))


def _verify(root) -> tuple[int, list[dict]]:
    res = invoke("golden", "verify", "--dir", root, "--json")
    return res.exit_code, json.loads(res.stdout)["problems"]


def _check(root, case_id):
    """check --golden against the set: a stored-data problem ends it before any worker."""
    return invoke("check", "--golden-dir", root, "-b", "flash", "-k", case_id, "-j", "1")


def _same_report(root, case_id, kind: str) -> list[dict]:
    """verify exits 1 naming the case and the kind; check --golden exits 2 with the very
    messages and judges nothing."""
    code, problems = _verify(root)
    assert code == 1, problems
    assert [p["kind"] for p in problems] == [kind], problems
    assert case_id in problems[0]["message"] or kind == "semantics"
    res = _check(root, case_id)
    assert res.exit_code == 2, res.output
    assert "no kernel was judged" in res.output
    for p in problems:
        assert p["message"] in res.output
    assert "pass" not in res.stdout
    return problems


def test_an_untouched_set_verifies(gset):
    res = invoke("golden", "verify", "--dir", gset)
    assert res.exit_code == 0, res.output
    assert "2 intact cases" in res.output


def test_an_edited_torch_err_with_its_digests_updated(gset):
    cid = _ids()[1]
    terr = golden.read_case(gset, next(e for e in _manifest(gset)["cases"] if e["id"] == cid))[1]
    assert terr is not None and terr > 0
    _rewrite(gset, cid, torch_err=terr * 100)           # a looser floor: any kernel passes
    [p] = _same_report(gset, cid, "torch_err")
    assert f"the stored torch_err {terr * 100:.17g} is not torch's error on its inputs, " \
           f"{terr:.17g}" in p["message"]


def test_an_edited_reference_with_its_digests_updated(gset):
    cid = _ids()[0]
    ent = next(e for e in _manifest(gset)["cases"] if e["id"] == cid)
    ref = golden.read_case(gset, ent)[0].copy()
    ref[0, 0, 0, 3] += 1e-4
    _rewrite(gset, cid, ref=ref)
    [p] = _same_report(gset, cid, "reference")
    assert "at 1 of" in p["message"] and "b=0 q=0 h=0 d=3" in p["message"]


def test_a_semantics_mismatch(gset):
    sem = dict(_manifest(gset)["semantics"], fully_masked_rows="nan")
    _rewrite(gset, _ids()[0], semantics=sem)            # header digest updated too
    [p] = _same_report(gset, _ids()[0], "semantics")
    assert "fully_masked_rows = 'nan'; this sdpa_probe's oracle gives 'zeros'" in p["message"]


def test_an_edit_without_its_digest(gset):
    """The manifest's own copy of torch_err edited by hand, the file left: the record's
    digest and the file both disagree with it."""
    man = _manifest(gset)
    man["cases"][0]["torch_err"] = 1.0
    man["versions"]["cpu"] = "another CPU"
    (gset / golden.MANIFEST).write_text(json.dumps(man, indent=1))
    code, problems = _verify(gset)
    assert code == 1
    kinds = [p["kind"] for p in problems]
    assert kinds[:3] == ["record"] * 3, problems
    assert "header" in problems[0]["message"]
    assert "does not match its record_sha256" in problems[1]["message"]
    assert "the manifest says torch_err = 1.0" in problems[2]["message"]


def test_an_unhashed_manifest_names_the_regen_to_run(gset):
    man = _manifest(gset)
    man.update(schema="sdpa_probe.golden/1", schema_version=1)
    del man["header_sha256"]
    for e in man["cases"]:
        del e["record_sha256"]
    (gset / golden.MANIFEST).write_text(json.dumps(man, indent=1))
    code, problems = _verify(gset)
    assert code == 1
    cmd = f"probe golden regen --dir {gset} --cases {','.join(sorted(_ids()))}"
    assert problems[0]["message"].endswith(f"rewrite it with {cmd}"), problems
    res = invoke(*cmd.split()[1:])                      # regen reads it, and seals it
    assert res.exit_code == 0, res.output
    assert _verify(gset) == (0, [])


def test_a_set_made_on_another_machine_is_compared_within_bounds(gset):
    """Where the set was not made, torch's error is compared through the atol it gives
    (it moves with the ISA): a tenfold looser floor is still found, and said how."""
    cid = _ids()[1]
    versions = dict(_manifest(gset)["versions"], cpu="another CPU")
    _rewrite(gset, cid, versions=versions)
    res = invoke("golden", "verify", "--dir", gset, "--json")
    assert res.exit_code == 0, res.output
    assert any("not this machine" in n for n in json.loads(res.stdout)["notes"])
    terr = golden.read_case(gset, next(e for e in _manifest(gset)["cases"] if e["id"] == cid))[1]
    _rewrite(gset, cid, torch_err=terr * 100)
    code, [p] = _verify(gset)
    assert code == 1 and p["kind"] == "torch_err" and cid in p["message"]
    assert f"more than {golden.TORCH_ERR_FACTOR:g}x apart" in p["message"]
