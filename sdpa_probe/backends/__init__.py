"""The SDPA paths under test, behind one Backend protocol (base.py) and one registry
(registry.py): our native kernels and a user's (native_kernel.py), torch
(torch_sdpa.py), ExecuTorch (executorch.py), ONNX Runtime's attention ops
(onnxruntime_attention.py, onnxruntime_contrib.py)."""

from .base import Backend, Nondeterministic, Unsupported, describe_failure
from .executorch import ExecutorchBackend, executorch_library, executorch_version
from .native_kernel import NativeBackend
from .registry import (
    REGISTERED,
    BackendSpec,
    default_specs,
    is_kernel_file,
    known_names,
    make,
    parse,
    parse_list,
)
from .torch_sdpa import TorchBackend, torch_error

__all__ = ["Backend", "BackendSpec", "ExecutorchBackend", "NativeBackend", "Nondeterministic",
           "REGISTERED", "TorchBackend", "Unsupported", "default_specs", "describe_failure",
           "executorch_library", "executorch_version", "is_kernel_file", "known_names", "make",
           "parse", "parse_list", "torch_error"]
