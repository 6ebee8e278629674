"""VECO reassembly: the NLU encoder (cross-attention dropped) reproduces the IS-MLM pass
exactly and exports to a transformers XLM-R with hidden-state parity; the NLG split takes the
last (or first) layers with their cross-attention; the errors."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.reassemble import encoder_decoder, nlu_encoder
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params
from xlm_jax.objectives.veco import VariableMLM

CFG = get_config("tiny", vocab_size=64, num_layers=3, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 cross_attention=True)


def _veco_params():
    net = Transformer(CFG)
    obj = VariableMLM(net, mask_prob=0.15, max_predictions=4)
    params = nn.meta.unbox(init_params(net, [WeightedObjective(obj)], 16, jax.random.PRNGKey(0)))
    return obj, params


def test_nlu_encoder_reproduces_the_is_mlm_pass_exactly():
    obj, params = _veco_params()
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(3, 16, 64, "split_pair", seed=2).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(1))
    is_x = obj.encode(params, prep, "x", jax.random.PRNGKey(0), True)
    cfg, enc = nlu_encoder(CFG, params["encoder"])
    assert not cfg.cross_attention
    assert not [k for k in jax.tree_util.tree_flatten_with_path(enc)[0]
                if "cross_attention" in jax.tree_util.keystr(k[0])]
    # the plain encoder has exactly the parameters a cross-attention-free model has
    fresh = Transformer(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"]
    assert (jax.tree_util.tree_structure(nn.meta.unbox(fresh))
            == jax.tree_util.tree_structure(enc))
    out = Transformer(cfg).apply({"params": enc}, prep["x_input_ids"],
                                 positions=prep["x_positions"], segment_ids=prep["x_segment_ids"],
                                 method=Transformer.encode).last_hidden_state
    np.testing.assert_array_equal(np.asarray(out), np.asarray(is_x))


def test_export_hf_writes_the_nlu_encoder_with_parity(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from testlib.hf_export import assert_export_parity
    from xlm_jax.convert import hf
    from xlm_jax.convert.__main__ import main as convert_main

    _, params = _veco_params()  # a VECO stack (post-LN, absolute positions: XLM-R's layout)
    hf.save_xlm_jax(str(tmp_path / "run"), CFG, params["encoder"])
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", str(tmp_path / "run"),
                         "--out", str(out)]) == 0
    ids = np.array([[0, 5, 17, 60, 9, 2, 1, 1], [0, 44, 3, 2, 1, 1, 1, 1]])
    assert assert_export_parity(out, tmp_path / "run", ids) == 4  # the VECO stack's 3 layers
    assert os.path.exists(out / "model.safetensors")


@pytest.mark.parametrize("take, layers", [("last", (1, 2)), ("first", (0, 1))])
def test_encoder_decoder_takes_the_named_layers_with_cross_attention(take, layers):
    _, params = _veco_params()
    split = encoder_decoder(CFG, params["encoder"], 2, take=take)
    assert split.decoder_source_layers == layers and split.decoder_config.num_layers == 2
    assert split.decoder_config.cross_attention and not split.encoder_config.cross_attention
    for i, src in enumerate(layers):
        a = jax.tree_util.tree_leaves(split.decoder_params[f"layers_{i}"])
        b = jax.tree_util.tree_leaves(params["encoder"][f"layers_{src}"])
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert "cross_attention" in split.decoder_params["layers_0"]
    # the decoder runs: causal self-attention over y, cross-attention to the encoder's output
    x = jnp.asarray([[0, 5, 6, 2, 1]])
    h = Transformer(split.encoder_config).apply({"params": split.encoder_params}, x,
                                                method=Transformer.encode).last_hidden_state
    y = jnp.asarray([[0, 9, 10]])
    dec = Transformer(split.decoder_config).apply(
        {"params": split.decoder_params}, y, encoder_states=h,
        attention_mask=jnp.tril(jnp.ones((3, 3), bool))[None, None],
        cross_mask=jnp.asarray(x != 1)[:, None, None, :].repeat(3, axis=2),
        method=Transformer.encode).last_hidden_state
    assert dec.shape == (1, 3, 32) and np.isfinite(np.asarray(dec)).all()


def test_reassembly_errors_name_the_value():
    _, params = _veco_params()
    with pytest.raises(ValueError, match=r"decoder_layers=4 must be in \[1, 3\] \(the encoder "
                                         r"has 3 layers\)"):
        encoder_decoder(CFG, params["encoder"], 4)
    with pytest.raises(ValueError, match=r"take='middle' must be one of last, first"):
        encoder_decoder(CFG, params["encoder"], 2, take="middle")
    with pytest.raises(ValueError, match=r"needs a VECO checkpoint \(cross_attention=True\)"):
        encoder_decoder(CFG.replace(cross_attention=False), params["encoder"], 2)
