"""Autoregressive decoding (greedy and beam search) for an encoder-decoder translation model.

Pure JAX (``jax``, ``jax.numpy``, ``flax.struct``), static shapes, usable under ``jax.jit`` with
``batch_size``, ``beam_size``, ``max_length`` and ``length_penalty`` static. The model is reached
only through a :data:`LogitsFn`, so the same loop serves a cached decoder (reads
``prefix_ids[:, step]`` and its cache) and an uncached one (re-reads the whole prefix).

Layout: a prefix buffer ``[N, max_length]`` holds the start token at position 0; step ``i``
(``0 <= i < max_length - 1``) asks for the token at position ``i + 1``, so at most
``max_length - 1`` tokens are decoded. ``length`` always counts decoded tokens including EOS
and excluding the start token.

Beam search keeps *alive* hypotheses (no EOS yet) apart from *finished* ones, the scheme of
Wu et al. 2016 (GNMT) as implemented in t5x's ``decoding.beam_search``: each step scores the
``K * V`` one-token extensions of the alive beams, keeps the best ``2K`` (at most ``K`` of them
end in EOS, so ``K`` non-EOS ones always remain to stay alive), merges those ending in EOS into
the finished set of size ``K`` (subject to the rank rule below) and keeps the best ``K``
non-EOS ones alive.

Choices made here, with their sources where we know them, so they can be revisited:
  * Length penalty: ``score = logprob / ((5 + length) / 6) ** alpha``, the GNMT form (no
    coverage penalty), written as t5x's ``brevity_penalty``. The default ``alpha = 0.6`` is
    t5x's ``beam_search`` default; we have not tuned it for this library's models.
  * A hypothesis that reaches ``max_length`` without EOS is moved into the finished set at the
    last step (length ``max_length - 1``), so it competes with EOS-terminated ones on equal
    terms. This subsumes t5x's fallback "return the alive beams of rows that finished nothing".
  * Early stop (t5x's test, ``alpha >= 0`` only): the loop ends once, in every row, the worst
    of ``K`` finished scores beats the best score any alive beam could still reach,
    ``best_alive_logprob / penalty(max_length - 1)`` (log-probabilities only decrease and the
    penalty factor only grows with length). Otherwise it runs to ``max_length``.
  * Only EOS candidates ranked among the step's best ``K`` enter the finished set (the rule of
    Hugging Face's ``BeamSearchScorer``; t5x admits all ``2K``), so ``beam_size=1`` reproduces
    :func:`greedy_search` exactly (with ``length_penalty=0``).
  * Greedy search has no length penalty: its score is the plain summed log-probability.
  * Filler: rows with fewer than ``K`` valid hypotheses return extra entries scored ``-inf``
    (their tokens and lengths are meaningless).
  * Scores are computed in float32 whatever the logits' dtype.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

LogitsFn = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
"""``logits_fn(prefix_ids [N, max_length] int32, step int32 scalar, cache) -> (logits [N, V],
new_cache)``: logits for the token at position ``step + 1``. The cache's pytree structure and
shapes must not change (it is a loop carry); every leaf has leading dimension ``N``."""

_NEG_INF = -jnp.inf


@flax.struct.dataclass
class DecodeResult:
    """Decoded hypotheses, best first.

    tokens: ``[B, K, max_length]`` int32; position 0 is the start token, then the decoded tokens,
        ``pad_id`` after EOS. scores: ``[B, K]`` float32, length-penalised log-probability.
    lengths: ``[B, K]`` int32, decoded tokens including EOS, excluding the start token.
    """

    tokens: jax.Array
    scores: jax.Array
    lengths: jax.Array


def length_penalty_factor(length: jax.Array | int, alpha: float) -> jax.Array:
    """GNMT length-penalty divisor ``((5 + length) / 6) ** alpha``; 1 for ``alpha = 0``."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _check_sizes(batch_size: int, max_length: int, beam_size: int = 1) -> None:
    """Reject sizes the static-shape loops cannot handle, naming the offending value."""
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be >= 1")
    if max_length < 2:
        raise ValueError(f"max_length={max_length} must be >= 2 (start token + one decoded token)")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")


