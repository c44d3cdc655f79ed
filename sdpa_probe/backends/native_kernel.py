"""A kernel behind the C ABI (native/include/sdpa_probe.h): one of ours from the
compiled kernel set, or a user's C / C++ file or prebuilt .so."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import __version__, native
from ..errors import BuildError
from ..party import NativeParty
from .base import Unsupported


class NativeBackend:
    # every invalid call is made through the C arguments (invalid_args.corrupt)
    INVALID: tuple[str, ...] = ()

    def __init__(self, name: str, kernel: native.Kernel | None = None,
                 path: Path | None = None):
        self.name = name
        self.path = path  # a user's kernel file, or None for one of ours
        self._kernel = kernel

    @classmethod
    def why_unavailable(cls) -> str | None:
        try:
            native.native_lib()
        except BuildError as exc:
            return f"the native kernel set does not build here: {exc}"
        return None

    @property
    def kernel(self) -> native.Kernel:
        if self._kernel is None:
            self._kernel = (native.load_user_kernel(self.path) if self.path is not None
                            else native.get_kernel(self.name))
        return self._kernel

    def version(self) -> str:
        return f"{self.path} (built here)" if self.path else f"sdpa_probe {__version__}"

    @property
    def products(self) -> str | None:
        """The dtype our kernel's products round to ("bf16" for flash_bf16), judged at
        that precision (oracle.for_products); None: F32 products or a user's kernel."""
        if self.path is not None:
            return None
        return "bf16" if "bf16-products" in self.kernel.info.features else None

    def supports(self, case) -> str | None:
        return None  # (the kernel answers for itself: SDPA_UNSUPPORTED is the ABI's way)

    def why_refused(self) -> str:
        """What SDPA_UNSUPPORTED means from this kernel (native.refused_reason)."""
        if self.path is not None:
            return "kernel returned SDPA_UNSUPPORTED"
        return native.refused_reason(self.kernel)

    def timer(self, shape, sets, threads: int) -> NativeParty:
        """Timed in the library's C loop (a user kernel through its sdpa_forward)."""
        return NativeParty(self.kernel, shape, sets, threads)

    def prepare(self, data, out):
        c = data.case
        return native.prepare(self.kernel.ffi, data.q_store, data.k_store, data.v_store, out.view,
                              mask=data.mask, is_causal=c.causal, start_pos=c.start_pos,
                              scale=c.scale, n_threads=c.n_threads)

    def run(self, data, out, call=None) -> None:
        call = call or self.prepare(data, out)
        # (the output copied as the call returns: verdict's written-after-return layer)
        out.at_return = np.empty_like(out.arena)
        status = self.kernel.forward_watched(call.args, out.arena, out.at_return)
        if status == 1:
            raise Unsupported(self.why_refused())
        native.raise_for_status(status, self.name)
