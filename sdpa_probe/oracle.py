"""A case made ready to judge: its inputs from its seed, the float64 oracle's output
and torch's own error on the same stored inputs (the tolerance's floor), computed
live or read from golden data."""

from __future__ import annotations

import dataclasses

from .backends import torch_error
from .cases import Case
from .golden import store
from .inputs import materialise
from .reference import sdpa_reference


@dataclasses.dataclass
class Prepared:
    data: object
    ref: object
    torch_err: float | None
    products: str | None = None  # torch_err is torch's error computing in this dtype


def for_products(prep: Prepared, products: str | None) -> Prepared:
    """prep for a backend whose products round to `products` (NativeBackend.products):
    torch_err becomes torch's own error computing in that dtype on the same inputs, the
    yardstick such a kernel's error is stated and judged against."""
    if products is None or prep.products == products or prep.ref is None:
        return prep
    return dataclasses.replace(prep, torch_err=torch_error(prep.data, prep.ref, products),
                               products=products)


def prepare_case(case: Case, golden=None) -> Prepared:
    """Inputs from the case's seed, plus the float64 reference and torch's own error:
    computed live, or with `golden` (a golden directory) read from the stored golden
    data, with no oracle or torch SDPA call (GoldenError if the case is not stored)."""

    data = materialise(case)
    if not case.needs_reference:  # (an invalid call: judged on its status)
        return Prepared(data, None, None)
    if golden is not None:

        ref, terr = store(golden).reference(case, data)
        return Prepared(data, ref, terr)

    ref = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                         start_pos=case.start_pos, scale=case.scale).numpy()
    return Prepared(data, ref, torch_error(data, ref))
