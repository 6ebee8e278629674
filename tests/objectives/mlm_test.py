"""MMLM/TLM loss against an independent computation: full-vocabulary logits + numpy CE."""
import flax.linen as nn
import jax
import numpy as np

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import MaskedLM, masked_lm_sums


def _np_ce(logits, targets, weights):
    logits = logits.astype(np.float64)
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return (nll * weights).sum(), ((logits.argmax(-1) == targets) * weights).sum()


def test_masked_lm_sums_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, (3, 5))
    weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
    loss, correct = masked_lm_sums(logits, targets, weights)
    ref_loss, ref_correct = _np_ce(logits, targets, weights)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    assert float(correct) == ref_correct


def test_tlm_loss_equals_full_logits_at_masked_positions():
    cfg = get_config("tiny", vocab_size=300, num_layers=2, hidden_size=32, num_heads=4,
                     mlp_dim=64, max_positions=66, dropout_rate=0.0, attention_dropout_rate=0.0)
    model = Transformer(cfg)
    batch = synthetic_batch(4, 32, 300, "pair", seed=1)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch["input_ids"])["params"])
    obj = MaskedLM(model, name="tlm", kind="pair", max_predictions=8)
    prep = obj.prepare(batch, jax.random.PRNGKey(3))
    # corrupted inputs differ from the originals exactly where targets sit (or keep 10%)
    sel = np.zeros((4, 32), bool)
    w = np.asarray(prep["target_weights"]) > 0
    for b in range(4):
        sel[b, np.asarray(prep["target_positions"])[b][w[b]]] = True
        np.testing.assert_array_equal(np.asarray(prep["target_ids"])[b][w[b]],
                                      batch["input_ids"][b][sel[b]])
    assert (np.asarray(prep["input_ids"])[~sel] == batch["input_ids"][~sel]).all()
    assert w.sum() > 0

    out = obj.loss({"encoder": params, "objectives": {}}, prep, jax.random.PRNGKey(4), {},
                   deterministic=True)

    def full(mdl):
        h = mdl.encode(prep["input_ids"], positions=prep["positions"],
                       segment_ids=prep["segment_ids"]).last_hidden_state
        return mdl.full_mlm_logits(h)

    logits = np.asarray(model.apply({"params": params}, method=full))
    picked = np.take_along_axis(logits, np.asarray(prep["target_positions"])[..., None], 1)
    ref_loss, ref_correct = _np_ce(picked, np.asarray(prep["target_ids"]),
                                   np.asarray(prep["target_weights"]))
    np.testing.assert_allclose(float(out.losses["loss"]), ref_loss, rtol=1e-5)
    assert float(out.metrics["accuracy"].total) == ref_correct
    assert float(out.metrics["accuracy"].count) == w.sum() == float(obj.counts(prep)["loss"])
