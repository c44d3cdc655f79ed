import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_KERNEL = REPO / "docs" / "examples" / "minimal_sdpa.c"

import shutil  # noqa: E402

# C++ user kernels need a C++ compiler beside the C one (g++ / c++)
needs_cxx = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                               reason="no C++ compiler (g++ / c++) on this machine")
