"""Where built modules are kept: the cache folder (and the per-user fallback when it
cannot be written), each module's content hash, the per-module lock, and the folders a
killed build left. Lookups need no lock, so a read-only cache serves what it holds."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import BuildError


def cache_root() -> Path:
    env = os.environ.get("SDPA_PROBE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sdpa_probe"


HASH_SUFFIX = ".sha256"
_said: set[Path] = set()  # the fallback folders already named on stderr


def _sidecar(module: Path) -> Path:
    return module.with_name(module.name + HASH_SUFFIX)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def damaged(module: Path) -> str | None:
    """None if the module is there with the content hash beside it, else why not."""
    try:
        want = _sidecar(module).read_text().strip()
    except FileNotFoundError:
        return "not built" if not module.exists() else "it has no content hash beside it"
    except OSError as exc:
        return f"its content hash cannot be read: {exc.strerror}"
    try:
        got = file_sha256(module)
    except FileNotFoundError:
        return "not built"
    except OSError as exc:
        return f"it cannot be read: {exc.strerror}"
    return None if got == want else "its bytes do not match its content hash (damaged)"


def seal(module: Path) -> None:
    """Write the module's content hash beside it, atomically."""
    side = _sidecar(module)
    tmp = side.with_name(f".{side.name}.{os.getpid()}")
    tmp.write_text(file_sha256(module) + "\n")
    os.replace(tmp, side)


def fallback_root() -> Path:
    """Where modules are built when the cache cannot be written: one folder per user."""
    return Path(tempfile.gettempdir()) / f"sdpa_probe-cache-{os.getuid()}"


def _writable(root: Path) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK | os.X_OK)


def build_root(root: Path) -> Path:
    """The cache itself if it can be written, else the fallback (said once)."""
    if _writable(root):
        return root
    fb = fallback_root()
    if not _writable(fb):
        raise BuildError(f"cannot build into the build cache {root} (not writable) nor into "
                         f"{fb}: set SDPA_PROBE_CACHE to a writable directory")
    if fb not in _said:
        _said.add(fb)
        print(f"note: the build cache {root} is not writable; building into {fb}",
              file=sys.stderr)
    return fb


def clean_stale_builds(root: Path, module_name: str) -> None:
    """Build folders of this module left by a killed build (the caller holds its lock,
    so no build of it is running)."""
    for p in root.glob(f"sdpa_probe_build_{module_name}_*"):
        shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive flock on path (created if needed) for the duration of the block; no
    lock where it cannot be created (a read-only cache: nothing there is written)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")  # noqa: SIM115 (closed below, after the unlock)
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def usable_cache_root() -> Path:
    """The build cache (created where it can be: one that cannot be written is read,
    and builds go to fallback_root()); a BuildError if it is not a directory."""
    root = cache_root()
    if root.exists() and not root.is_dir():
        raise BuildError(f"cannot use the build cache {root}: not a directory (set "
                         "SDPA_PROBE_CACHE to a writable directory)")
    return root


def find_intact(name: str, root: Path) -> Path | None:
    """The module of this name, intact, in the cache or the fallback folder."""
    for folder in (root, fallback_root()):
        if damaged(folder / name) is None:
            return folder / name
    return None
