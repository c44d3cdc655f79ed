import os

# torch's OpenMP threads spin after each parallel op (the oracle's, made in this process
# by tests that call a kernel here rather than in check's workers, which run torch on one
# thread); on a busy machine a spinning thread waits for a CPU long enough for the
# thread-use judge to count it against the kernel. Sleeping at once, they do not.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


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


@pytest.fixture(autouse=True, scope="session")
def _last_check_file(tmp_path_factory):
    """`probe check` keeps its failures for --last-failed; the tests' runs keep theirs in
    a file of their own, not in the user's cache."""
    saved = os.environ.get("SDPA_PROBE_LAST_CHECK")
    os.environ["SDPA_PROBE_LAST_CHECK"] = str(tmp_path_factory.mktemp("state") / "last.json")
    yield
    if saved is None:
        os.environ.pop("SDPA_PROBE_LAST_CHECK", None)
    else:
        os.environ["SDPA_PROBE_LAST_CHECK"] = saved
