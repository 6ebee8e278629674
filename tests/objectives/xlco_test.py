"""XLCo (InfoXLM): the loss against a numpy InfoNCE, the fill before step 1 and the warm-up
gate, the EMA and the ring buffer, masking of both rows, and the argument errors (the fill
through the trainer: tests/train/xlco_prefill_test.py)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.features import BOS_ID, EOS_ID, PAD_ID
from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params
from xlm_jax.objectives.xlco import XLCo

CFG = get_config("tiny", vocab_size=64, num_layers=3, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)


def _setup(queue_size=8, projection_dim=16, **kw):
    """The model, the objective and the train-state params {encoder, objectives: {xlco}}."""
    net = Transformer(CFG)
    obj = XLCo(net, queue_size=queue_size, projection_dim=projection_dim, **kw)
    params = init_params(net, [WeightedObjective(obj)], 8, jax.random.PRNGKey(0))
    return net, obj, nn.meta.unbox(params)


def _kernel(params):
    return params["objectives"]["xlco"]["dense"]["kernel"]


def _perturbed(tree, seed, scale=0.05):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _numpy_rep(net, params, ids, layer):
    """`<s>` state of `layer` (from the model's hidden states) times the projection, in numpy."""
    out = net.apply({"params": params["encoder"]}, jnp.asarray(ids), return_hidden_states=True,
                    method=Transformer.encode)
    cls = np.asarray(out.hidden_states[layer])[:, 0].astype(np.float64)
    return cls @ np.asarray(_kernel(params), np.float64)


@pytest.mark.parametrize("kind, normalize, in_batch", [
    ("mixup_pair", False, False), ("split_pair", False, False), ("mixup_pair", True, False),
    ("split_pair", True, True)])
def test_loss_is_infonce_against_the_queue(kind, normalize, in_batch):
    net, obj, params = _setup(kind=kind, layer=2, temperature=0.25, mask_prob=0.0,
                              normalize=normalize, in_batch_negatives=in_batch)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 16, 64, kind=kind, seed=3).items()}
    state = jax.tree_util.tree_map(lambda x: x, nn.meta.unbox(obj.init_state(params)))
    state["key_params"] = _perturbed(params, 1)  # a key encoder that differs from the query's
    assert state["key_params"].keys() == params.keys()
    queue = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (8, 16)))
    state["queue"], state["filled"] = jnp.asarray(queue, jnp.float32), jnp.int32(8)
    prepared = obj.prepare(batch, jax.random.PRNGKey(4))
    out = obj.loss(params, prepared, jax.random.PRNGKey(5), state, deterministic=True)

    qp, kp = obj.query_prefix, obj.key_prefix
    q = _numpy_rep(net, params, batch[qp + "input_ids"], 2)
    k = _numpy_rep(net, state["key_params"], batch[kp + "input_ids"], 2)
    if normalize:
        q, k = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (q, k))
    # the positive first, then (in_batch) the other rows' keys, then the queue
    nll, hits = [], 0
    for i in range(4):
        negatives = [k[j] for j in range(4) if in_batch and j != i] + list(queue)
        row = np.array([q[i] @ k[i]] + [q[i] @ x for x in negatives]) / 0.25
        nll.append(np.log(np.exp(row - row.max()).sum()) + row.max() - row[0])
        hits += row[0] > row[1:].max()
    nll = np.array(nll)
    assert nll.sum() > 1.0 and np.ptp(nll) > 0.01  # not a trivial case
    np.testing.assert_allclose(float(out.losses["loss"]), nll.sum(), rtol=2e-5)
    assert float(out.metrics["accuracy"].total) == hits
    assert float(out.metrics["accuracy"].count) == 4.0 == float(obj.counts(prepared)["loss"])
    np.testing.assert_allclose(np.asarray(out.state_inputs["keys"]), k, rtol=1e-4, atol=1e-5)


