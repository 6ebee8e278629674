"""Vocabulary padding (`pad_vocab_to_multiple_of`): a padded model computes exactly what the
unpadded one does, its padding ids can never win, and HF import/export round-trips through it."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from xlm_jax.convert import hf
from xlm_jax.models.config import get_config
from xlm_jax.models.heads import PADDED_LOGIT
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import masked_lm_sums

SMALL = dict(vocab_size=250, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
             max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)


def test_padded_vocab_size_rounds_up():
    assert get_config("tiny", **SMALL).padded_vocab_size == 250
    assert get_config("tiny", **SMALL, pad_vocab_to_multiple_of=128).padded_vocab_size == 256
    assert get_config("tiny", **SMALL, pad_vocab_to_multiple_of=125).padded_vocab_size == 250
    assert get_config("base", pad_vocab_to_multiple_of=128).padded_vocab_size == 250112
    with pytest.raises(ValueError, match=r"ModelConfig.pad_vocab_to_multiple_of=0: must be a "
                                         r"positive integer"):
        get_config("tiny", **SMALL, pad_vocab_to_multiple_of=0)


def _ids():
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 250, (3, 10)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    ids[2, 6:] = 1
    return ids


def _padded_copy(params, cfg):
    """The unpadded params with every vocabulary table zero-padded as `hf.pad_vocab` does."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    out = {}
    for path, value in flat:
        name = "/".join(k.key for k in path)
        hf._set(out, name, hf.pad_vocab(name, np.asarray(value), cfg))
    return out


def test_padded_model_equals_unpadded_and_never_predicts_padding():
    plain_cfg = get_config("tiny", **SMALL)
    pad_cfg = plain_cfg.replace(pad_vocab_to_multiple_of=64)
    ids = _ids()
    plain, padded = Transformer(plain_cfg), Transformer(pad_cfg)
    params = nn.meta.unbox(plain.init(jax.random.PRNGKey(0), ids))["params"]
    pparams = _padded_copy(params, pad_cfg)
    assert pparams["embeddings"]["word_embeddings"]["embedding"].shape == (256, 32)
    assert pparams["mlm_head"]["bias"].shape == (256,)
    # the padded model accepts exactly these shapes (same tree as its own init)
    hf.check_params(pparams, pad_cfg, "padded")

    def logits(model, p):
        def fn(mdl):
            h = mdl.encode(ids).last_hidden_state
            return mdl.full_mlm_logits(h), h
        return model.apply({"params": p}, method=fn)

    a, ha = logits(plain, params)
    b, hb = logits(padded, pparams)
    np.testing.assert_allclose(np.asarray(hb), np.asarray(ha), atol=1e-6, rtol=0)
    assert a.shape[-1] == 250 and b.shape[-1] == 256
    np.testing.assert_allclose(np.asarray(b[..., :250]), np.asarray(a), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(b[..., 250:]), PADDED_LOGIT)
    # the loss over the padded width equals the loss over the real vocabulary
    targets = ids
    w = (ids != 1).astype(np.float32)
    la, ca = masked_lm_sums(a, targets, w)
    lb, cb = masked_lm_sums(b, targets, w)
    np.testing.assert_allclose(float(lb), float(la), rtol=1e-6)
    assert float(cb) == float(ca)
    assert int(np.asarray(b).argmax(-1).max()) < 250


def test_padding_rows_get_no_gradient_from_the_head():
    cfg = get_config("tiny", **SMALL, pad_vocab_to_multiple_of=64)
    model = Transformer(cfg)
    ids = _ids()
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids))["params"]

    def loss(p):
        def fn(mdl):
            h = mdl.encode(ids).last_hidden_state
            return mdl.mlm_logits(h, np.tile(np.arange(10, dtype=np.int32), (3, 1)))
        lg = model.apply({"params": p}, method=fn)
        return masked_lm_sums(lg, ids, np.ones(ids.shape, np.float32))[0]

    g = jax.jit(jax.grad(loss))(params)
    emb = np.asarray(g["embeddings"]["word_embeddings"]["embedding"])
    bias = np.asarray(g["mlm_head"]["bias"])
    assert np.abs(emb[:250]).max() > 0 and np.abs(bias[:250]).max() > 0
    np.testing.assert_array_equal(emb[250:], 0.0)
    np.testing.assert_array_equal(bias[250:], 0.0)
