import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_KERNEL = REPO / "docs" / "examples" / "minimal_sdpa.c"
