"""Runtime build of native code into a hash-keyed cache (cffi API mode, out-of-line).

The cache key covers the sources, headers, cdef, compiler and its version, flags,
CPU model and package version, so a change to any of them builds a new module
beside the old one. A build happens in a temporary directory, the finished
module is moved into place with os.replace, and a file lock keeps parallel
test workers from building the same key twice.

A module is looked up before anything is locked, so a read-only cache that holds it
is used as it is; one that does not gets the build in a per-user fallback folder,
said once on stderr. Each module has its content hash beside it (<module>.sha256),
checked before it is loaded: a truncated or altered module is rebuilt, never handed
to the dynamic loader (which dies of SIGBUS on a truncated one).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from . import __version__, build_progress, compiler_guard
from .build_cache import (  # noqa: F401 (some re-exported: machine, last_failed)
    HASH_SUFFIX,
    build_root,
    cache_root,
    clean_stale_builds,
    damaged,
    file_lock,
    find_intact,
    seal,
    usable_cache_root,
)
from .errors import BuildError

PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"  # installed copy (wheel)
if not NATIVE_DIR.is_dir():
    NATIVE_DIR = PACKAGE_DIR.parent / "native"  # source checkout
INCLUDE_DIR = NATIVE_DIR / "include"
SRC_DIR = NATIVE_DIR / "src"
PRELOAD_DIR = NATIVE_DIR / "preload"  # LD_PRELOAD libraries (plain shared objects)

# -std=c11 alone turns FP contraction off in GCC: ask for FMA contraction explicitly
BASE_FLAGS = ["-std=c11", "-O3", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
              "-pthread", "-Wall"]
NATIVE_ARCH = ["-march=native"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _words(text: str, what: str) -> list[str]:
    """shlex.split, with an unbalanced quote a one-line BuildError naming its source."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BuildError(f"{what} {text!r}: {str(exc).lower()}") from None


def compiler_command(cc: str | None) -> list[str]:
    if cc:
        return _words(cc, "--cc")
    if os.environ.get("CC"):
        return _words(os.environ["CC"], "$CC")
    return _words(sysconfig.get_config_var("CC") or "cc", "the compiler")


# C++ kernel sources (a user's kernel may be C++ behind extern "C" sdpa_forward)
CXX_SUFFIXES = (".cpp", ".cc", ".cxx")
CXX_STD = "-std=c++17"


_CXX_OF = {"gcc": "g++", "clang": "clang++", "cc": "c++", "icx": "icpx"}


def cxx_command(cc: list[str]) -> list[str]:
    """The C++ compiler beside the C one: $CXX, else the C compiler's name with gcc ->
    g++, clang -> clang++, cc -> c++ (so gcc-12 -> g++-12, x86_64-linux-gnu-gcc ->
    x86_64-linux-gnu-g++), else c++."""
    if os.environ.get("CXX"):
        return _words(os.environ["CXX"], "$CXX")
    head, name = os.path.split(cc[0])
    parts = name.split("-")
    for i, part in enumerate(parts):
        if part in _CXX_OF:
            cand = os.path.join(head, "-".join(parts[:i] + [_CXX_OF[part]] + parts[i + 1:]))
            if shutil.which(cand):
                return [cand, *cc[1:]]
            break
    if shutil.which("c++"):
        return ["c++"]
    raise BuildError(f"no C++ compiler found beside {' '.join(cc)!r} for a C++ kernel: "
                     "set $CXX")


def cxx_flags(flags: list[str]) -> list[str]:
    """The C flags for a C++ source: the C standard swapped for CXX_STD."""
    return [CXX_STD if f == "-std=c11" else f for f in flags]


