"""ggml, llama.cpp's tensor library, built from source into the build cache for the
`ggml` and `ggml-nofa` backends (backends/ggml_attention.py), and the small cffi module
that drives its CPU attention (native/ggml/ggml_sdpa.c).

The source is the llama-cpp-python 0.3.36 sdist, which vendors llama.cpp (and ggml) at
vendor/llama.cpp, pinned by its sha256. It is taken from $SDPA_PROBE_GGML_SDIST (a
local copy: offline machines and CI), else from the cache, else downloaded with
`pip download`. llama.cpp's top-level CMakeLists configures it (ggml's own does not
configure from the sdist); only the ggml targets are compiled, as shared libraries,
for this CPU (GGML_NATIVE), without curl, OpenSSL, tests, examples, tools or server.

GGML_OPENMP is OFF (llama.cpp's default is ON): with OpenMP, ggml's first compute sets
KMP_BLOCKTIME=200 in the caller's environment (ggml_cpu_init), which the caller-state
judge fails, and a second OpenMP runtime would run beside torch's. Off, ggml runs on
its own threadpool (ggml_threadpool_new), one per thread count, made outside the call.

A build is keyed by the sdist's hash, the C and C++ compilers and their versions,
cmake's version, the cmake flags and the CPU (model and flags). It runs in a temporary
folder under the cache, its cmake and compiler processes in a process group of their
own (killed as a group if the build is interrupted), and is moved into place whole with
os.replace, under a lock; a manifest with every library's content hash is sealed beside
it and checked before the libraries are loaded. It takes about two minutes on two cores;
progress goes to stderr."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from .build import (
    NATIVE_DIR,
    BuildResult,
    BuildSpec,
    compiler_command,
    compiler_version,
    cpu_model,
    cxx_command,
)
from .build import build as build_module
from .build_cache import (
    build_root,
    clean_stale_builds,
    damaged,
    fallback_root,
    file_lock,
    file_sha256,
    seal,
    usable_cache_root,
)
from .errors import BuildError

SDIST_PROJECT = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_ENV = "SDPA_PROBE_GGML_SDIST"
_TOP = f"llama_cpp_python-{SDIST_VERSION}"
VENDOR = f"{_TOP}/vendor/llama.cpp/"
# the vendored llama.cpp's commit: its git submodule's HEAD, which the sdist carries
# (its CHANGELOG says the same: "update llama.cpp to ggml-org/llama.cpp@0c1e57098")
HEAD_MEMBER = f"{_TOP}/.git/modules/vendor/llama.cpp/HEAD"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
# what configuring does not read (the model files are most of the sdist's bytes)
SKIPPED_DIRS = ("models/", "docs/", "media/", "examples/", "tools/", "tests/", "benches/",
                "gguf-py/", "app/")
TARGETS = ("ggml-base", "ggml-cpu", "ggml")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",  # (the libraries find each other once moved)
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DGGML_NATIVE=ON", "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF", "-DGGML_BACKEND_DL=OFF",
)
MAX_JOBS = 2  # the compile is the longest part; more jobs take the machine from others
BUILD_COMMAND = "probe build --ggml"
# the compiler flags from the environment that cmake would read, which the key does not
# cover: left out of the build's environment
_UNKEYED_ENV = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS")


def say(text: str) -> None:
    print(f"ggml: {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class GgmlBuild:
    """A built ggml: its folder (lib/, include/) and its manifest."""

    path: Path
    manifest: dict
    cached: bool = True

    @property
    def lib_dir(self) -> Path:
        return self.path / "lib"

    @property
    def include_dir(self) -> Path:
        return self.path / "include"

    @property
    def description(self) -> str:
        m = self.manifest
        omp = "OFF" if "-DGGML_OPENMP=OFF" in m.get("cmake_flags", ()) else "ON"
        return (f"ggml {m['ggml_version']} (llama.cpp {m['llama_cpp_commit'][:9]}, from the "
                f"{SDIST_PROJECT} {SDIST_VERSION} sdist; GGML_OPENMP={omp})")


# ---- the source ---------------------------------------------------------------

def verify_sdist(path: Path) -> Path:
    """path if its bytes are the pinned sdist's, else a one-line BuildError."""
    try:
        got = file_sha256(path)
    except OSError as exc:
        raise BuildError(f"cannot read the {SDIST_PROJECT} sdist {path}: "
                         f"{exc.strerror or exc}") from None
    if got != SDIST_SHA256:
        raise BuildError(f"{path} is not the {SDIST_PROJECT} {SDIST_VERSION} sdist: its "
                         f"sha256 is {got}, not {SDIST_SHA256}")
    return path


