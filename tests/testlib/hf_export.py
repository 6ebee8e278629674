"""Shared by the export tests: an exported HF directory against the xlm_jax model it came from."""
from __future__ import annotations

import numpy as np


def assert_export_parity(hf_dir, model_dir, ids: np.ndarray, atol: float = 1e-4) -> int:
    """`transformers.XLMRobertaForMaskedLM` loaded from `hf_dir` and `load_encoder(model_dir)`
    give the same hidden states at every layer (padding positions, id 1, left out) within
    `atol`; returns the number of hidden-state layers compared."""
    import torch
    import transformers

    from xlm_jax.encoder import load_encoder

    model = transformers.XLMRobertaForMaskedLM.from_pretrained(str(hf_dir)).eval()
    mask = (ids != 1).astype(np.int64)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    output_hidden_states=True).hidden_states
    ours = load_encoder(str(model_dir)).hidden_states(ids, mask)
    assert len(ref) == len(ours)
    for layer, r in enumerate(ref):
        np.testing.assert_allclose(ours[layer] * mask[..., None], r.numpy() * mask[..., None],
                                   atol=atol, err_msg=f"layer {layer}")
    return len(ref)