def test_mean_pooling_without_projection_uses_the_rows_tokens():
    net, obj, params = _setup(kind="split_pair", layer=1, mask_prob=0.0, pooling="mean",
                              queue_size=4, projection_dim=0)
    assert obj.modules() == {} and params["objectives"] == {}
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, 12, 64, kind="split_pair", seed=0).items()}
    vec = obj.represent(params, batch, "y_", jax.random.PRNGKey(0), True)
    h = np.asarray(net.apply({"params": params["encoder"]}, batch["y_input_ids"],
                             return_hidden_states=True,
                             method=Transformer.encode).hidden_states[1])
    valid = np.asarray(batch["y_input_ids"]) != PAD_ID
    want = (h * valid[..., None]).sum(1) / valid.sum(1, keepdims=True)
    assert vec.shape == (2, 32)
    np.testing.assert_allclose(np.asarray(vec), want, rtol=1e-5, atol=1e-6)


def test_prefill_enqueues_the_key_encoders_keys_of_the_real_rows():
    """One batch of the fill before step 1: the keys of the key rows by the key encoder (not by
    the parameters given), into the ring buffer; the key encoder does not move."""
    net, obj, params = _setup(queue_size=8, mask_prob=0.0, layer=2)
    state = nn.meta.unbox(obj.init_state(params))
    state["key_params"] = _perturbed(params, 1)
    batch = {k: np.array(v)
             for k, v in synthetic_batch(4, 16, 64, kind="mixup_pair", seed=2).items()}
    for k in batch:  # row 1 is padding: no key of it enters
        batch[k][1] = PAD_ID if k.endswith("input_ids") else 0
    prepared = obj.prepare({k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(0))
    new = obj.prefill(_perturbed(params, 9), state, prepared, jax.random.PRNGKey(3))
    want = _numpy_rep(net, state["key_params"], batch["key_input_ids"], 2)[[0, 2, 3]]
    np.testing.assert_allclose(np.asarray(new["queue"])[:3], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new["queue"])[3:], 0.0)
    assert int(new["filled"]) == 3 and int(new["ptr"]) == 3
    jax.tree_util.tree_map(np.testing.assert_array_equal, new["key_params"], state["key_params"])


def test_prefill_batches_fill_the_queue_or_none():
    assert _setup(queue_size=8)[1].prefill_batches(4) == 2
    assert _setup(queue_size=8, initial_fill="warmup")[1].prefill_batches(4) == 0
    assert _setup(queue_size=0, in_batch_negatives=True)[1].prefill_batches(4) == 0
    with pytest.raises(ValueError, match=r"queue_size=8 is not a multiple of the global "
                                         r"batch of 3 rows"):
        _setup(queue_size=8)[1].prefill_batches(3)


def test_loss_is_off_until_the_queue_is_full():
    """The gate `initial_fill="warmup"` relies on (and a fill that padding rows left short):
    no loss and no accuracy before the queue holds queue_size keys."""
    net, obj, params = _setup(mask_prob=0.0)
    batch = synthetic_batch(4, 16, 64, kind="mixup_pair", seed=0)
    state = nn.meta.unbox(obj.init_state(params))
    for filled, expect_zero in ((0, True), (4, True), (8, False)):
        state = {**state, "filled": jnp.int32(filled)}
        out = obj.loss(params, obj.prepare(batch, jax.random.PRNGKey(0)), jax.random.PRNGKey(1),
                       state, deterministic=True)
        assert (float(out.losses["loss"]) == 0.0) == expect_zero
        assert float(out.metrics["queue_fill"].value()) == pytest.approx(filled / 8)
        if expect_zero:
            assert float(out.metrics["accuracy"].value()) == 0.0