def _log_probs(logits: jax.Array, rows: int) -> jax.Array:
    """float32 log-softmax of ``logits [rows, V]``; a wrongly shaped model output fails loudly."""
    if logits.ndim != 2 or logits.shape[0] != rows:
        raise ValueError(f"logits_fn returned logits of shape {logits.shape}, expected ({rows}, V)")
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def _init_prefix(start_id: int | jax.Array, rows: int, repeat: int, max_length: int,
                 pad_id: int) -> jax.Array:
    """``[rows * repeat, max_length]`` buffer of ``pad_id`` with the (per-row) start token at 0."""
    start = jnp.broadcast_to(jnp.asarray(start_id, jnp.int32), (rows,))
    start = jnp.repeat(start, repeat)
    prefix = jnp.full((rows * repeat, max_length), pad_id, jnp.int32)
    return prefix.at[:, 0].set(start)


def greedy_search(logits_fn: LogitsFn, cache: Any, batch_size: int, max_length: int,
                  start_id: int | jax.Array, eos_id: int, pad_id: int) -> DecodeResult:
    """Argmax decoding; rows that emitted EOS emit ``pad_id`` and stop accumulating score.

    ``start_id`` is one id or one per row (``[batch_size]``, e.g. target-language tokens).
    Returns a :class:`DecodeResult` with ``K = 1``; its score is the summed log-probability of
    the decoded tokens (no length penalty). The loop stops once every row has emitted EOS.
    """
    _check_sizes(batch_size, max_length)
    prefix0 = _init_prefix(start_id, batch_size, 1, max_length, pad_id)

    def cond(state):
        step, _, _, finished, _, _ = state
        return (step < max_length - 1) & ~jnp.all(finished)

    def body(state):
        step, prefix, cache, finished, logprob, lengths = state
        logits, cache = logits_fn(prefix, step, cache)
        logp = _log_probs(logits, batch_size)
        token = jnp.argmax(logp, axis=-1).astype(jnp.int32)
        token_logp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
        token = jnp.where(finished, pad_id, token)
        logprob = logprob + jnp.where(finished, 0.0, token_logp)
        lengths = lengths + (~finished).astype(jnp.int32)
        finished = finished | (token == eos_id)
        prefix = jax.lax.dynamic_update_slice(prefix, token[:, None], (0, step + 1))
        return step + 1, prefix, cache, finished, logprob, lengths

    state = (jnp.int32(0), prefix0, cache, jnp.zeros((batch_size,), bool),
             jnp.zeros((batch_size,), jnp.float32), jnp.zeros((batch_size,), jnp.int32))
    _, prefix, _, _, logprob, lengths = jax.lax.while_loop(cond, body, state)
    return DecodeResult(tokens=prefix[:, None, :], scores=logprob[:, None],
                        lengths=lengths[:, None])


@flax.struct.dataclass
class _BeamState:
    """Loop carry of :func:`beam_search` (B rows, K beams, L = max_length)."""

    step: jax.Array             # int32 scalar: the next call predicts position step + 1
    alive_seqs: jax.Array       # [B, K, L] int32; beams with finite logp hold no EOS
    alive_logp: jax.Array       # [B, K] float32, summed log-probability, sorted descending
    cache: Any                  # pytree, leading dim B * K, aligned with alive_seqs
    fin_seqs: jax.Array         # [B, K, L] int32
    fin_scores: jax.Array       # [B, K] float32, length-penalised, sorted descending
    fin_lengths: jax.Array      # [B, K] int32


def _gather_beams(x: jax.Array, idx: jax.Array) -> jax.Array:
    """``x[b, idx[b, k]]`` for ``x`` of shape ``[B, M, ...]`` and ``idx`` of shape ``[B, K]``."""
    return jax.vmap(lambda row, i: jnp.take(row, i, axis=0))(x, idx)


