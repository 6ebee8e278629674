"""XLM-E replaced-token detection: every loss term and metric against numpy from the same
logits, labels and masks; the label of a sample equal to the original; where the gradients of
each loss go; masking as the paper says; the argument errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params, objective_loss, report
from xlm_jax.objectives import vocab_sampling
from xlm_jax.objectives.masking import regular_token_logits
from xlm_jax.objectives.xlme import ReplacedTokenDetection, replaced_ids

CFG = get_config("tiny", vocab_size=64, num_layers=3, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 position_type="both")


def _setup(kind="mono", **kw):
    net = Transformer(CFG)
    obj = ReplacedTokenDetection(net, name="rtd", kind=kind, generator_layers=1,
                                 max_predictions=6, mask_prob=0.3, **kw)
    params = nn.meta.unbox(init_params(net, [WeightedObjective(obj)], 16, jax.random.PRNGKey(0)))
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 16, 64, kind, seed=2).items()}
    return net, obj, params, obj.prepare(batch, jax.random.PRNGKey(3))


def _np_ce(logits, targets, weights):
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    w = np.asarray(weights)
    return (nll * w).sum(), ((z.argmax(-1) == np.asarray(targets)) * w).sum()


@pytest.mark.parametrize("kind, narrow", [("mono", False), ("pair", False), ("mono", True)])
def test_loss_terms_and_metrics_match_numpy(kind, narrow):
    net, obj, params, prep = _setup(kind, generator_hidden_size=16 if narrow else None)
    assert ("embedding_projection" in params["objectives"]["generator"]) == narrow
    assert "word_embeddings" not in params["objectives"]["generator"]["embeddings"]
    f = obj.forward(params, prep, jax.random.PRNGKey(5), deterministic=True)
    out = obj.loss(params, prep, jax.random.PRNGKey(5), {}, deterministic=True)

    original, pos = np.asarray(prep["original_ids"]), np.asarray(prep["target_positions"])
    w, sampled = np.asarray(prep["target_weights"]), np.asarray(f.sampled)
    assert w.sum() >= 8 and (np.asarray(prep["input_ids"])[original != np.asarray(
        prep["input_ids"])] == CFG.vocab_size - 1).all()  # every selected token -> <mask>
    disc = original.copy()
    for b in range(4):
        for j in range(pos.shape[1]):
            if w[b, j]:
                disc[b, pos[b, j]] = sampled[b, j]
    np.testing.assert_array_equal(np.asarray(f.disc_ids), disc)
    labels = (disc != original).astype(np.float64)
    np.testing.assert_array_equal(np.asarray(f.labels), labels)
    assert 0 < labels.sum() < w.sum() + 1 and (sampled < CFG.vocab_size).all()
    assert (sampled >= 4).all() and (sampled != CFG.vocab_size - 1).all()  # regular tokens

    mlm, correct = _np_ce(f.gen_logits, prep["target_ids"], w)
    valid = (original != CFG.pad_id).astype(np.float64)
    z = np.asarray(f.rtd_logits, np.float64)
    bce = (np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - labels * z) * valid
    n_mask, n_tok = w.sum(), valid.sum()
    np.testing.assert_allclose(float(f.mlm_sum), mlm, rtol=1e-5)
    np.testing.assert_allclose(float(f.rtd_sum), bce.sum(), rtol=1e-5)
    counts = obj.counts(prep)
    assert obj.term_weights == {"mlm": 1.0, "rtd": 50.0}
    assert float(counts["mlm"]) == n_mask and float(counts["rtd"]) == n_tok
    np.testing.assert_allclose(float(out.losses["mlm"]), mlm, rtol=1e-5)
    np.testing.assert_allclose(float(out.losses["rtd"]), bce.sum(), rtol=1e-5)
    np.testing.assert_allclose(float(objective_loss(obj, out.losses, counts)),
                               mlm / n_mask + 50.0 * bce.sum() / n_tok, rtol=1e-5)
    pred = (z > 0) * valid
    got = report(obj, out.losses, out.metrics, counts)
    np.testing.assert_allclose(float(got["mlm_loss"]), mlm / n_mask, rtol=1e-5)
    assert float(got["mlm_accuracy"]) == pytest.approx(correct / n_mask, rel=1e-6)
    np.testing.assert_allclose(float(got["rtd_loss"]), bce.sum() / n_tok, rtol=1e-5)
    np.testing.assert_allclose(float(got["rtd_accuracy"]),
                               ((pred == labels) * valid).sum() / n_tok, rtol=1e-6)
    np.testing.assert_allclose(float(got["rtd_precision"]),
                               (pred * labels).sum() / max(pred.sum(), 1), rtol=1e-6)
    np.testing.assert_allclose(float(got["rtd_recall"]),
                               (pred * labels).sum() / labels.sum(), rtol=1e-6)
    assert float(got["replaced_fraction"]) == pytest.approx(labels.sum() / n_mask, rel=1e-6)
    assert float(got["count"]) == n_mask + n_tok


def test_the_sampler_setting_draws_the_replacements():
    """`sampler='two_level'` draws each row's replacements with `vocab_sampling.categorical` from
    the generator's regular-token logits and that row's key; 'gumbel' keeps
    `jax.random.categorical`'s draws (vocab_sampling_test.py: both follow the softmax)."""
    draws = {}
    for sampler in ("gumbel", "two_level"):
        _, obj, params, prep = _setup(sampler=sampler)
        f = obj.forward(params, prep, jax.random.PRNGKey(5), deterministic=True)
        logits = regular_token_logits(f.gen_logits, obj.masking)
        if sampler == "gumbel":
            expected = jax.vmap(lambda k, lg: jax.random.categorical(k, lg, axis=-1))(
                prep["sample_keys"], logits)
        else:
            expected = jax.vmap(lambda k, lg: vocab_sampling.categorical(k, lg, "two_level"))(
                prep["sample_keys"], logits)
        np.testing.assert_array_equal(np.asarray(f.sampled), np.asarray(expected))
        draws[sampler] = np.asarray(f.sampled)[np.asarray(prep["target_weights"]) > 0]
        assert (draws[sampler] >= 4).all() and (draws[sampler] != CFG.vocab_size - 1).all()
    assert (draws["gumbel"] != draws["two_level"]).any()  # other draws, the same softmax


