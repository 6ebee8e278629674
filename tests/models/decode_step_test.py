"""Incremental decoding through the real model: `Transformer.decode_step` with a cache equals
the full causal pass over the prefix at every position (post-LN and pre-LN, absolute and gated
relative positions, with cross-attention to an encoder's output), and beam search / greedy
search give the same hypotheses cached and uncached."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import decoding
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer

V, N, S, L = 48, 3, 5, 7


def _model(**kw):
    cfg = get_config("tiny", vocab_size=V, num_layers=2, hidden_size=32, num_heads=4,
                     mlp_dim=64, max_positions=40, dropout_rate=0.0,
                     attention_dropout_rate=0.0, cross_attention=True, **kw)
    net = Transformer(cfg)
    mem = jax.random.normal(jax.random.PRNGKey(1), (N, S, 32))
    params = nn.meta.unbox(net.init(jax.random.PRNGKey(0), jnp.ones((N, L), jnp.int32),
                                    encoder_states=mem)["params"])
    cross = jnp.asarray(np.arange(S)[None, :] < np.array([[5], [3], [4]]))  # padded memories
    return cfg, net, params, mem, cross


def _full(net, params, mem, cross, ids):
    t = ids.shape[1]
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool))[None, None], (N, 1, t, t))
    return net.apply({"params": params}, ids, positions=jnp.broadcast_to(jnp.arange(t), (N, t)),
                     attention_mask=causal, encoder_states=mem,
                     cross_mask=jnp.broadcast_to(cross[:, None, None, :], (N, 1, t, S)),
                     method=Transformer.encode).last_hidden_state


@pytest.mark.parametrize("kw", [{}, {"ln_style": "pre", "position_type": "both"}])
def test_decode_step_equals_the_full_causal_pass(kw):
    cfg, net, params, mem, cross = _model(**kw)
    ids = jax.random.randint(jax.random.PRNGKey(2), (N, L), 4, V)
    want = np.asarray(_full(net, params, mem, cross, ids))
    cache = Transformer.init_cache(cfg, N, L)
    step = jax.jit(lambda i, t, c: net.apply({"params": params}, i, t, c, encoder_states=mem,
                                             cross_mask=cross[:, None, None, :],
                                             method=Transformer.decode_step))
    for t in range(L):
        h, cache = step(ids[:, t:t + 1], jnp.int32(t), cache)
        np.testing.assert_allclose(np.asarray(h)[:, 0], want[:, t], atol=2e-5,
                                   err_msg=f"position {t}")


def test_cached_search_equals_uncached_search():
    """Greedy and beam search (3 beams) over the model: re-reading the whole prefix each step
    vs one token per step with the cache. The encoder memory rides in the search cache so
    that beam search tiles and reorders it with the beams."""
    cfg, net, params, mem, cross = _model(ln_style="pre")

    def logits_at(h, rows, step):
        pos = jnp.broadcast_to(step, (rows, 1)) if step is not None else jnp.zeros((rows, 1),
                                                                                 jnp.int32)
        return net.apply({"params": params}, h, pos, method=Transformer.mlm_logits)[:, 0]

    def uncached(prefix, step, cache):
        memory, valid = cache
        rows = prefix.shape[0]
        h = net.apply({"params": params}, prefix,
                      positions=jnp.broadcast_to(jnp.arange(L), prefix.shape),
                      attention_mask=jnp.broadcast_to(jnp.tril(jnp.ones((L, L), bool)),
                                                      (rows, 1, L, L)),
                      encoder_states=memory,
                      cross_mask=jnp.broadcast_to(valid[:, None, None, :], (rows, 1, L, S)),
                      method=Transformer.encode).last_hidden_state
        return logits_at(h, rows, step), cache

    def cached(prefix, step, cache):
        layers, memory, valid = cache
        token = jax.lax.dynamic_slice_in_dim(prefix, step, 1, axis=1)
        h, layers = net.apply({"params": params}, token, step, layers, encoder_states=memory,
                              cross_mask=valid[:, None, None, :], method=Transformer.decode_step)
        return logits_at(h, prefix.shape[0], None), (layers, memory, valid)

    start = jnp.array([5, 6, 7])
    for beam in (None, 3):
        runs = []
        for fn, cache in ((uncached, (mem, cross)),
                          (cached, (Transformer.init_cache(cfg, N, L), mem, cross))):
            if beam is None:
                runs.append(decoding.greedy_search(fn, cache, N, L, start, eos_id=2, pad_id=1))
            else:
                runs.append(decoding.beam_search(fn, cache, N, beam, L, start, eos_id=2,
                                                 pad_id=1))
        np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens, err_msg=f"beam {beam}")
        np.testing.assert_allclose(runs[0].scores, runs[1].scores, atol=1e-4)
        np.testing.assert_array_equal(runs[0].lengths, runs[1].lengths)
    assert (np.asarray(runs[0].tokens)[:, 0] != np.asarray(runs[0].tokens)[:, 1]).any()
