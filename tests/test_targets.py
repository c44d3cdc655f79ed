"""`probe check --target`: kernels built for aarch64 and run under qemu-aarch64 (NEON, SVE at
a fixed vector length), judged by the host's verdict code. The test kernels in
tests/kernels/ carry the bugs only another CPU shows: an SVE loop tail written for 128-bit
vectors, a NEON lane-order slip."""

import json

import pytest
from conftest import EXAMPLE_KERNEL, REPO
from typer.testing import CliRunner

from sdpa_probe.backends import parse
from sdpa_probe.backends.registry import worker_groups
from sdpa_probe.cli import app
from sdpa_probe.errors import ProbeError
from sdpa_probe.records import repro_command
from sdpa_probe.targets import spec
from sdpa_probe.targets.judging import describe_fpcr
from sdpa_probe.targets.spec import parse_target, parse_targets, split_target, why_unusable

runner = CliRunner()
KERNELS = REPO / "tests" / "kernels"
QEMU_MISSING = why_unusable(parse_target("aarch64"))
needs_qemu = pytest.mark.skipif(QEMU_MISSING is not None, reason=QEMU_MISSING or "")
# (the slow ones run check's workers and qemu, some 15 s each on a loaded machine: .ci/run
# runs them on a line of their own)


def _check(tmp_path, kernel, targets: str, *extra: str) -> tuple[int, dict]:
    j = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "--kernel", str(kernel), "--target", targets,
                              "--suite", "smoke", "--json", str(j), "-j", "1", *extra])
    assert res.exit_code in (0, 1), res.output
    by: dict[str, dict[str, dict]] = {}
    for r in json.loads(j.read_text())["records"]:
        by.setdefault(r["backend"], {})[r["case"]] = r
    return res.exit_code, by


def test_targets_parse_and_name_backends():
    assert parse_target("aarch64-sve512").qemu_cpu() == "max,sve-max-vq=4"
    assert parse_target("aarch64").qemu_cpu() == "max,sve=off"
    t = parse_target("ssh://pi@board:2222")
    assert (t.kind, t.user, t.host, t.port) == ("ssh", "pi", "board", 2222)
    assert t.ssh_destination() == ["-p", "2222", "pi@board"]
    for bad in ("aarch64-sve100", "riscv64", "ssh://", "ssh://h:99999"):
        with pytest.raises(ProbeError):
            parse_target(bad)
    assert [x.name for x in parse_targets(["host,aarch64", "aarch64"])] == ["host", "aarch64"]
    assert split_target("k.c@ssh://u@h:22") == ("k.c", "ssh://u@h:22")
    spec = parse("docs/examples/minimal_sdpa.c@aarch64-sve256")
    assert (spec.kind, spec.base, spec.target) == ("file", "docs/examples/minimal_sdpa.c",
                                                   "aarch64-sve256")
    assert spec.label == "minimal_sdpa.c@aarch64-sve256"
    assert parse("flash@aarch64").name == "flash@aarch64"
    with pytest.raises(ProbeError, match="runtime on this host"):
        parse("torch@aarch64")
    assert (repro_command("flash@aarch64", "c1")
            == "probe check --backend flash --target aarch64 -k c1")


def test_fpcr_changes_in_words():
    said = describe_fpcr(0, (1 << 24) | (3 << 22) | (1 << 9))
    assert "flush-to-zero (FZ) on" in said and "to nearest -> toward zero" in said
    assert "divide by zero" in said


@needs_qemu
@pytest.mark.slow
def test_example_kernel_passes_on_host_and_aarch64_columns(tmp_path):
    code, by = _check(tmp_path, EXAMPLE_KERNEL, "host,aarch64,aarch64-sve256",
                      "-k", "decode", "-k", "i8")
    name = str(EXAMPLE_KERNEL)
    assert list(by) == [name, f"{name}@aarch64", f"{name}@aarch64-sve256"]
    assert code == 0
    assert all(r["status"] == "pass" and r["leak_bytes_per_call"] == 0
               for recs in by.values() for r in recs.values())


