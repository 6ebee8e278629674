"""Per-row dropout masks (`common.keep_mask`, `common.Dropout`): what gradient accumulation with
dropout on rests on, against independent draws and flax's own `nn.Dropout`."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention, common


def test_rows_are_drawn_from_their_own_ids_whatever_the_batch():
    rng = jax.random.PRNGKey(3)
    shape = (6, 5, 7)
    ids = jnp.arange(6, dtype=jnp.int32)
    whole = common.keep_mask(rng, 0.7, shape, ids)
    # Independent reference: each row drawn alone from fold_in(rng, id).
    for b in range(6):
        alone = jax.random.bernoulli(jax.random.fold_in(rng, b), 0.7, shape[1:])
        np.testing.assert_array_equal(whole[b], alone)
    # A microbatch of rows 2..3 (ids 2, 3) draws exactly their masks in the whole batch.
    micro = common.keep_mask(rng, 0.7, (2,) + shape[1:], ids[2:4])
    np.testing.assert_array_equal(micro, whole[2:4])
    # ... which a plain draw of the microbatch's shape does not.
    plain = jax.random.bernoulli(rng, 0.7, (2,) + shape[1:])
    assert not np.array_equal(plain, whole[2:4])
    assert 0.6 < float(whole.mean()) < 0.8


def test_row_ids_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"row_ids of shape \(3,\).*\(4, 2\)"):
        common.keep_mask(jax.random.PRNGKey(0), 0.5, (4, 2), jnp.arange(3))


def test_dropout_without_row_ids_is_flax_dropout_bit_for_bit():
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 3, 8))
    rngs = {"dropout": jax.random.PRNGKey(2)}
    ours = common.Dropout(0.3).apply({}, x, False, rngs=rngs)
    flax_out = nn.Dropout(0.3).apply({}, x, deterministic=False, rngs=rngs)
    np.testing.assert_array_equal(ours, flax_out)
    np.testing.assert_array_equal(common.Dropout(0.3).apply({}, x, True), x)
    # With row ids: zeros exactly where keep_mask says, the kept entries scaled by 1/0.7.
    ids = jnp.array([5, 0, 9, 2])
    out = common.Dropout(0.3).apply({}, x, False, ids, rngs=rngs)
    key = nn.Dropout(0.3).apply({}, method=lambda m: m.make_rng("dropout"), rngs=rngs)
    keep = np.asarray(common.keep_mask(key, 0.7, x.shape, ids))
    np.testing.assert_allclose(out, np.where(keep, np.asarray(x) / 0.7, 0.0), rtol=1e-6)


def test_attention_dropout_per_row_matches_the_rows_alone():
    q = jax.random.normal(jax.random.PRNGKey(0), (4, 6, 2, 8))
    rng = jax.random.PRNGKey(7)
    ids = jnp.arange(4, dtype=jnp.int32)
    whole = attention.reference_attention(q, q, q, dropout_rate=0.2, dropout_rng=rng,
                                          deterministic=False, dropout_row_ids=ids)
    half = attention.reference_attention(q[2:], q[2:], q[2:], dropout_rate=0.2,
                                         dropout_rng=rng, deterministic=False,
                                         dropout_row_ids=ids[2:])
    np.testing.assert_allclose(half, whole[2:], rtol=1e-6, atol=1e-6)
    no_ids = attention.reference_attention(q[2:], q[2:], q[2:], dropout_rate=0.2,
                                           dropout_rng=rng, deterministic=False)
    assert not np.allclose(no_ids, whole[2:])
