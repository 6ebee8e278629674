"""Sampling a token from a vocabulary-wide softmax: every id's Gumbel noise, or two levels.

XLM-E's generator replaces each masked token with a sample from its softmax over the
vocabulary (as ELECTRA's; how to draw it is not a modelling choice: the papers name no
method). ``jax.random.categorical`` (``"gumbel"``) adds Gumbel noise to every logit and takes
the argmax: one threefry draw and two logarithms per vocabulary entry, 250k of them per masked
position. For XLM-E's base step on an H200 the cost model puts that fusion at 5.0 ms, bound by
the integer arithmetic of the random bits rather than by reading the logits; the 41309d3
trace's fusion of the same name took 8.0 ms (docs/performance.md).

``"two_level"`` draws from the same distribution with one uniform number and a chunk of Gumbel
noise per position: the vocabulary is cut into chunks of ``chunk`` ids; two passes over the
logits give each chunk's softmax mass (its max, then the sum of exponentials below it); the
uniform number picks a chunk by inverse CDF over those masses (P(chunk) = its mass / the
total); Gumbel noise over that chunk's ids picks the id (P(id | chunk) = its softmax within the
chunk). The product is the id's softmax probability, exactly up to float32 rounding of the
masses. The draws differ from ``"gumbel"``'s, so a run switched between them trains on other
replacements from the same distribution (``tests/objectives/vocab_sampling_test.py``
checks both against the softmax with a chi-square test).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from xlm_jax.models import attention_backends

SAMPLERS = ("gumbel", "two_level", "auto")
# Ids per chunk of the two-level sampler (our choice): 489 chunks of a 250k vocabulary, so the
# inverse CDF runs over a short row and the Gumbel draw over 512 ids instead of 250,002.
CHUNK: int = 512


def check_sampler(method: str, owner: str) -> str:
    """``method`` if it names a sampler, else a ValueError naming ``owner`` and the setting."""
    if method not in SAMPLERS:
        raise ValueError(f"{owner}: sampler={method!r} must be one of {', '.join(SAMPLERS)}")
    return method


def resolve(method: str) -> str:
    """``method``, with ``"auto"`` made ``"two_level"`` when the step is lowered for a GPU and
    ``"gumbel"`` otherwise (`attention_backends.target_platform`, so a compile-only target
    counts). On a GPU the Gumbel fusion is bound by threefry's integer arithmetic (8.0 ms in
    the 41309d3 trace); on a TPU the cost model's datasheet ceiling predicts the opposite for
    XLM-E's base step on v5p (gumbel 39.7 ms, two_level 44.6: the chunks' padding and
    relayout cost more there than the random bits; docs/performance.md). Our choice."""
    if method != "auto":
        return method
    return "two_level" if attention_backends.target_platform() == "gpu" else "gumbel"


def categorical(key: jax.Array, logits: jax.Array, method: str = "gumbel",
                chunk: int = CHUNK) -> jax.Array:
    """One id per row of ``logits [..., V]``, drawn from ``softmax(logits)`` by ``method``
    (``"gumbel"``, ``"two_level"``, or ``"auto"``: see `resolve`).

    Entries of ``-inf`` (or logits so low that their float32 exponent underflows, as
    ``heads.PADDED_LOGIT``) are never drawn, unless a whole row is such (then some id of the
    row). Returns int32 ``[...]``.
    """
    method = resolve(check_sampler(method, "vocab_sampling.categorical"))
    if method == "gumbel":
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    if chunk < 1:
        raise ValueError(f"two_level sampler: chunk={chunk!r} must be >= 1")
    *lead, vocab = logits.shape
    n_chunks = -(-vocab // chunk)
    x = logits.astype(jnp.float32)
    if n_chunks * chunk != vocab:
        widths = [(0, 0)] * len(lead) + [(0, n_chunks * chunk - vocab)]
        x = jnp.pad(x, widths, constant_values=-jnp.inf)
    x = x.reshape(*lead, n_chunks, chunk)
    chunk_max = jnp.max(x, axis=-1)  # [..., C]; -inf for a chunk of -inf only
    finite = jnp.isfinite(chunk_max)
    safe_max = jnp.where(finite, chunk_max, 0.0)
    below = jnp.sum(jnp.exp(x - safe_max[..., None]), axis=-1)  # Σ exp(x - chunk max)
    top = jnp.max(safe_max, axis=-1, keepdims=True)
    mass = jnp.where(finite, below * jnp.exp(safe_max - top), 0.0)  # ∝ Σ_chunk softmax
    chunk_key, id_key = jax.random.split(key)
    picked = choose_chunk(mass, jax.random.uniform(chunk_key, tuple(lead)))
    within = jnp.take_along_axis(x, picked[..., None, None], axis=-2)[..., 0, :]
    offset = jax.random.categorical(id_key, within, axis=-1)
    return jnp.minimum(picked * chunk + offset, vocab - 1).astype(jnp.int32)


def choose_chunk(mass: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse CDF over ``mass [..., C]`` (non-negative, unnormalised) at ``u [...]`` in
    [0, 1): the first chunk whose cumulative mass exceeds ``u`` x the total. A chunk of zero
    mass is never chosen, also when rounding puts ``u`` x total at the total (then the last
    chunk with mass is)."""
    cdf = jnp.cumsum(mass, axis=-1)
    target = u * cdf[..., -1]
    picked = jnp.sum((cdf <= target[..., None]).astype(jnp.int32), axis=-1)
    n = mass.shape[-1]
    last = n - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)  # the last chunk with mass
    return jnp.minimum(picked, last).astype(jnp.int32)