def test_a_sample_equal_to_the_original_is_labelled_original():
    original = jnp.array([[0, 10, 11, 12, 2, 1]])
    positions = jnp.array([[1, 2, 3, 0]])
    weights = jnp.array([[1.0, 1.0, 1.0, 0.0]])  # the last slot is unused
    sampled = jnp.array([[10, 40, 12, 55]])  # slot 0 and 2 re-draw the original
    ids, labels = replaced_ids(original, positions, sampled, weights)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 10, 40, 12, 2, 1]])
    np.testing.assert_array_equal(np.asarray(labels), [[0, 0, 1, 0, 0, 0]])


def test_discriminator_loss_sends_no_gradient_to_the_generator():
    for narrow in (None, 16):
        _, obj, params, prep = _setup(generator_hidden_size=narrow)

        # one compiled function for both gradients (eager grads of the forward took ~40 s)
        rtd, mlm = jax.jit(lambda p: tuple(jax.grad(
            lambda q, n=name: getattr(obj.forward(q, prep, jax.random.PRNGKey(5), True), n))(p)
            for name in ("rtd_sum", "mlm_sum")))(params)
        gen_leaves = jax.tree_util.tree_leaves(rtd["objectives"]["generator"])
        assert gen_leaves and all(float(jnp.abs(g).max()) == 0.0 for g in gen_leaves)
        assert all(float(jnp.abs(g).max()) == 0.0
                   for g in jax.tree_util.tree_leaves(mlm["objectives"]["rtd_head"]))
        table = ("encoder", "embeddings", "word_embeddings", "embedding")
        for grads in (rtd, mlm):  # the shared table learns from both losses
            g = grads
            for k in table:
                g = g[k]
            assert float(jnp.abs(g).sum()) > 0
        assert float(jnp.abs(mlm["objectives"]["generator"]["mlm_head"]["dense"]["kernel"]).sum()) > 0


@pytest.mark.parametrize("kw, match", [
    ({"generator_layers": 4}, r"generator_layers=4 is deeper than the discriminator \(3"),
    ({"generator_hidden_size": 64}, r"generator_hidden_size=64 is wider than the discrimin"),
    ({"rtd_weight": -1.0}, r"rtd_weight=-1.0 \(lambda\) must be >= 0"),
    ({"kind": "split_pair"}, r"kind='split_pair' must be one of mono, pair"),
    ({"generator_position_type": "rotary"}, r"generator_position_type='rotary'"),
    ({"sampler": "top_k"}, r"sampler='top_k' must be one of gumbel, two_level, auto"),
])
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ReplacedTokenDetection(Transformer(CFG), **{"generator_layers": 1, **kw})
