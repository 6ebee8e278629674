"""Tests for xlm_jax.models.decoding: greedy and beam search against toy models whose
exact answers are known (brute-force enumeration, greedy = beam 1, cached = uncached)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import decoding
from xlm_jax.models.decoding import beam_search, greedy_search, length_penalty_factor

EOS, PAD = 1, 0


def _assert_results_equal(a: decoding.DecodeResult, b: decoding.DecodeResult) -> None:
    for name in ("tokens", "scores", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)),
                                      err_msg=name)


# ---------------------------------------------------------------- toy models

def _markov_fn(vocab: int, max_length: int, seed: int):
    """logits = table[prev_token] + a small position term (uncached, cache passed through)."""
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(vocab, vocab)) * 2.0, jnp.float32)
    pos = jnp.asarray(rng.normal(size=(max_length, vocab)) * 0.1, jnp.float32)

    def fn(prefix, step, cache):
        prev = jax.lax.dynamic_index_in_dim(prefix, step, axis=1, keepdims=False)
        return table[prev] + pos[step], cache
    return fn


def _brute_tables(batch: int, vocab: int, max_length: int, seed: int) -> np.ndarray:
    """Per-row logits table indexed [row, step, prev_token, prefix_sum % 3, next_token]."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(batch, max_length, vocab, 3, vocab)) * 1.5).astype(np.float32)


def _brute_fn(tables: np.ndarray):
    """Uncached model over the whole prefix; `cache["row"]` tells each beam its batch row."""
    t = jnp.asarray(tables)

    def fn(prefix, step, cache):
        visible = jnp.arange(prefix.shape[1]) <= step
        s = jnp.sum(jnp.where(visible, prefix, 0), axis=1) % 3
        prev = jax.lax.dynamic_index_in_dim(prefix, step, axis=1, keepdims=False)
        return t[cache["row"], step, prev, s], cache
    return fn


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _brute_force(logits_np, vocab: int, max_length: int, start: int, alpha: float):
    """Every valid sequence as (score, tokens incl. start), best first. Valid: stops at its
    first EOS, or runs to max_length - 1 decoded tokens without one; score = logprob / GNMT
    penalty. `logits_np(prefix: list[int], step) -> [V]` is the numpy twin of the model."""
    ranked = []
    for n in range(1, max_length):
        for seq in itertools.product(range(vocab), repeat=n):
            if EOS in seq[:-1] or (seq[-1] != EOS and n < max_length - 1):
                continue
            prefix, logp = [start], 0.0
            for step, tok in enumerate(seq):
                logp += _log_softmax(logits_np(prefix, step))[tok]
                prefix.append(tok)
            ranked.append((logp / ((5.0 + n) / 6.0) ** alpha, prefix))
    return sorted(ranked, key=lambda r: -r[0])


# ---------------------------------------------------------------- tests