def compiler_version(cc: list[str]) -> str:
    try:
        out = subprocess.run(cc + ["--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"compiler {' '.join(cc)!r} cannot be run: {exc}") from None
    if out.returncode != 0:
        raise BuildError(f"compiler {' '.join(cc)!r} failed to report its version")
    return out.stdout.splitlines()[0].strip() if out.stdout else ""


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """What goes into one module: its name stem, C sources, cdef and flags."""

    stem: str
    cdef: str
    source: str  # the C text cffi's set_source gets (usually #includes)
    sources: tuple[Path, ...] = ()
    headers: tuple[Path, ...] = ()
    include_dirs: tuple[Path, ...] = ()
    extra_link: tuple[str, ...] = ()

    @property
    def has_cxx(self) -> bool:
        return any(p.suffix in CXX_SUFFIXES for p in self.sources)


@dataclasses.dataclass
class BuildResult:
    module_name: str
    path: Path
    cc: str
    cc_version: str
    flags: list[str]
    seconds: float
    cached: bool
    fallback: bool  # portable flags were used because -march=native failed
    fallback_reason: str = ""  # the -march=native build's error, when fallback
    cxx: str = ""  # the C++ compiler, when a source is C++

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["path"] = str(self.path)
        return d


def _digest(parts: Iterable[str], files: Iterable[Path] = ()) -> str:
    """A cache key: the parts, each ended by a NUL, then each file's name and bytes."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    for path in files:
        h.update(str(path.name).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _key(spec: BuildSpec, cc: list[str], cc_version: str, flags: list[str],
         cxx: tuple[list[str], str] = ([], "")) -> str:
    return _digest((spec.stem, spec.cdef, spec.source, " ".join(cc), cc_version,
                    " ".join(cxx[0]), cxx[1], " ".join(OBJECT_FLAGS + flags),
                    cpu_model(), __version__, sys.version, " ".join(spec.extra_link)),
                   sorted(set(spec.sources) | set(spec.headers)))


def _ext_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _compile(spec: BuildSpec, module_name: str, cc: list[str], flags: list[str],
             dest: Path, cxx: list[str] | None = None) -> None:
    import cffi  # local: building is rare, importing cffi's compiler bits is slow

    ffi = cffi.FFI()
    ffi.cdef(spec.cdef)
    with tempfile.TemporaryDirectory(prefix=f"sdpa_probe_build_{module_name}_",
                                     dir=dest.parent) as tmp:
        objects = _compile_objects(spec, module_name, cc, flags, Path(tmp), cxx)
        ffi.set_source(
            module_name,
            spec.source,
            include_dirs=[str(d) for d in spec.include_dirs],
            extra_compile_args=flags,
            extra_objects=[str(o) for o in objects],
            extra_link_args=["-pthread", *spec.extra_link],
            libraries=["m"],
        )
        # distutils reads CC / LDSHARED from the environment; CFLAGS would be
        # prepended to ours, so it is set aside during the build. The whole environment
        # is put back after it: setuptools sets PLAT, which `probe bench` and `profile`
        # would otherwise see appear while a kernel runs (caller_state).
        # (both through a compiler guard: the compiler dies with this process)
        saved = dict(os.environ)
        os.environ["CC"] = compiler_guard.guarded_text(cc)
        # C++ objects link through the C++ driver, which adds its runtime library
        os.environ["LDSHARED"] = compiler_guard.guarded_text(cxx or cc) + " -shared"
        os.environ.pop("CFLAGS", None)
        log_path = Path(tmp) / "build.log"
        build_progress.watcher().linking(spec.stem)
        try:
            with open(log_path, "w") as log, _redirect_fd(1, log), _redirect_fd(2, log):
                built = ffi.compile(tmpdir=tmp, verbose=False)
        except Exception as exc:  # cffi raises VerificationError / CompileError / LinkError
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            detail = _first_error(text, str(exc).splitlines()[0])
            raise BuildError(f"compiling {module_name} failed: {detail}") from None
        finally:
            for k in set(os.environ) - set(saved):
                del os.environ[k]
            for k, v in saved.items():
                if os.environ.get(k) != v:
                    os.environ[k] = v
        if not os.path.isfile(built):  # e.g. --cc /bin/true: "success", and nothing built
            raise BuildError(f"compiling {module_name} failed: {' '.join(cc)} exited 0 but "
                             f"wrote no {Path(built).name}")
        os.replace(built, dest)
    seal(dest)


def _first_error(compiler_output: str, otherwise: str) -> str:
    """The compiler's first line that mentions an error: a one-line message."""
    errors = [ln for ln in compiler_output.splitlines() if "error" in ln.lower()]
    return errors[0].strip() if errors else otherwise


# What distutils would add for an extension's sources, less -g: debug information
# for the fully unrolled block copies doubled their compile time.
OBJECT_FLAGS = ["-fPIC", "-DNDEBUG", "-fwrapv"]


def _build_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not Linux)
        return max(1, os.cpu_count() or 1)


def _compile_objects(spec: BuildSpec, module_name: str, cc: list[str], flags: list[str],
                     tmp: Path, cxx: list[str] | None = None) -> list[Path]:
    """Each C (or C++) source to an object in tmp, one compiler per CPU at a time
    (distutils would compile them one after the other); the largest sources start first."""
    incs = [f"-I{d}" for d in spec.include_dirs]
    jobs = [(src, tmp / f"{i}_{src.stem}.o") for i, src in enumerate(spec.sources)]
    order = sorted(jobs, key=lambda j: -j[0].stat().st_size)

    def command(src: Path, obj: Path) -> list[str]:
        if src.suffix in CXX_SUFFIXES and cxx:
            cmd = [*cxx, *OBJECT_FLAGS, *cxx_flags(flags)]
        else:
            cmd = [*cc, *OBJECT_FLAGS, *flags]
        return [*cmd, *incs, "-c", str(src), "-o", str(obj)]

    watch = build_progress.watcher()
    commands = [command(src, obj) for src, obj in order]
    for argv in commands:
        watch.command(argv)
    try:
        with concurrent.futures.ThreadPoolExecutor(min(_build_jobs(), len(order) or 1)) as pool:
            running = {pool.submit(compiler_guard.run, argv): src
                       for argv, (src, _) in zip(commands, order, strict=True)}
            for n, fut in enumerate(concurrent.futures.as_completed(running), 1):
                watch.compiled(running[fut].name, n, len(order))
            done = [fut.result() for fut in running]  # (in order's order: dicts keep it)
    except OSError as exc:
        raise BuildError(f"compiling {module_name} failed: {exc}") from None
    for (src, _), out in zip(order, done, strict=True):
        if out.returncode != 0:
            detail = _first_error(out.stderr, f"{src.name}: exit {out.returncode}")
            raise BuildError(f"compiling {module_name} failed: {detail}")
    return [obj for _, obj in jobs]


@contextlib.contextmanager
def _redirect_fd(fd: int, fileobj):
    """Send a raw file descriptor (the compiler's stderr) into a log file."""
    saved = os.dup(fd)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fileobj.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def build(spec: BuildSpec, *, force: bool = False, cc: str | None = None,
          cflags: str | None = None) -> BuildResult:
    """Build (or find in the cache) the module described by spec."""
    cc_cmd = compiler_command(cc)
    cc_version = compiler_version(cc_cmd)
    cxx_cmd: list[str] = cxx_command(cc_cmd) if spec.has_cxx else []
    cxx = (cxx_cmd, compiler_version(cxx_cmd) if cxx_cmd else "")
    user_flags = (_words(cflags, "compiler flags") if cflags is not None
                  else _words(os.environ.get("SDPA_PROBE_CFLAGS", ""), "$SDPA_PROBE_CFLAGS"))
    attempts = [BASE_FLAGS + NATIVE_ARCH + user_flags]
    if not any(f.startswith(("-march", "-mcpu")) for f in user_flags):
        attempts.append(BASE_FLAGS + user_flags)  # portable fallback
    else:
        attempts = [BASE_FLAGS + user_flags]
    root = usable_cache_root()
    last_error: BuildError | None = None
    for n, flags in enumerate(attempts):
        key = _key(spec, cc_cmd, cc_version, flags, cxx)
        module_name = f"_{spec.stem}_{key}"
        name = module_name + _ext_suffix()
        reason = str(last_error) if n > 0 and last_error is not None else ""
        found = None if force else find_intact(name, root)
        if found is not None:  # (looked up without a lock: a read-only cache serves)
            return BuildResult(module_name, found, " ".join(cc_cmd), cc_version, flags, 0.0,
                               True, n > 0, reason, " ".join(cxx_cmd))
        broot = build_root(root)
        dest = broot / name
        with file_lock(broot / (module_name + ".lock")):
            if not force and damaged(dest) is None:  # (built meanwhile by another process)
                return BuildResult(module_name, dest, " ".join(cc_cmd), cc_version, flags, 0.0,
                                   True, n > 0, reason, " ".join(cxx_cmd))
            clean_stale_builds(broot, module_name)
            t0 = time.perf_counter()
            watch = build_progress.watcher()
            watch.started(spec.stem, [s.name for s in spec.sources])
            ok = False
            try:
                with compiler_guard.interruptible():
                    _compile(spec, module_name, cc_cmd, flags, dest, cxx_cmd or None)
                ok = True
            except BuildError as exc:
                last_error = exc
                continue
            finally:  # (an interrupt too: the watcher's line is closed)
                watch.finished(spec.stem, time.perf_counter() - t0, ok)
            return BuildResult(module_name, dest, " ".join(cc_cmd), cc_version, flags,
                               time.perf_counter() - t0, False, n > 0, reason, " ".join(cxx_cmd))
    assert last_error is not None
    raise last_error


def build_preload(source: Path, cc: str | None = None) -> Path:
    """Build (or find in the cache) a plain shared library to LD_PRELOAD from one C
    source: no cffi module, nothing Python loads; keyed like the modules."""
    cc_cmd = compiler_command(cc)
    flags = ["-std=c11", "-O2", "-Wall", "-fPIC", "-shared"]
    key = _digest((" ".join(cc_cmd), compiler_version(cc_cmd), " ".join(flags), __version__),
                  [source])
    root = usable_cache_root()
    name = f"_preload_{source.stem}_{key}.so"
    found = find_intact(name, root)
    if found is not None:
        return found
    root = build_root(root)
    dest = root / name
    with file_lock(root / (dest.stem + ".lock")):
        if damaged(dest) is None:
            return dest
        clean_stale_builds(root, dest.stem)
        with tempfile.TemporaryDirectory(prefix=f"sdpa_probe_build_{dest.stem}_",
                                         dir=root) as tmp:
            built = Path(tmp) / dest.name
            try:
                with compiler_guard.interruptible():
                    proc = compiler_guard.run([*cc_cmd, *flags, str(source), "-o", str(built)],
                                              timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BuildError(f"compiling {source.name} failed: {exc}") from None
            if proc.returncode != 0 or not built.is_file():
                raise BuildError(f"compiling {source.name} failed: "
                                 + _first_error(proc.stderr, f"exit {proc.returncode}"))
            os.replace(built, dest)
        seal(dest)
    return dest


_loaded: dict[Path, object] = {}


def load(result: BuildResult):
    """Import a built module by path (each has a unique name, so many can coexist)."""
    if result.path in _loaded:
        return _loaded[result.path]
    spec = importlib.util.spec_from_file_location(result.module_name, result.path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load {result.path}")
    try:  # (the dynamic loader runs in module_from_spec: undefined symbols surface there)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except ImportError as exc:
        raise BuildError(f"cannot load {result.path}: {exc}") from None
    _loaded[result.path] = mod
    return mod


def clear_cache() -> int:
    root = cache_root()
    n = 0
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith("_") and p.name.endswith((".so", ".lock", HASH_SUFFIX)):
                p.unlink(missing_ok=True)
                n += 1
        shutil.rmtree(root / "tmp", ignore_errors=True)
    return n
