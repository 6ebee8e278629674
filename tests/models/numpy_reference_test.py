"""An independent float64 numpy forward pass of the encoder, compared with the Flax model on
padded and packed batches for the variants HF XLM-R cannot check: pre-LN (every demo's
model), XLM-E's gated relative bias (one bucket table shared by all layers, or one per layer),
language embeddings (ERNIE-M) and cross-attention (VECO). The reference is written from the
formulas (T5 bidirectional log buckets, the gate r = d (1 + g_u + (1 - g_u) w g_r), fairseq
position offsets, exact GELU), reading only the parameter values from the Flax tree; every
parameter is perturbed away from its initial value so that biases, norms and gates count."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer

D, H, F, V, S = 16, 4, 24, 30, 5


def _ln(x, p, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _bucket(rel, num_buckets, max_distance):
    half = num_buckets // 2
    exact = half // 2
    out = np.where(rel > 0, half, 0)
    n = np.abs(rel)
    with np.errstate(divide="ignore"):
        large = exact + np.floor(np.log(np.maximum(n, 1) / exact)
                                 / math.log(max_distance / exact) * (half - exact))
    large = np.minimum(large, half - 1).astype(int)
    return out + np.where(n < exact, n, large)


def _attention(xq, xkv, p, mask, bias=None, gate=None):
    """One head block for one row: xq [Tq, D], xkv [Tk, D], mask [Tq, Tk] bool."""
    q = np.einsum("td,dhk->thk", xq, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("td,dhk->thk", xkv, p["key"]["kernel"]) + p["key"]["bias"]
    v = np.einsum("td,dhk->thk", xkv, p["value"]["kernel"]) + p["value"]["bias"]
    scores = np.einsum("qhk,thk->hqt", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        g_u = 1 / (1 + np.exp(-np.einsum("qhk,hk->hq", q, gate["gate_u"])))
        g_r = 1 / (1 + np.exp(-np.einsum("qhk,hk->hq", q, gate["gate_v"])))
        w = gate["gate_w"][:, None]
        scores = scores + bias * (1 + g_u + (1 - g_u) * w * g_r)[..., None]
    scores = np.where(mask[None], scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    e = np.where(mask[None], np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    probs = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    out = np.einsum("hqt,thk->qhk", probs, v)
    return np.einsum("qhk,hkd->qd", out, p["out"]["kernel"]) + p["out"]["bias"]


def reference(cfg, p, ids, positions, segments, lang_ids=None, memory=None, memory_valid=None):
    """Hidden states [B, T, D] of every row, float64."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
    out = []
    for b in range(ids.shape[0]):
        valid = segments[b] > 0
        e = p["embeddings"]
        x = e["word_embeddings"]["embedding"][ids[b]] + e["token_type_embeddings"]["embedding"][0]
        if cfg.position_type in ("absolute", "both"):
            rows = np.where(valid, positions[b] + cfg.pad_id + 1, cfg.pad_id)
            x = x + e["position_embeddings"]["embedding"][rows]
        if cfg.num_languages:
            x = x + e["lang_embeddings"]["embedding"][lang_ids[b]]
        x = _ln(x, e["LayerNorm"], cfg.layer_norm_eps)
        mask = (segments[b][:, None] == segments[b][None, :]) & valid[:, None] & valid[None, :]
        rel = positions[b][None, :] - positions[b][:, None]
        buckets = _bucket(rel, cfg.relative_buckets, cfg.relative_max_distance)
        for i in range(cfg.num_layers):
            lp = p[f"layers_{i}"]
            bias = gate = None
            if cfg.position_type in ("relative", "both"):
                table = p["rel_pos" if cfg.share_relative_table else f"rel_pos_{i}"]
                bias = np.transpose(table["rel_embedding"][buckets], (2, 0, 1))
                gate = lp["attention"]["gated_bias"]
            blocks = [(lambda h, lp=lp, bias=bias, gate=gate: _attention(
                h, h, lp["attention"], mask, bias, gate), lp["attention_norm"])]
            if memory is not None:
                cross = valid[:, None] & memory_valid[b][None, :]
                mem = np.asarray(memory[b], np.float64)
                blocks.append((lambda h, lp=lp, mem=mem, cross=cross: _attention(
                    h, mem, lp["cross_attention"], cross), lp["cross_attention_norm"]))
            mlp = lp["mlp"]
            blocks.append((lambda h, mlp=mlp: _gelu(
                h @ mlp["intermediate"]["kernel"] + mlp["intermediate"]["bias"])
                @ mlp["output"]["kernel"] + mlp["output"]["bias"], lp["mlp_norm"]))
            for fn, norm in blocks:
                if cfg.ln_style == "pre":
                    x = x + fn(_ln(x, norm, cfg.layer_norm_eps))
                else:
                    x = _ln(x + fn(x), norm, cfg.layer_norm_eps)
        if cfg.ln_style == "pre":
            x = _ln(x, p["final_norm"], cfg.layer_norm_eps)
        out.append(x)
    return np.stack(out)


