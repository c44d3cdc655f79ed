"""The build cache survives what a CI image and a crash do to it: a read-only cache
is used as it is, a damaged module is rebuilt instead of loaded, and the folders of
a killed build are cleaned."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE_KERNEL

from sdpa_probe import build, build_cache, native


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(root))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # (the fallback folder lives there)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(build_cache.tempfile, "tempdir", None)  # (re-read TMPDIR)
    return root


def test_a_module_carries_its_content_hash(cache):
    res = build.build(native.user_kernel_spec(EXAMPLE_KERNEL))
    side = res.path.with_name(res.path.name + build_cache.HASH_SUFFIX)
    assert side.read_text().strip() == build_cache.file_sha256(res.path)
    assert build_cache.damaged(res.path) is None


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip", "no-hash"])
def test_a_damaged_module_is_rebuilt_not_loaded(cache, damage):
    """The dynamic loader dies of SIGBUS on a truncated module: it is never handed one."""
    spec = native.user_kernel_spec(EXAMPLE_KERNEL)
    path = build.build(spec).path
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:len(data) // 3])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "flip":
        path.write_bytes(data[:4096] + bytes(b ^ 0xFF for b in data[4096:4296]) + data[4296:])
    else:
        path.with_name(path.name + build_cache.HASH_SUFFIX).unlink()
    assert build_cache.damaged(path) is not None
    again = build.build(spec)
    assert not again.cached and again.path == path and build_cache.damaged(path) is None


def test_a_killed_builds_folders_are_cleaned(cache):
    spec = native.user_kernel_spec(EXAMPLE_KERNEL)
    first = build.build(spec)
    left = cache / f"sdpa_probe_build_{first.module_name}_x1y2"
    (left / "sub").mkdir(parents=True)
    build.build(spec, force=True)
    assert not left.exists()


def _read_only_mount(src: Path, at: Path) -> bool:
    """src bind-mounted read-only at `at` (root, with mount): False where it cannot be."""
    at.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    ok = subprocess.run(["mount", "--bind", str(src), str(at)], capture_output=True)
    if ok.returncode != 0:
        return False
    ro = subprocess.run(["mount", "-o", "remount,ro,bind", str(at)], capture_output=True)
    if ro.returncode != 0:
        subprocess.run(["umount", str(at)], capture_output=True)
        return False
    return True


@pytest.fixture
def read_only_cache(tmp_path, monkeypatch):
    """A read-only cache holding the native library and the example kernel, as a CI
    image's pre-built cache would (as root: a read-only bind mount)."""
    built = tmp_path / "built"
    built.mkdir()
    for res in (native.build_lib(), build.build(native.user_kernel_spec(EXAMPLE_KERNEL))):
        for p in (res.path, res.path.with_name(res.path.name + build_cache.HASH_SUFFIX)):
            shutil.copy2(p, built / p.name)
    ro = tmp_path / "ro"
    if not _read_only_mount(built, ro):
        pytest.skip("no read-only bind mount here (needs root and mount)")
    yield ro
    subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_read_only_cache_serves_what_it_holds(read_only_cache, tmp_path, monkeypatch):
    env = dict(os.environ, SDPA_PROBE_CACHE=str(read_only_cache), TMPDIR=str(tmp_path),
               SDPA_PROBE_LAST_CHECK=str(tmp_path / "last.json"))
    res = subprocess.run([sys.executable, "-m", "sdpa_probe", "check", "--suite", "smoke",
                          "-b", "flash", "--kernel", str(EXAMPLE_KERNEL)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "not writable" not in res.stderr
    assert not list(read_only_cache.glob("*.lock"))


def test_a_read_only_cache_builds_what_it_lacks_elsewhere(read_only_cache, tmp_path,
                                                            monkeypatch, capsys):
    monkeypatch.setenv("SDPA_PROBE_CACHE", str(read_only_cache))
    monkeypatch.setattr(build_cache, "fallback_root", lambda: tmp_path / "fallback")
    res = build.build(native.user_kernel_spec(EXAMPLE_KERNEL), cflags="-O1")
    assert not res.cached and res.path.parent == tmp_path / "fallback"
    assert "is not writable; building into" in capsys.readouterr().err
    assert build.build(native.user_kernel_spec(EXAMPLE_KERNEL), cflags="-O1").cached