def test_after_update_is_ema_then_ring_buffer():
    net, obj, params = _setup(queue_size=8, momentum=0.9)
    state = nn.meta.unbox(obj.init_state(params))
    np.testing.assert_array_equal(np.asarray(_kernel(state["key_params"])),
                                  np.asarray(_kernel(params)))
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, 16)).astype(np.float32) for _ in range(3)]
    new = _perturbed(params, 7)
    key = state["key_params"]
    for i, keys in enumerate(batches):
        state = obj.after_update(new, state, {"keys": jnp.asarray(keys)})
        key = jax.tree_util.tree_map(lambda k, p: 0.9 * np.asarray(k) + 0.1 * np.asarray(p),
                                     key, new)
        assert int(state["filled"]) == min(4 * (i + 1), 8)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                           state["key_params"], key)
    # three batches of 4 in a queue of 8: the third overwrote slots 0..3, the second is in 4..7
    np.testing.assert_array_equal(np.asarray(state["queue"]),
                                  np.concatenate([batches[2], batches[1]]))
    assert int(state["ptr"]) == 4


def test_collapsed_vectors_score_no_hits():
    # equal logits everywhere: argmax would say "index 0 = the positive" for every row
    net, obj, params = _setup(mask_prob=0.0, in_batch_negatives=True, queue_size=0)
    state = nn.meta.unbox(obj.init_state(params))
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)  # every vector is 0: all logits tie
    batch = synthetic_batch(4, 16, 64, kind="mixup_pair", seed=0)
    out = obj.loss(zero, batch, jax.random.PRNGKey(1), {**state, "key_params": zero}, True)
    assert float(out.metrics["accuracy"].value()) == 0.0
    assert float(out.losses["loss"]) == pytest.approx(4 * np.log(4), rel=1e-5)


def test_queue_must_take_whole_batches():
    net, obj, params = _setup(queue_size=10)
    state = nn.meta.unbox(obj.init_state(params))
    with pytest.raises(ValueError, match=r"queue_size=10 is not a multiple of the global batch "
                                         r"of 4 rows"):
        obj.after_update(params, state, {"keys": jnp.zeros((4, 16))})


def test_both_rows_are_masked_and_specials_kept():
    net, obj, _ = _setup(mask_prob=0.15, max_predictions=12)
    batch = synthetic_batch(64, 32, 64, kind="mixup_pair", seed=1)
    prepared = obj.prepare({k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(0))
    for prefix in ("query_", "key_"):
        before = batch[prefix + "input_ids"]
        after = np.asarray(prepared[prefix + "input_ids"])
        special = np.isin(before, [BOS_ID, EOS_ID, PAD_ID])
        np.testing.assert_array_equal(after[special], before[special])
        changed = (after != before).mean() / (~special).mean()
        assert 0.08 < changed < 0.16  # 15% selected, of which 80% masked + ~10% replaced
        assert (after == CFG.vocab_size - 1).any()  # <mask>
    for name in batch:  # the other features pass through untouched
        if not name.endswith("input_ids"):
            np.testing.assert_array_equal(np.asarray(prepared[name]), batch[name])


@pytest.mark.parametrize("kw, match", [
    ({"kind": "pair"}, r"kind='pair' must be one of mixup_pair, split_pair"),
    ({"projection_dim": -1}, r"projection_dim=-1 is out of range"),
    ({"layer": 4}, r"layer=4 is outside 0..3"),
    ({"temperature": 0.0}, r"temperature=0.0 is out of range"),
    ({"momentum": 1.0}, r"momentum=1.0 is out of range"),
    ({"queue_size": 0}, r"queue_size=0 is out of range"),  # only with in_batch_negatives
    ({"pooling": "max"}, r"pooling='max' must be one of cls, mean"),
    ({"initial_fill": "lazy"}, r"initial_fill='lazy' must be one of prefill, warmup"),
    ({"layer_norm": "own"}, r"layer_norm='own' must be one of final, none"),
])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        XLCo(Transformer(CFG), **kw)


@pytest.mark.parametrize("ln_style, layer, layer_norm, normed", [
    ("pre", 2, "final", True), ("pre", 2, "none", False), ("pre", 3, "final", False),
    ("post", 2, "final", False)])
def test_pre_ln_state_is_layer_normalised_below_the_last_layer(ln_style, layer, layer_norm,
                                                                normed):
    """With layer_norm="final", a pre-LN model's universal layer below the last is passed
    through the encoder's final LayerNorm (numpy LayerNorm of the raw residual stream with
    that module's scale and bias); the last layer (already normalised by the encoder) and a
    post-LN model's layers are the raw hidden state, as is "none"."""
    cfg = CFG.replace(ln_style=ln_style)
    net = Transformer(cfg)
    obj = XLCo(net, kind="split_pair", layer=layer, mask_prob=0.0, queue_size=4,
               projection_dim=0, layer_norm=layer_norm)
    params = nn.meta.unbox(init_params(net, [WeightedObjective(obj)], 8, jax.random.PRNGKey(0)))
    if ln_style == "pre":  # a final LayerNorm that is not the identity
        params["encoder"]["final_norm"] = _perturbed(params["encoder"]["final_norm"], 3, 0.5)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, 12, 64, kind="split_pair", seed=0).items()}
    vec = np.asarray(obj.represent(params, batch, "x_", jax.random.PRNGKey(0), True), np.float64)
    out = net.apply({"params": params["encoder"]}, batch["x_input_ids"],
                    return_hidden_states=True, method=Transformer.encode)
    cls = np.asarray(out.hidden_states[layer], np.float64)[:, 0]
    if normed:
        ln = params["encoder"]["final_norm"]
        mean, var = cls.mean(-1, keepdims=True), cls.var(-1, keepdims=True)
        cls = ((cls - mean) / np.sqrt(var + cfg.layer_norm_eps) * np.asarray(ln["scale"])
               + np.asarray(ln["bias"]))
        raw = np.asarray(out.hidden_states[layer], np.float64)[:, 0]
        assert np.abs(cls - raw).max() > 0.1  # the two choices differ here
    np.testing.assert_allclose(vec, cls, rtol=1e-4, atol=1e-5)