def _batch(packed):
    """ids, positions, segments [2, 12]: two padded rows, or rows packing 2-3 examples."""
    rng = np.random.default_rng(0)
    ids = rng.integers(4, V, size=(2, 12))
    if packed:
        segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 0],
                             [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0]])
    else:
        segments = np.array([[1] * 12, [1] * 7 + [0] * 5])
    positions = np.zeros_like(segments)
    for b in range(2):
        for s in set(segments[b]) - {0}:
            where = np.flatnonzero(segments[b] == s)
            positions[b, where] = np.arange(len(where))
    ids = np.where(segments > 0, ids, 1)
    return ids, positions, segments


VARIANTS = {
    "pre_ln": dict(ln_style="pre"),
    "gated_shared_table": dict(position_type="both"),
    "gated_per_layer_tables_pre_ln": dict(position_type="relative", share_relative_table=False,
                                          ln_style="pre"),
    "languages_and_cross_attention": dict(num_languages=4, cross_attention=True),
    "everything_pre_ln": dict(num_languages=4, cross_attention=True, position_type="both",
                              ln_style="pre", share_relative_table=False),
}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_flax_encoder_matches_the_numpy_reference(name, packed):
    cfg = get_config("tiny", vocab_size=V, num_layers=2, hidden_size=D, num_heads=H,
                     mlp_dim=F, max_positions=20, dropout_rate=0.0,
                     attention_dropout_rate=0.0, **VARIANTS[name])
    ids, positions, segments = _batch(packed)
    net = Transformer(cfg, with_mlm_head=False)
    kw = {"positions": jnp.asarray(positions), "segment_ids": jnp.asarray(segments)}
    lang = None
    if cfg.num_languages:
        lang = np.where(segments > 0, np.array([[1], [3]]), 0)
        kw["lang_ids"] = jnp.asarray(lang)
    memory = memory_valid = None
    if cfg.cross_attention:
        memory = np.random.default_rng(1).normal(size=(2, S, D)).astype(np.float32)
        memory_valid = np.arange(S)[None, :] < np.array([[5], [3]])
        cross = (segments > 0)[:, None, :, None] & memory_valid[:, None, None, :]
        kw.update(encoder_states=jnp.asarray(memory), cross_mask=jnp.asarray(cross))
    params = nn.meta.unbox(net.init(jax.random.PRNGKey(0), jnp.asarray(ids), **kw)["params"])
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    params = jax.tree_util.tree_unflatten(tree, [
        x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
    got = np.asarray(net.apply({"params": params}, jnp.asarray(ids), method=Transformer.encode,
                               **kw).last_hidden_state)
    want = reference(cfg, params, ids, positions, segments, lang, memory, memory_valid)
    valid = segments > 0
    np.testing.assert_allclose(got[valid], want[valid], atol=2e-5, rtol=0)
