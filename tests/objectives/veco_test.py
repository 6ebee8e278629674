"""VECO IS-MLM + CS-MLM: the loss against numpy from the same logits (Eq. 8: four means),
CS-MLM's stop-gradient into X^(N), the exact causal mask of the CS pass, and the errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params, objective_loss, report
from xlm_jax.objectives.veco import TERMS, VariableMLM, needed_predictions

V = 64
CFG = get_config("tiny", vocab_size=V, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 cross_attention=True)
NET = Transformer(CFG)


def _setup(mask_prob=0.25, length=16, seed=1):
    obj = VariableMLM(NET, mask_prob=mask_prob, max_predictions=needed_predictions(mask_prob,
                                                                                    length))
    params = nn.meta.unbox(init_params(NET, [WeightedObjective(obj)], 16, jax.random.PRNGKey(0)))
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, length, V, "split_pair", seed=seed).items()}
    return obj, params, obj.prepare(batch, jax.random.PRNGKey(3))


def _np_ce(logits, targets, weights):
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    return (nll * np.asarray(weights)).sum() / np.asarray(weights).sum()


def test_loss_is_the_sum_of_four_means():
    obj, params, prep = _setup()
    logits = obj.term_logits(params, prep, jax.random.PRNGKey(0), True)
    out = obj.loss(params, prep, jax.random.PRNGKey(0), {}, True)
    side = {"is_x": "x", "is_y": "y", "cs_xy": "y", "cs_yx": "x"}
    means = {t: _np_ce(logits[t], prep[f"{side[t]}_target_ids"],
                       prep[f"{side[t]}_target_weights"]) for t in TERMS}
    counts = obj.counts(prep)
    np.testing.assert_allclose(float(objective_loss(obj, out.losses, counts)),
                               sum(means.values()), rtol=1e-5)
    reported = report(obj, out.losses, out.metrics, counts)
    for t in TERMS:
        np.testing.assert_allclose(float(reported[f"{t}_loss"]), means[t], rtol=1e-5)
    assert float(reported["count"]) == 2 * sum(float(np.sum(prep[f"{s}_target_weights"]))
                                               for s in ("x", "y"))
    # the CS pass is another computation than the IS pass on the same targets
    assert np.abs(np.asarray(logits["cs_xy"]) - np.asarray(logits["is_y"])).max() > 1e-3


def test_cs_mlm_sends_no_gradient_into_the_memory():
    obj, params, prep = _setup()

    def cs_xy(p, memory=None):
        hx = obj.encode(p, prep, "x", jax.random.PRNGKey(0), True) if memory is None else memory
        h = obj.encode(p, prep, "y", jax.random.PRNGKey(0), True,
                       memory=jax.lax.stop_gradient(hx), memory_side="x")
        lg = obj._logits(p, h, prep["y_target_positions"])
        return jnp.sum(jax.nn.log_softmax(lg)[..., 5])

    def through_term_logits(p):
        return jnp.sum(jax.nn.log_softmax(obj.term_logits(p, prep, jax.random.PRNGKey(0),
                                                          True)["cs_xy"])[..., 5])

    fixed_memory = obj.encode(params, prep, "x", jax.random.PRNGKey(0), True)
    g = jax.jit(jax.grad(through_term_logits))(params)
    g_data = jax.jit(jax.grad(lambda p: cs_xy(p, fixed_memory)))(params)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g)[0],
                            jax.tree_util.tree_leaves(g_data)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    # the cross-attention is trained by the term
    assert np.abs(np.asarray(g["encoder"]["layers_0"]["cross_attention"]["query"]["kernel"])
                  ).max() > 0


def test_the_cs_pass_is_exactly_causal():
    obj, params, prep = _setup(seed=4)
    memory = obj.encode(params, prep, "x", jax.random.PRNGKey(0), True)

    def hidden(ids):
        return np.asarray(obj.encode(params, {**prep, "y_cs_input_ids": ids}, "y",
                                     jax.random.PRNGKey(0), True, memory=memory,
                                     memory_side="x"))

    ids = np.asarray(prep["y_cs_input_ids"])  # what the CS pass reads
    base = hidden(jnp.asarray(ids))
    n = int((np.asarray(prep["y_segment_ids"][0]) > 0).sum())
    for t in (2, n // 2, n - 2):
        changed = ids.copy()
        changed[0, t] = 7 if ids[0, t] != 7 else 8
        after = hidden(jnp.asarray(changed))
        np.testing.assert_array_equal(after[0, :t], base[0, :t])  # earlier: unchanged
        assert np.abs(after[0, t:n] - base[0, t:n]).max(axis=-1).min() > 0  # later: all changed
        np.testing.assert_array_equal(after[1:], base[1:])


def test_max_predictions_too_small_for_the_rate_fails_naming_the_values():
    obj = VariableMLM(NET, mask_prob=0.25, max_predictions=4)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, 16, V, "split_pair", seed=0).items()}
    with pytest.raises(ValueError, match=r"VariableMLM\(name='veco'\): mask_prob=0.25 can select "
                                         r"up to 5 tokens in a row of 16, more than "
                                         r"max_predictions=4; set max_predictions >= 5"):
        obj.prepare(batch, jax.random.PRNGKey(0))


def test_a_model_without_cross_attention_fails():
    with pytest.raises(ValueError, match=r"needs a model with cross-attention blocks"):
        VariableMLM(Transformer(CFG.replace(cross_attention=False)))