def test_length_penalty_factor():
    assert float(length_penalty_factor(7, 0.0)) == 1.0
    np.testing.assert_allclose(float(length_penalty_factor(3, 0.6)), (8 / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(float(length_penalty_factor(1, 0.6)), 1.0, rtol=1e-6)


def test_beam_one_equals_greedy():
    vocab, max_length, batch = 8, 10, 3
    fn = _markov_fn(vocab, max_length, seed=0)
    start = jnp.array([3, 4, 5], jnp.int32)  # per-row "target language" start tokens
    greedy = greedy_search(fn, {}, batch, max_length, start, EOS, PAD)
    beam = beam_search(fn, {}, batch, 1, max_length, start, EOS, PAD, length_penalty=0.0)
    assert greedy.tokens.shape == (batch, 1, max_length)
    np.testing.assert_array_equal(np.asarray(greedy.tokens[:, 0, 0]), [3, 4, 5])
    _assert_results_equal(beam, greedy)
    # The greedy score is the summed log-softmax of its tokens (recomputed here).
    for b in range(batch):
        toks, n = np.asarray(greedy.tokens[b, 0]), int(greedy.lengths[b, 0])
        logp = 0.0
        for step in range(n):
            logits, _ = fn(jnp.asarray(toks[None]), jnp.int32(step), {})
            logp += _log_softmax(np.asarray(logits[0]))[toks[step + 1]]
        np.testing.assert_allclose(float(greedy.scores[b, 0]), logp, rtol=1e-5)
        assert (toks[n + 1:] == PAD).all()


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_matches_brute_force(alpha):
    vocab, max_length, batch = 4, 5, 2
    tables = _brute_tables(batch, vocab, max_length, seed=1 + int(alpha * 10))
    fn = _brute_fn(tables)
    cache = {"row": jnp.arange(batch)}
    wide = beam_search(fn, cache, batch, vocab ** (max_length - 1), max_length, 0, EOS, PAD,
                       length_penalty=alpha)
    narrow = beam_search(fn, cache, batch, 1, max_length, 0, EOS, PAD, length_penalty=alpha)
    greedy = greedy_search(fn, cache, batch, max_length, 0, EOS, PAD)
    scores = np.asarray(wide.scores)
    finite = np.isfinite(scores)
    # 121 valid hypotheses exist per row; the rest of the 256 slots are -inf filler, last.
    assert finite.sum(axis=1).tolist() == [121, 121] and finite[:, :121].all()
    assert (np.diff(scores[:, :121], axis=1) <= 0).all(), "scores must be sorted best first"
    for b in range(batch):
        table = tables[b]
        ranked = _brute_force(lambda p, step: table[step, p[-1], sum(p) % 3],
                              vocab, max_length, 0, alpha)
        assert len(ranked) == 121
        best_score, best_tokens = ranked[0]
        np.testing.assert_allclose(scores[b, 0], best_score, rtol=1e-5)
        n = len(best_tokens) - 1
        assert int(wide.lengths[b, 0]) == n
        np.testing.assert_array_equal(np.asarray(wide.tokens[b, 0, :n + 1]), best_tokens)
        assert (np.asarray(wide.tokens[b, 0, n + 1:]) == PAD).all()
        # Greedy's hypothesis, scored the same way, never beats beam search.
        greedy_score = float(greedy.scores[b, 0]) / float(
            length_penalty_factor(greedy.lengths[b, 0], alpha))
        assert scores[b, 0] >= greedy_score - 1e-5
        assert float(narrow.scores[b, 0]) >= greedy_score - 1e-5


def test_early_stop_keeps_longer_hypotheses():
    """One live chain (token 2), EOS likely only at the first two steps: the finished set is
    full after two steps, but with alpha = 0.6 the penalty makes the full-length chain the
    second best, so stopping there (a bound without the penalty) would lose it."""
    vocab, max_length, alpha, beams = 4, 7, 0.6, 2
    eos_logit = np.array([0.0, 0.0, -20.0, -20.0, -20.0, -20.0, -20.0], np.float32)

    def logits_np(prefix, step):
        return np.array([-1e9, eos_logit[step], 0.0, -1e9], np.float32)

    def fn(prefix, step, cache):
        logits = jnp.array([-1e9, 0.0, 0.0, -1e9], jnp.float32).at[EOS].set(
            jnp.asarray(eos_logit)[step])
        return jnp.broadcast_to(logits, (prefix.shape[0], vocab)), cache

    result = beam_search(fn, {}, 1, beams, max_length, 0, EOS, PAD, length_penalty=alpha)
    ranked = _brute_force(logits_np, vocab, max_length, 0, alpha)[:beams]
    np.testing.assert_allclose(np.asarray(result.scores[0]), [r[0] for r in ranked], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(result.lengths[0]), [1, max_length - 1])
    for k, (_, tokens) in enumerate(ranked):
        np.testing.assert_array_equal(np.asarray(result.tokens[0, k, :len(tokens)]), tokens)


def _sum_models(vocab: int, dim: int, seed: int):
    """Logits from the running sum of integer token embeddings plus a per-row memory; the
    uncached model re-sums the whole prefix, the cached one adds prefix[:, step] to its
    cache. Integer sums are exact, so both must agree bit for bit."""
    rng = np.random.default_rng(seed)
    emb = jnp.asarray(rng.integers(-3, 4, size=(vocab, dim)), jnp.int32)
    w = jnp.asarray(rng.normal(size=(dim, vocab)), jnp.float32)

    def head(total, mem):
        return jnp.tanh(total.astype(jnp.float32) * 0.3 + mem) @ w * 3.0

    def uncached(prefix, step, cache):
        visible = (jnp.arange(prefix.shape[1]) <= step)[None, :, None]
        total = jnp.sum(jnp.where(visible, emb[prefix], 0), axis=1)
        return head(total, cache["mem"]), cache

    def cached(prefix, step, cache):
        tok = jax.lax.dynamic_index_in_dim(prefix, step, axis=1, keepdims=False)
        total = cache["sum"] + emb[tok]
        return head(total, cache["mem"]), {"sum": total, "mem": cache["mem"]}
    return uncached, cached


def test_cached_equals_uncached():
    vocab, dim, batch, max_length = 10, 4, 2, 8
    uncached, cached = _sum_models(vocab, dim, seed=3)
    mem = jnp.asarray(np.random.default_rng(4).normal(size=(batch, dim)), jnp.float32)
    c_unc = {"mem": mem}
    c_cac = {"mem": mem, "sum": jnp.zeros((batch, dim), jnp.int32)}
    start = jnp.array([2, 5], jnp.int32)
    _assert_results_equal(greedy_search(cached, c_cac, batch, max_length, start, EOS, PAD),
                          greedy_search(uncached, c_unc, batch, max_length, start, EOS, PAD))
    b_unc = beam_search(uncached, c_unc, batch, 3, max_length, start, EOS, PAD)
    b_cac = beam_search(cached, c_cac, batch, 3, max_length, start, EOS, PAD)
    _assert_results_equal(b_cac, b_unc)
    # The beams really diverge (so a wrong cache reorder would show up).
    assert len({tuple(np.asarray(b_unc.tokens[0, k])) for k in range(3)}) == 3


def test_deterministic_and_jittable():
    vocab, max_length, batch, beams = 8, 9, 2, 3
    fn = _markov_fn(vocab, max_length, seed=5)
    start = jnp.array([2, 6], jnp.int32)

    def run(start_ids):
        return beam_search(fn, {}, batch, beams, max_length, start_ids, EOS, PAD)
    first, second, jitted = run(start), run(start), jax.jit(run)(start)
    _assert_results_equal(first, second)
    _assert_results_equal(first, jitted)
    g = jax.jit(lambda s: greedy_search(fn, {}, batch, max_length, s, EOS, PAD))(start)
    _assert_results_equal(g, greedy_search(fn, {}, batch, max_length, start, EOS, PAD))


def test_eos_forced_at_second_token():
    vocab, max_length, batch, start = 7, 8, 2, 2
    rng = np.random.default_rng(6)
    first = jnp.asarray(rng.normal(size=(vocab,)), jnp.float32).at[EOS].set(-1e9)
    force = lambda tok: jnp.full((vocab,), -1e9, jnp.float32).at[tok].set(0.0)  # noqa: E731

    def fn(prefix, step, cache):
        # step 0: anything but EOS; step 1 (position 2): EOS; later: token 5, never PAD.
        logits = jnp.where(step == 0, first, jnp.where(step == 1, force(EOS), force(5)))
        return jnp.broadcast_to(logits, (prefix.shape[0], vocab)), cache

    for result in (greedy_search(fn, {}, batch, max_length, start, EOS, PAD),
                   beam_search(fn, {}, batch, 3, max_length, start, EOS, PAD)):
        toks = np.asarray(result.tokens)
        assert (np.asarray(result.lengths) == 2).all()
        assert (toks[:, :, 0] == start).all() and (toks[:, :, 2] == EOS).all()
        assert (toks[:, :, 3:] == PAD).all()
        assert np.isfinite(np.asarray(result.scores)).all()


def test_greedy_rows_finish_independently():
    """Row 0 emits EOS as its 2nd token while row 1 never does: row 0 must emit pad_id (not
    the model's token 5) and stop counting length and score while row 1 keeps decoding."""
    vocab, max_length, batch = 7, 6, 2

    def fn(prefix, step, cache):
        row0 = jnp.where(step == 1, EOS, jnp.where(step == 0, 3, 5))
        target = jnp.array([0, 1]) * 4 + jnp.array([1, 0]) * row0  # row 1 always emits 4
        return jax.nn.one_hot(target, vocab) * 2.0, cache

    result = greedy_search(fn, {}, batch, max_length, jnp.array([2, 6]), EOS, PAD)
    np.testing.assert_array_equal(np.asarray(result.tokens[:, 0]),
                                  [[2, 3, EOS, PAD, PAD, PAD], [6, 4, 4, 4, 4, 4]])
    np.testing.assert_array_equal(np.asarray(result.lengths[:, 0]), [2, max_length - 1])
    step_logp = float(_log_softmax(np.eye(vocab)[0] * 2.0)[0])
    np.testing.assert_allclose(np.asarray(result.scores[:, 0]),
                               [2 * step_logp, (max_length - 1) * step_logp], rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_size=0), "beam_size=0 must be >= 1"),
    (dict(max_length=1), "max_length=1 must be >= 2"),
    (dict(batch_size=0), "batch_size=0 must be >= 1"),
])
def test_errors(kwargs, message):
    fn = _markov_fn(4, 5, seed=0)
    args = dict(batch_size=2, beam_size=2, max_length=5, start_id=0, eos_id=EOS, pad_id=PAD)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        beam_search(fn, {}, **args)
    if "beam_size" not in kwargs:
        args.pop("beam_size")
        with pytest.raises(ValueError, match=message):
            greedy_search(fn, {}, **args)
