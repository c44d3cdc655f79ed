"""Every backend the tool can run, and the one place a backend's name is parsed.

A name is one of:
  - a registered backend (REGISTERED below: "torch", "executorch", ...),
  - one of our native kernels ("flash", "decomposed", ...: `probe kernels` lists them),
  - a kernel file of the user's (a path ending in .c, .cpp, .cc, .cxx or .so),
  - "all": every backend: our native kernels and every registered one (those that
    cannot run here are left out by the command, with why).
Adding a backend is one module with a class that follows backends.base.Backend, plus
one line in REGISTERED (docs/backends.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import native
from ..errors import ProbeError
from .executorch import ExecutorchBackend
from .ggml_attention import GgmlBackend, GgmlNofaBackend
from .native_kernel import NativeBackend
from .onnxruntime_attention import OnnxRuntimeBackend
from .onnxruntime_contrib import OnnxRuntimeGqaBackend, OnnxRuntimeMhaBackend
from .openvino_sdpa import OpenvinoBackend, OpenvinoBf16Backend, OpenvinoF16Backend
from .openvino_stateful import OpenvinoStatefulBackend
from .torch_sdpa import TorchBackend

# name -> backend class, one line each
REGISTERED: dict[str, type] = {
    "torch": TorchBackend,
    "executorch": ExecutorchBackend,
    "onnxruntime": OnnxRuntimeBackend,
    "onnxruntime-gqa": OnnxRuntimeGqaBackend,
    "onnxruntime-mha": OnnxRuntimeMhaBackend,
    "openvino": OpenvinoBackend,
    "openvino-bf16": OpenvinoBf16Backend,
    "openvino-f16": OpenvinoF16Backend,
    "openvino-stateful": OpenvinoStatefulBackend,
    "ggml": GgmlBackend,
    "ggml-nofa": GgmlNofaBackend,
}
KERNEL_FILE_SUFFIXES = (".c", ".cpp", ".cc", ".cxx", ".so")
# how kernel files were named in records written before a file was its own name
_LEGACY_FILE_PREFIX = "user:"


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A parsed backend name: `kind` is "registered", "native" or "file"; `name` is what
    reports call it (and what parse() reads back: a file's path as given)."""

    kind: str
    name: str

    @property
    def path(self) -> Path | None:
        return Path(self.name) if self.kind == "file" else None

    @property
    def label(self) -> str:
        """A short name for a table column: a kernel file's name without its folders."""
        return Path(self.name).name if self.kind == "file" else self.name

    def why_unavailable(self) -> str | None:
        if self.kind == "registered":
            return REGISTERED[self.name].why_unavailable()
        return NativeBackend.why_unavailable()


def is_kernel_file(text: str) -> bool:
    return text.startswith(_LEGACY_FILE_PREFIX) or text.lower().endswith(KERNEL_FILE_SUFFIXES)


def known_names() -> list[str]:
    return list(native.builtin_kernels()) + list(REGISTERED)


def parse(text: str, what: str = "backend") -> BackendSpec:
    """One backend name as the user (or a record) wrote it; ProbeError if unknown
    (`what` names it in the error: a command that takes a kernel says kernel)."""
    text = text.strip()
    if is_kernel_file(text):
        return BackendSpec("file", text.removeprefix(_LEGACY_FILE_PREFIX))
    if text in REGISTERED:
        return BackendSpec("registered", text)
    if text in native.builtin_kernels():
        return BackendSpec("native", text)
    raise ProbeError(f"unknown {what} {text!r}; known: {', '.join(known_names())}, "
                     f"or a kernel file ({', '.join(KERNEL_FILE_SUFFIXES)})")


def parse_list(texts: list[str] | None) -> list[BackendSpec]:
    """Comma-separated lists of names (repeated options), "all" expanded (every native
    kernel and every registered backend), in order, each once."""
    specs: list[BackendSpec] = []
    for text in texts or ():
        for part in text.split(","):
            if not part.strip():
                continue
            if part.strip() == "all":
                specs += [BackendSpec("native", n) for n in native.builtin_kernels()]
                specs += [BackendSpec("registered", n) for n in REGISTERED]
            else:
                specs.append(parse(part))
    return list(dict.fromkeys(specs))


def default_specs() -> list[BackendSpec]:
    """What `probe check` runs when no backend is named: every native kernel at F32
    precision and torch (the runtimes, and flash_bf16 with its BF16 products, are asked
    for by name, or with "all")."""
    return [BackendSpec("native", n) for n, k in native.builtin_kernels().items()
            if "bf16-products" not in k.info.features] + [BackendSpec("registered", "torch")]


def worker_groups(specs: list[BackendSpec]) -> list[list[str]]:
    """The backends' names in the groups that share worker processes, in order: our
    kernels, kernel files and torch in one; each runtime's module in one of its own. A
    runtime's thread pools, allocator and state stay out of the processes that judge
    other backends (a pool that spins after its call reads as the threads of the next
    kernel the worker calls), and a runtime that aborts takes none of them down."""
    groups: dict[str, list[str]] = {}
    for s in specs:
        own = s.kind == "registered" and s.name != "torch"
        groups.setdefault(REGISTERED[s.name].__module__ if own else "", []).append(s.name)
    return list(groups.values())


def make(spec: BackendSpec | str):
    """The backend object for a spec (or a name, parsed)."""
    if isinstance(spec, str):
        spec = parse(spec)
    if spec.kind == "registered":
        return REGISTERED[spec.name]()
    if spec.kind == "file":
        return NativeBackend(spec.name, path=spec.path)
    return NativeBackend(spec.name)
