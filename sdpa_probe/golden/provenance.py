"""What a golden set was made under (versions, CPU) and what its references encode
(the oracle's conventions, observed live)."""

from __future__ import annotations

import math

import numpy as np

from ..build import cpu_model


def semantics() -> dict:
    """The conventions the reference encodes, observed from the live oracle (not
    asserted), so an oracle that changes them shows up as a semantics change."""
    # deferred: torch takes seconds to import
    import torch

    # deferred: the oracle imports torch
    from ..reference import bias_matrix, sdpa_reference

    q = torch.ones(1, 2, 1, 2, dtype=torch.float64)
    kv = torch.ones(1, 3, 1, 2, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 0.0], [-math.inf] * 3])
    row = sdpa_reference(q, kv, kv, mask=mask)[0, 1, 0]
    if bool(torch.all(row == 0)):
        masked = "zeros"
    elif bool(torch.all(torch.isnan(row))):
        masked = "nan"
    else:
        masked = "other: " + ", ".join(f"{x:g}" for x in row.tolist())
    vis = torch.isfinite(bias_matrix(3, 6, is_causal=True, start_pos=2)).numpy()
    i, j = np.arange(3)[:, None], np.arange(6)[None, :]
    if (vis == (j <= 2 + i)).all():
        causal = "query row i sees key j iff j <= start_pos + i (bottom-right when " \
                 "start_pos = kv_len - q_len)"
    else:
        causal = "other: " + str(vis.astype(int).tolist())
    return {"fully_masked_rows": masked, "causal_alignment": causal,
            "gqa": "kv head of query head h = h // (n_heads / n_kv_heads)",
            "mask": "additive float32 [q_len, kv_len] on the scaled logits; -inf hides a key",
            "scale": "scale <= 0 means 1/sqrt(head_dim)",
            "reference": "float64, [batch, q_len, n_heads, head_dim], from the stored "
                         "(rounded / dequantised) input values",
            "torch_err": "max |torch SDPA in the storage dtype - reference| (NaN: no torch path)"}


def versions() -> dict:
    # deferred: torch takes seconds to import
    import torch

    # torch's CPU kernels, and so torch_err, differ by the ISA they dispatch to
    # (AVX2 / AVX512) and, through its BLAS's per-vendor and per-model code paths,
    # by the CPU: the same torch read 1.15e-06 on a Zen 5 and 2.5e-06 on a Xeon,
    # both AVX512. A torch_err recorded on another CPU is not comparable.
    return {"torch": torch.__version__, "numpy": np.__version__,
            "torch_cpu": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model()}


def torch_err_comparable(man_a: dict | None, man_b: dict | None) -> bool:
    """Whether torch_err values recorded under these two manifests' versions can be
    compared: the same torch CPU capability (ISA) and CPU model, both recorded."""
    va = (man_a or {}).get("versions") or {}
    vb = (man_b or {}).get("versions") or {}
    return all(va.get(k) is not None and va.get(k) == vb.get(k) for k in ("torch_cpu", "cpu"))