def beam_search(logits_fn: LogitsFn, cache: Any, batch_size: int, beam_size: int,
                max_length: int, start_id: int | jax.Array, eos_id: int, pad_id: int,
                length_penalty: float = 0.6) -> DecodeResult:
    """Beam search with separate alive and finished sets (see the module docstring).

    ``cache`` has leading dimension ``batch_size``; it is tiled to ``batch_size * beam_size``
    (row ``b``'s beams are rows ``b*K .. b*K+K-1``) and, after every step, every cache leaf and
    the prefix buffer are reordered by the surviving beams' parents. ``start_id`` is one id or
    one per row. ``length_penalty`` (alpha) must be a Python float: it decides statically
    whether early stopping is sound. Returns the ``K`` best finished hypotheses per row, best
    first.
    """
    _check_sizes(batch_size, max_length, beam_size)
    B, K, L, alpha = batch_size, beam_size, max_length, length_penalty
    cache0 = jax.tree.map(lambda x: jnp.repeat(x, K, axis=0), cache)
    seqs0 = _init_prefix(start_id, B, K, L, pad_id).reshape(B, K, L)
    # Only beam 0 is real at the start, so its K copies do not yield K identical hypotheses.
    logp0 = jnp.tile(jnp.array([0.0] + [_NEG_INF] * (K - 1), jnp.float32), (B, 1))
    state0 = _BeamState(
        step=jnp.int32(0), alive_seqs=seqs0, alive_logp=logp0, cache=cache0,
        fin_seqs=jnp.full((B, K, L), pad_id, jnp.int32),
        fin_scores=jnp.full((B, K), _NEG_INF, jnp.float32),
        fin_lengths=jnp.zeros((B, K), jnp.int32))

    def cond(s: _BeamState) -> jax.Array:
        running = s.step < L - 1
        if alpha < 0:  # the upper bound below only holds for a non-decreasing penalty factor
            return running
        best_alive = s.alive_logp[:, 0] / length_penalty_factor(L - 1, alpha)
        return running & ~jnp.all(s.fin_scores[:, -1] > best_alive)

    def body(s: _BeamState) -> _BeamState:
        step = s.step
        logits, cache = logits_fn(s.alive_seqs.reshape(B * K, L), step, s.cache)
        logp = _log_probs(logits, B * K)
        vocab = logp.shape[-1]
        cand = (s.alive_logp[:, :, None] + logp.reshape(B, K, vocab)).reshape(B, K * vocab)
        # 2K candidates: at most K end in EOS (one per parent), so K non-EOS ones remain.
        top_logp, top_idx = jax.lax.top_k(cand, min(2 * K, K * vocab))
        parent = top_idx // vocab
        token = (top_idx % vocab).astype(jnp.int32)
        seqs = _gather_beams(s.alive_seqs, parent)
        seqs = jax.lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, step + 1))

        # Finished set: EOS-terminated candidates (at the last step, every candidate) among the
        # K best; an EOS ranked K..2K-1 is dropped, so that beam_size=1 is exactly greedy.
        length = step + 1
        in_top_k = jnp.arange(top_idx.shape[1]) < K
        done = ((token == eos_id) | (length == L - 1)) & in_top_k
        new_scores = jnp.where(done, top_logp / length_penalty_factor(length, alpha), _NEG_INF)
        all_scores = jnp.concatenate([s.fin_scores, new_scores], axis=1)
        all_seqs = jnp.concatenate([s.fin_seqs, seqs], axis=1)
        all_lengths = jnp.concatenate(
            [s.fin_lengths, jnp.full(new_scores.shape, length, jnp.int32)], axis=1)
        fin_scores, keep = jax.lax.top_k(all_scores, K)

        # Alive set: the best K candidates not ending in EOS; cache follows their parents.
        alive_logp, pick = jax.lax.top_k(jnp.where(token == eos_id, _NEG_INF, top_logp), K)
        flat_parent = (jnp.arange(B)[:, None] * K + _gather_beams(parent, pick)).reshape(-1)
        return _BeamState(
            step=step + 1, alive_seqs=_gather_beams(seqs, pick), alive_logp=alive_logp,
            cache=jax.tree.map(lambda x: jnp.take(x, flat_parent, axis=0), cache),
            fin_seqs=_gather_beams(all_seqs, keep), fin_scores=fin_scores,
            fin_lengths=_gather_beams(all_lengths, keep))

    final = jax.lax.while_loop(cond, body, state0)
    return DecodeResult(tokens=final.fin_seqs, scores=final.fin_scores,
                        lengths=final.fin_lengths)
