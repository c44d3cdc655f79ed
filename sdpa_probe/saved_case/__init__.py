"""A failing case saved for a standalone C driver (`probe check --save DIR`): its raw
inputs, the reference, driver.c and a Makefile that builds it against your kernel with
-fsanitize=address,undefined -g, so that the bug can be chased under gdb or ASan without
Python.

driver_source.py  the driver's C source and the Makefile
writer.py         the files: raw tensors as the kernel read them, case.h, the rest
failures.py       the failing cases of a check run, one directory each"""

from __future__ import annotations

from .failures import SAVE_MAX_CASES, save_failures
from .writer import check_save_dir, save_case, span

__all__ = ["SAVE_MAX_CASES", "check_save_dir", "save_case", "save_failures", "span"]