def _sdist_dir(root: Path) -> Path:
    return root / "ggml-source"


def sdist_path(root: Path) -> Path:
    """The verified sdist: $SDPA_PROBE_GGML_SDIST, the cache's copy, or downloaded
    into the cache with pip."""
    env = os.environ.get(SDIST_ENV)
    if env:
        return verify_sdist(Path(env).expanduser())
    for folder in (_sdist_dir(root), _sdist_dir(fallback_root())):
        if (folder / SDIST_FILE).is_file():
            return verify_sdist(folder / SDIST_FILE)
    folder = _sdist_dir(build_root(root))
    folder.mkdir(parents=True, exist_ok=True)
    say(f"downloading the {SDIST_PROJECT} {SDIST_VERSION} sdist into {folder}")
    with tempfile.TemporaryDirectory(prefix="download-", dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{SDIST_PROJECT}=={SDIST_VERSION}", "-d", tmp]
        proc = run_logged(cmd, Path(tmp) / "pip.log")
        got = Path(tmp) / SDIST_FILE
        if proc != 0 or not got.is_file():
            raise BuildError(f"pip could not download the {SDIST_PROJECT} {SDIST_VERSION} "
                             f"sdist (exit {proc}); on a machine without the network set "
                             f"{SDIST_ENV} to a local copy of {SDIST_FILE}")
        verify_sdist(got)
        os.replace(got, folder / SDIST_FILE)
    return folder / SDIST_FILE


def extract(sdist: Path, dest: Path) -> str:
    """vendor/llama.cpp (less what configuring does not read) into dest; the commit the
    sdist's submodule HEAD names."""
    commit = ""
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name == HEAD_MEMBER:
                commit = tar.extractfile(m).read().decode().strip()
            elif m.name.startswith(VENDOR):
                rel = m.name[len(VENDOR):]
                if rel and not rel.startswith(SKIPPED_DIRS):
                    m.name = rel
                    members.append(m)
        tar.extractall(dest, members=members, filter="data")
    return commit if re.fullmatch(r"[0-9a-f]{40}", commit) else LLAMA_CPP_COMMIT


# ---- the key and the cache ------------------------------------------------------

def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@dataclasses.dataclass(frozen=True)
class Toolchain:
    cc: tuple[str, ...]
    cc_version: str
    cxx: tuple[str, ...]
    cxx_version: str
    cmake: str  # its path, "" when not installed
    cmake_version: str


@functools.lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    cc = compiler_command(None)
    cxx = cxx_command(cc)
    cmake = shutil.which("cmake") or ""
    version = ""
    if cmake:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.splitlines()[0].strip() if out.stdout else ""
    return Toolchain(tuple(cc), compiler_version(cc), tuple(cxx), compiler_version(cxx),
                     cmake, version)


def build_key(tools: Toolchain, cpu: str, cpu_flags: str) -> str:
    """The sdist, the compilers, cmake, its flags and the CPU: what the libraries are."""
    h = hashlib.sha256()
    for part in (SDIST_SHA256, " ".join(tools.cc), tools.cc_version, " ".join(tools.cxx),
                 tools.cxx_version, tools.cmake_version, " ".join(CMAKE_FLAGS),
                 " ".join(TARGETS), cpu, cpu_flags):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def folder_name(key: str) -> str:
    return f"ggml-{key}"


MANIFEST = "manifest.json"


def intact(folder: Path) -> dict | None:
    """The manifest of a whole, unaltered build in folder, else None."""
    manifest = folder / MANIFEST
    if damaged(manifest) is not None:
        return None
    try:
        m = json.loads(manifest.read_text())
        for rel, digest in m["files"].items():
            if file_sha256(folder / rel) != digest:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return m


def find() -> GgmlBuild | None:
    """This machine's ggml build if the cache (or the fallback folder) holds it whole;
    never builds."""
    name = folder_name(build_key(toolchain(), cpu_model(), _cpu_flags()))
    for folder in (usable_cache_root(), fallback_root()):
        m = intact(folder / name)
        if m is not None:
            return GgmlBuild(folder / name, m)
    return None


def missing_tools() -> str | None:
    """What a build here lacks, or None."""
    if not shutil.which("cmake"):
        return "cmake is not installed (ggml builds with cmake: apt-get install cmake)"
    try:
        toolchain()
    except BuildError as exc:
        return str(exc)
    return None


# ---- the build -------------------------------------------------------------------

def run_logged(cmd: list[str], log: Path, cwd: Path | None = None,
               on_line=None) -> int:
    """cmd in a process group of its own, its output into log (each line to on_line);
    the whole group killed if this is interrupted. Its exit status."""
    env = {k: v for k, v in os.environ.items() if k not in _UNKEYED_ENV}
    with open(log, "a") as fh:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                fh.write(line)
                if on_line is not None:
                    on_line(line)
            return proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            proc.stdout.close()


@contextlib.contextmanager
def _sigterm_ends_the_build():
    """SIGTERM ends the build as an exception does (exit 143), so that the cmake and
    compiler processes are killed and the temporary folder removed on the way out (the
    main thread only: elsewhere the handler is left as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, end)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _last_lines(log: Path, n: int = 1) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["(no output)"])[0 if errors else -n]


def _failed(log: Path, kept: Path, what: str) -> BuildError:
    """The error for a failed step, its log copied out of the temporary folder first."""
    shutil.copyfile(log, kept)
    return BuildError(f"{what} failed: {_last_lines(log)} (log: {kept})")


def _compile(src: Path, work: Path, tools: Toolchain, kept_log: Path) -> None:
    log = work / "build.log"
    say(f"configuring llama.cpp's CMakeLists in {work}")
    cmake = [tools.cmake, "-S", str(src), "-B", str(work / "cmake"),
             f"-DCMAKE_C_COMPILER={tools.cc[0]}", f"-DCMAKE_CXX_COMPILER={tools.cxx[0]}",
             f"-DCMAKE_C_FLAGS={' '.join(tools.cc[1:])}",
             f"-DCMAKE_CXX_FLAGS={' '.join(tools.cxx[1:])}", *CMAKE_FLAGS]
    if run_logged(cmake, log) != 0:
        raise _failed(log, kept_log, "configuring ggml")
    jobs = max(1, min(MAX_JOBS, len(os.sched_getaffinity(0))))
    say(f"compiling {', '.join(TARGETS)} with {jobs} jobs (about two minutes)")
    compiled, linked = [0], set()

    def progress(line: str) -> None:
        # (cmake's own percentages count the targets not built: sources and links are said)
        if "Building " in line:
            compiled[0] += 1
            if compiled[0] % 8 == 0:
                say(f"{compiled[0]} sources compiled")
        m = re.search(r"Built target (\S+)", line)
        if m and m.group(1) not in linked:  # (make says it again for each dependant)
            linked.add(m.group(1))
            say(f"{m.group(1)} linked")

    build = [tools.cmake, "--build", str(work / "cmake"), "-j", str(jobs), "--target", *TARGETS]
    if run_logged(build, log, on_line=progress) != 0:
        raise _failed(log, kept_log, "compiling ggml")


def _assemble(work: Path, src: Path, out: Path, manifest: dict) -> None:
    """The libraries (with their soname links), the headers and the sealed manifest in
    out, a folder of its own."""
    (out / "lib").mkdir(parents=True)
    shutil.copytree(src / "ggml" / "include", out / "include")
    files = {}
    for p in sorted((work / "cmake" / "bin").glob("libggml*.so*")):
        dest = out / "lib" / p.name
        if p.is_symlink():
            os.symlink(os.readlink(p), dest)
        else:
            shutil.copy2(p, dest)
            files[f"lib/{p.name}"] = file_sha256(dest)
    if not any(name.startswith("lib/libggml-cpu.so") for name in files):
        raise BuildError("the ggml build made no libggml-cpu.so")
    manifest["files"] = files
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    seal(out / MANIFEST)


def _ggml_version(src: Path) -> str:
    text = (src / "ggml" / "CMakeLists.txt").read_text()
    parts = [re.search(rf"set\(GGML_VERSION_{p} (\d+)\)", text) for p in
             ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def build(force: bool = False) -> GgmlBuild:
    """ggml from the cache, or built into it (minutes; progress on stderr)."""
    found = None if force else find()
    if found is not None:
        return found
    why = missing_tools()
    if why:
        raise BuildError(why)
    tools = toolchain()
    key = build_key(tools, cpu_model(), _cpu_flags())
    root = build_root(usable_cache_root())
    dest = root / folder_name(key)
    with _sigterm_ends_the_build(), file_lock(root / f"{folder_name(key)}.lock"):
        m = None if force else intact(dest)
        if m is not None:  # (built meanwhile by another process)
            return GgmlBuild(dest, m)
        clean_stale_builds(root, folder_name(key))
        sdist = sdist_path(usable_cache_root())
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"sdpa_probe_build_{folder_name(key)}_",
                                         dir=root) as tmp:
            work = Path(tmp)
            src = work / "llama.cpp"
            say(f"building ggml from {sdist.name} in {work}")
            commit = extract(sdist, src)
            _compile(src, work, tools, root / f"{folder_name(key)}-failed.log")
            manifest = {"ggml_version": _ggml_version(src), "llama_cpp_commit": commit,
                        "sdist": SDIST_FILE, "sdist_sha256": SDIST_SHA256,
                        "cmake_flags": list(CMAKE_FLAGS), "targets": list(TARGETS),
                        "cc": " ".join(tools.cc), "cc_version": tools.cc_version,
                        "cxx": " ".join(tools.cxx), "cmake": tools.cmake_version,
                        "cpu": cpu_model(), "seconds": round(time.perf_counter() - t0, 1)}
            _assemble(work, src, work / "out", manifest)
            _replace_folder(work / "out", dest, work)
        say(f"built in {time.perf_counter() - t0:.0f} s: {dest}")
    return GgmlBuild(dest, manifest, cached=False)


def _replace_folder(new: Path, dest: Path, work: Path) -> None:
    """new moved to dest whole; an old dest (forced, or damaged) set aside first."""
    if dest.exists():
        os.replace(dest, work / "old")
    os.replace(new, dest)


# ---- the module that drives it ----------------------------------------------------

ADAPTER_DIR = NATIVE_DIR / "ggml"
ADAPTER_CDEF = """
enum ggml_sdpa_kv_type { GGML_SDPA_F32 = 0, GGML_SDPA_F16 = 1, GGML_SDPA_BF16 = 2 };
enum ggml_sdpa_part { GGML_SDPA_Q = 0, GGML_SDPA_K = 1, GGML_SDPA_V = 2, GGML_SDPA_MASK = 3,
                      GGML_SDPA_OUT = 4 };
typedef struct ggml_sdpa_shape {
  int32_t batch, n_heads, n_kv_heads, q_len, kv_len, head_dim;
  int32_t kv_type; int32_t flash; float scale;
} ggml_sdpa_shape;
typedef struct ggml_sdpa_pool ggml_sdpa_pool;
typedef struct ggml_sdpa ggml_sdpa;
ggml_sdpa_pool *ggml_sdpa_pool_new(int32_t n_threads);
void ggml_sdpa_pool_free(ggml_sdpa_pool *pool);
ggml_sdpa *ggml_sdpa_new(const ggml_sdpa_shape *shape, ggml_sdpa_pool *pool, char *err,
                         size_t err_len);
void ggml_sdpa_free(ggml_sdpa *g);
void *ggml_sdpa_data(ggml_sdpa *g, int32_t part);
size_t ggml_sdpa_nbytes(ggml_sdpa *g, int32_t part);
int32_t ggml_sdpa_compute(ggml_sdpa *g);
int32_t ggml_sdpa_compute_loop(ggml_sdpa *const *graphs, int32_t n_graphs, int32_t first,
                               int32_t n, double *seconds);
const char *ggml_sdpa_ggml_version(void);
"""


def adapter_spec(ggml: GgmlBuild) -> BuildSpec:
    """native/ggml/ggml_sdpa.c against this ggml's headers, linked to its libraries
    (ggml-base: the graph; ggml-cpu: its compute) with an rpath to them."""
    lib = ggml.lib_dir
    return BuildSpec(
        stem="sdpa_probe_ggml", cdef=ADAPTER_CDEF, source='#include "ggml_sdpa.h"\n',
        sources=(ADAPTER_DIR / "ggml_sdpa.c",),
        headers=(ADAPTER_DIR / "ggml_sdpa.h", ggml.path / MANIFEST),
        include_dirs=(ADAPTER_DIR, ggml.include_dir),
        extra_link=(f"-L{lib}", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{lib}"))


def build_adapter(ggml: GgmlBuild, force: bool = False) -> BuildResult:
    return build_module(adapter_spec(ggml), force=force)