@needs_qemu
@pytest.mark.slow
def test_sve_loop_tail_passes_at_128_bits_and_fails_at_512(tmp_path):
    kernel = KERNELS / "sve_tail.c"
    code, by = _check(tmp_path, kernel, "aarch64-sve128,aarch64-sve512",
                      "-k", "masked-rows", "-k", "prefill")
    at128, at512 = by[f"{kernel}@aarch64-sve128"], by[f"{kernel}@aarch64-sve512"]
    assert code == 1 and len(at128) == len(at512) == 2
    assert all(r["status"] == "pass" for r in at128.values())
    assert all(r["status"] == "fail" and "error above tolerance" in r["reason"]
               for r in at512.values())


@needs_qemu
@pytest.mark.slow
def test_neon_lane_order_fails_on_aarch64_only(tmp_path):
    kernel = KERNELS / "neon_lanes.c"
    code, by = _check(tmp_path, kernel, "host,aarch64", "-k", "f16", "-k", "kv129")
    host, arm = by[str(kernel)], by[f"{kernel}@aarch64"]
    assert code == 1
    assert all(r["status"] == "pass" for r in host.values())
    f16 = next(r for c, r in arm.items() if c.endswith("f16"))
    assert f16["status"] == "fail" and "error above tolerance" in f16["reason"]
    assert all(r["status"] == "pass" for c, r in arm.items() if not c.endswith("f16"))


@needs_qemu
@pytest.mark.slow
def test_caller_state_crash_and_fpcr_judged_on_aarch64(tmp_path):
    src = EXAMPLE_KERNEL.read_text().replace(
        "int sdpa_forward(const sdpa_args *a) {\n",
        "int sdpa_forward(const sdpa_args *a) {\n"
        "#ifdef __aarch64__\n  if (a->k.dtype == SDPA_F32) { unsigned long f;\n"
        "    __asm__ volatile(\"mrs %0, fpcr\" : \"=r\"(f)); f |= 1ul << 24;\n"
        "    __asm__ volatile(\"msr fpcr, %0\" :: \"r\"(f)); }\n#endif\n"
        "  if (a->k.dtype == SDPA_F16) { volatile int *none = 0; *none = 1; }\n")
    kernel = tmp_path / "fz_and_crash.c"
    kernel.write_text(src)
    code, by = _check(tmp_path, kernel, "aarch64", "-k", "dtype", "--skip", "bf16",
                      "--skip", "i8", "-k", "kv129")
    recs = by[f"{kernel}@aarch64"]
    assert code == 1
    f32 = next(r for c, r in recs.items() if c.endswith("kv129-d64-f32"))
    assert f32["status"] == "fail" and "FPCR flush-to-zero (FZ) on" in f32["reason"]
    f16 = next(r for c, r in recs.items() if c.endswith("f16"))
    assert f16["status"] == "crash" and "SIGSEGV" in f16["reason"]


def test_an_unknown_target_is_a_usage_error():
    res = runner.invoke(app, ["check", "--kernel", str(EXAMPLE_KERNEL), "--target", "mips"])
    assert res.exit_code == 2 and "unknown target 'mips'" in res.output


def test_info_targets_says_what_to_install(monkeypatch):
    real = spec.shutil.which  # (the tools looked up there: qemu made to miss)
    monkeypatch.setattr(spec.shutil, "which",
                        lambda tool: None if tool == "qemu-aarch64" else real(tool))
    res = runner.invoke(app, ["info", "--targets", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["target"]: r for r in json.loads(res.output)["targets"]}
    assert rows["host"]["usable"]
    assert not rows["aarch64-sve512"]["usable"]
    assert rows["aarch64-sve512"]["install"] == "apt-get install qemu-user"
    res = runner.invoke(app, ["check", "--kernel", str(EXAMPLE_KERNEL), "--target", "aarch64"])
    assert res.exit_code == 2 and "apt-get install qemu-user" in res.output


def test_each_target_has_its_pool_and_qemu_its_longer_timeout():
    specs = [parse(n) for n in ("flash", "torch", "flash@aarch64", "flash@aarch64-sve256",
                                "decomposed@aarch64")]
    assert worker_groups(specs) == [["flash", "torch"], ["flash@aarch64", "decomposed@aarch64"],
                                    ["flash@aarch64-sve256"]]
    assert spec.timeout_factor(["flash"]) == 1.0
    assert spec.timeout_factor(["flash", "flash@aarch64-sve256"]) == spec.QEMU_SLOWDOWN