def test_old_kind_names_resolve_to_the_new_ones():
    """Users' gin files may still say `XLCo.kind = 'veco'` / `'mixup'` (the names before):
    the objective then reads the same rows as with the new names."""
    for old, new, prefixes in (("veco", "split_pair", ("x_", "y_")),
                               ("mixup", "mixup_pair", ("query_", "key_"))):
        obj = XLCo(Transformer(CFG), kind=old)
        assert obj.kind == new and (obj.query_prefix, obj.key_prefix) == prefixes


def test_padding_rows_never_enter_the_queue():
    """A batch with padding rows (query and key rows all `<pad>`) fills the queue with the keys
    of its real rows only, in row order, and the fill count counts only them."""
    net, obj, params = _setup(queue_size=8, mask_prob=0.0)
    batch = {k: np.array(v) for k, v in synthetic_batch(4, 16, 64, kind="mixup_pair", seed=0).items()}
    pad_rows = [1, 3]
    for k in batch:
        batch[k][pad_rows] = PAD_ID if k.endswith("input_ids") else 0
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    state = nn.meta.unbox(obj.init_state(params))
    out = obj.loss(params, obj.prepare(batch, jax.random.PRNGKey(0)), jax.random.PRNGKey(1),
                   state, deterministic=True)
    keys = np.asarray(out.state_inputs["keys"])
    state = obj.after_update(params, state, out.state_inputs)
    assert int(state["filled"]) == 2 and int(state["ptr"]) == 2
    queue = np.asarray(state["queue"])
    np.testing.assert_array_equal(queue[:2], keys[[0, 2]])
    np.testing.assert_array_equal(queue[2:], 0.0)  # untouched
    # a second batch continues after the real keys and wraps around the ring at its end
    state = {**state, "ptr": jnp.int32(7)}
    state = obj.after_update(params, state, out.state_inputs)
    queue = np.asarray(state["queue"])
    np.testing.assert_array_equal(queue[7], keys[0])
    np.testing.assert_array_equal(queue[0], keys[2])
    assert int(state["ptr"]) == 1 and int(state["filled"]) == 4
    for row in pad_rows:  # no padding row's key anywhere in the queue
        assert not (np.abs(queue - keys[row]).max(axis=-1) == 0).any()
