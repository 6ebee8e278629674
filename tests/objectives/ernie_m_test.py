"""ERNIE-M CAMLM and BTMLM: the visibility each pass hands the attention layers against
hand-written matrices, a CAMLM prediction's independence of its own side (through the model),
stage 1's pseudo-tokens (no gradient, from the current parameters), the losses against numpy
from the same logits, the stage inputs, and the argument errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.token_mask import TokenMask
from xlm_jax.models.transformer import MultiHeadAttention, Transformer
from xlm_jax.objectives import ernie_m
from xlm_jax.objectives.base import WeightedObjective, init_params, objective_loss, report
from xlm_jax.objectives.ernie_m import BackTranslationMLM, CrossAttentionMLM
from xlm_jax.objectives.mlm import MaskedLM

V, MASK = 64, 63
CFG = get_config("tiny", vocab_size=V, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 num_languages=6)
NET = Transformer(CFG)  # two layers: enough to see every layer's mask


def _params(obj, seed=0):
    return nn.meta.unbox(init_params(obj.model, [WeightedObjective(obj)], 16,
                                     jax.random.PRNGKey(seed)))


# One row: a 4-token source (<s> a b </s>, language 2) and a 3-token target (</s> c </s>,
# language 3), then one pad.
PAIR = {"input_ids": np.array([[0, 10, 11, 2, 2, 12, 2, 1]]),
        "positions": np.array([[0, 1, 2, 3, 4, 5, 6, 0]]),
        "segment_ids": np.array([[1, 1, 1, 1, 1, 1, 1, 0]]),
        "pair_side": np.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
        "lang_ids": np.array([[2, 2, 2, 2, 3, 3, 3, 0]])}
MONO = {k: np.where(PAIR["pair_side"] == 1, v, 0 if k != "input_ids" else 1)
        for k, v in PAIR.items()}


def _grid(rows):
    """8 x 8 bool matrix from a list of '1'/'.' strings (padding rows/cols all '.')."""
    return np.array([[c == "1" for c in r] for r in rows])


S, T, X = "1111....", "....111.", "........"
EXPECTED = {
    "mmlm": _grid([S, S, S, S, X, X, X, X]),
    "tlm": _grid(["1111111."] * 7 + [X]),
    # predicting the source: a source token sees the target and itself; the target itself
    "camlm_src": _grid(["1...111.", ".1..111.", "..1.111.", "...1111.", T, T, T, X]),
    # predicting the target: a target token sees the source and itself; the source itself
    "camlm_tgt": _grid([S, S, S, S, "11111...", "1111.1..", "1111..1.", X]),
    # stage 1: the sentence sees the sentence; a placeholder the sentence and itself
    "btmlm_stage1": _grid([S, S, S, S, "11111...", "1111.1..", "1111..1.", X]),
    "btmlm_stage2": _grid(["1111111."] * 7 + [X]),
}


def _attention_masks(fn):
    """Runs fn() and returns the self-attention masks the attention layers received."""
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, MultiHeadAttention) and context.method_name == "__call__":
            mask = args[2]  # an array, or a TokenMask (the ERNIE-M passes describe theirs)
            mask = mask.materialise() if isinstance(mask, TokenMask) else mask
            seen.append(np.asarray(mask)[0, 0])
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        fn()
    return seen


def _run_objective(obj, batch, seed=1):
    params = _params(obj)
    prep = obj.prepare({k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(seed))
    return _attention_masks(lambda: obj.loss(params, prep, jax.random.PRNGKey(2), {}, True))


def test_every_pass_sees_what_the_paper_says():
    layers = 2
    mmlm = _run_objective(MaskedLM(NET, "mmlm", "mono", max_predictions=2), MONO)
    tlm = _run_objective(MaskedLM(NET, "tlm", "pair", max_predictions=2), PAIR)
    camlm = _run_objective(CrossAttentionMLM(NET, max_predictions=2, passes="two"), PAIR)
    one = _run_objective(CrossAttentionMLM(NET, max_predictions=2, passes="one"), PAIR)
    # one placeholder (25% of the 4-token sentence): the target side `</s> <mask> </s>` takes
    # the pair's target columns, so the stage-1 matrix is CAMLM's target pass
    bt = _run_objective(BackTranslationMLM(NET, languages=None, target_languages=["a", "b"],
                                           proportion=0.25, max_predictions=2), MONO)
    assert len(mmlm) == len(tlm) == len(one) == layers and len(camlm) == len(bt) == 2 * layers
    for got, name in [(mmlm, "mmlm"), (tlm, "tlm"), (camlm[:layers], "camlm_src"),
                      (camlm[layers:], "camlm_tgt"), (bt[:layers], "btmlm_stage1"),
                      (bt[layers:], "btmlm_stage2")]:
        for layer, mask in enumerate(got):
            np.testing.assert_array_equal(mask, EXPECTED[name], err_msg=f"{name} layer {layer}")
    # Fig. 2's single matrix: each side sees the other side and itself
    fig2 = _grid(["1...111.", ".1..111.", "..1.111.", "...1111.",
                  "11111...", "1111.1..", "1111..1.", X])
    for mask in one:
        np.testing.assert_array_equal(mask, fig2)


@pytest.mark.parametrize("side", [1, 2])
def test_camlm_prediction_ignores_its_own_side_at_every_depth(side):
    """Changing any other token of the predicted side leaves that side's logits unchanged
    (two passes); in Fig. 2's single pass the same change reaches them in two hops."""
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, 24, V, "pair", seed=4).items()}

    compiled = {}

    def logits(obj, ids):
        prep = obj.prepare(batch, jax.random.PRNGKey(7))
        if obj not in compiled:
            compiled[obj] = jax.jit(lambda p, x: obj.side_logits(
                p, {**prep, "input_ids": x}, jax.random.PRNGKey(0), deterministic=True))
        src, tgt = compiled[obj](params, prep["input_ids"] if ids is None else ids)
        return prep, np.asarray(src if side == 1 else tgt)

    two = CrossAttentionMLM(NET, max_predictions=3, mask_prob=0.3, passes="two")
    one = CrossAttentionMLM(NET, max_predictions=3, mask_prob=0.3, passes="one")
    params = _params(two)
    prep, base = logits(two, None)
    p = two.masking.max_predictions
    slots = np.asarray(prep["target_positions"])[:, (side - 1) * p:side * p]
    w = np.asarray(prep["target_weights"])[:, (side - 1) * p:side * p]
    assert w.sum() >= 2
    pair_side, ids = np.asarray(prep["pair_side"]), np.asarray(prep["input_ids"])
    segs = np.asarray(prep["segment_ids"])
    leaked = 0
    for b in range(2):
        seg = segs[b, slots[b, 0]]
        for j in np.flatnonzero((pair_side[b] == side) & (segs[b] == seg)):
            if j in slots[b][w[b] > 0]:
                continue
            changed = ids.copy()
            changed[b, j] = 5 if ids[b, j] != 5 else 6
            _, after = logits(two, jnp.asarray(changed))
            np.testing.assert_allclose(after[b][w[b] > 0], base[b][w[b] > 0], atol=1e-6,
                                       err_msg=f"row {b} token {j}")
            _, one_before = logits(one, None)
            _, one_after = logits(one, jnp.asarray(changed))
            leaked += not np.allclose(one_after[b][w[b] > 0], one_before[b][w[b] > 0], atol=1e-6)
    assert leaked > 0  # the single pass does let a 3-layer model read its own side


def _np_ce(logits, targets, weights):
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    return (nll * np.asarray(weights)).sum(), np.asarray(weights).sum()


def test_camlm_loss_is_the_sum_of_the_two_side_means():
    obj = CrossAttentionMLM(NET, max_predictions=4, mask_prob=0.3)
    params = _params(obj)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 24, V, "pair", seed=1).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(3))
    src, tgt = obj.side_logits(params, prep, jax.random.PRNGKey(0), True)
    out = obj.loss(params, prep, jax.random.PRNGKey(0), {}, True)
    p = 4
    s_sum, s_n = _np_ce(src, prep["target_ids"][:, :p], prep["target_weights"][:, :p])
    t_sum, t_n = _np_ce(tgt, prep["target_ids"][:, p:], prep["target_weights"][:, p:])
    assert s_n > 0 and t_n > 0
    counts = obj.counts(prep)
    assert float(counts["src"]) == s_n and float(counts["tgt"]) == t_n
    np.testing.assert_allclose(float(objective_loss(obj, out.losses, counts)),
                               s_sum / s_n + t_sum / t_n, rtol=1e-5)
    # each side's masked set is on that side only, and every selected token is restored
    side = np.asarray(prep["pair_side"])
    pos, w = np.asarray(prep["target_positions"]), np.asarray(prep["target_weights"])
    for k, want in ((slice(0, p), 1), (slice(p, 2 * p), 2)):
        got = np.take_along_axis(side, pos[:, k], 1)[w[:, k] > 0]
        assert (got == want).all()
    reported = report(obj, out.losses, out.metrics, counts)
    np.testing.assert_allclose(float(reported["src_loss"]), s_sum / s_n, rtol=1e-5)
    np.testing.assert_allclose(float(reported["tgt_loss"]), t_sum / t_n, rtol=1e-5)
    assert float(reported["count"]) == s_n + t_n


def _btmlm(**kw):
    kw = {"target_languages": ["de", "fr", "en"], "max_predictions": 4, "mask_prob": 0.3, **kw}
    # the run's language table: en=1, de=2, fr=3
    return BackTranslationMLM(NET, languages=["en", "de", "fr", "ja", "zh"], **kw)


@pytest.mark.parametrize("restart", [False, True])
def test_btmlm_stage_inputs(restart):
    """Stage 1's row is CAMLM's layout: the (cut) sentence, then `</s>`, the placeholders and
    `</s>` on side 2 in the target language, positions restarting at side 2 when asked
    (tests/objectives/ernie_m_layout_test.py compares it with a CAMLM row)."""
    obj = _btmlm(proportion=0.2, restart_positions=restart)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(6, 20, V, "mono", seed=3,
                                                           num_languages=5).items()}
    n = (np.asarray(batch["segment_ids"]) > 0).sum(1)
    prep = obj.prepare(batch, jax.random.PRNGKey(1))
    keep_max = int((20 - 2) // 1.2)  # 15: the target side's two </s> take room too
    assert n.max() > keep_max  # the seed has rows that must be cut
    ids, s1 = np.asarray(batch["input_ids"]), np.asarray(prep["stage1_ids"])
    for b in range(6):
        keep = min(n[b], keep_max)
        m = max(1, int(np.floor(0.2 * keep + 0.5)))
        end = keep + m + 2
        src = ids[b, :keep].copy()
        if n[b] > keep:
            src[-1] = 2  # the cut sentence ends with </s>
        np.testing.assert_array_equal(s1[b, :keep], src)
        np.testing.assert_array_equal(s1[b, keep:end], [2] + [MASK] * m + [2])
        assert (s1[b, end:] == CFG.pad_id).all()
        side2 = np.arange(m + 2) if restart else np.arange(keep, end)
        np.testing.assert_array_equal(prep["positions"][b, :end],
                                      np.concatenate([np.arange(keep), side2]))
        np.testing.assert_array_equal(prep["pair_side"][b, :end], [1] * keep + [2] * (m + 2))
        own, tgt = batch["lang_ids"][b, 0], prep["target_language"][b]
        assert tgt in (1, 2, 3) and tgt != own or own not in (1, 2, 3) and tgt in (1, 2, 3)
        np.testing.assert_array_equal(prep["lang_ids"][b, :keep], own)
        np.testing.assert_array_equal(prep["lang_ids"][b, keep:end], tgt)
        np.testing.assert_array_equal(prep["placeholder_positions"][b][
            np.asarray(prep["placeholder_weights"][b]) > 0], np.arange(keep + 1, keep + 1 + m))
        # stage 2 masks sentence tokens only
        w = np.asarray(prep["target_weights"][b]) > 0
        assert (np.asarray(prep["target_positions"][b])[w] < keep).all() and w.any()


def test_btmlm_target_language_is_never_the_source_when_another_exists():
    obj = _btmlm(target_languages=["en", "de"])
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(64, 12, V, "mono", seed=0,
                                                           num_languages=3).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(0))
    own, tgt = np.asarray(batch["lang_ids"][:, 0]), np.asarray(prep["target_language"])
    np.testing.assert_array_equal(tgt[own == 1], 2)  # en -> de
    np.testing.assert_array_equal(tgt[own == 2], 1)  # de -> en
    assert set(tgt[own == 3]) == {1, 2}  # fr -> either


def test_stage1_sends_no_gradient_and_follows_the_current_parameters():
    obj = _btmlm(proportion=0.5)
    params = _params(obj)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 20, V, "mono", seed=2,
                                                           num_languages=5).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(4))
    pseudo = obj.pseudo_tokens(params, prep)
    w = np.asarray(pseudo.weights) > 0
    assert w.sum() >= 8 and (np.asarray(pseudo.ids)[w] >= 4).all()
    assert (np.asarray(pseudo.ids)[w] != MASK).all()

    # the pseudo-tokens are the argmax of the stage-1 pass (sentence + placeholders)
    mask = ernie_m.visibility(prep, "btmlm_stage1")
    logits = NET.apply({"params": params["encoder"]}, prep["stage1_ids"],
                       positions=prep["positions"], attention_mask=mask,
                       segment_ids=prep["segment_ids"], lang_ids=prep["lang_ids"],
                       method=lambda m, ids, **k: m.mlm_logits(
                           m.encode(ids, **k).last_hidden_state, prep["placeholder_positions"]))
    logits = np.array(logits)
    logits[..., :4] = -np.inf
    logits[..., MASK] = -np.inf
    np.testing.assert_array_equal(np.asarray(pseudo.ids)[w], logits.argmax(-1)[w])

    # no gradient through stage 1: the gradient equals that of stage 2 with the pseudo-tokens
    # held fixed as data
    def loss(p):
        out = obj.loss(p, prep, jax.random.PRNGKey(0), {}, True)
        return out.losses["loss"]

    fixed_ids = obj.stage2_ids(prep, pseudo)

    def fixed(p):
        lg = ernie_m._encode_logits(NET, p["encoder"], fixed_ids, prep,
                                    ernie_m.visibility(prep, "bidirectional"),
                                    prep["target_positions"], jax.random.PRNGKey(0), True)
        return ernie_m.masked_lm_sums(lg, prep["target_ids"],
                                                      prep["target_weights"])[0]

    # (to float32 rounding, relative to the largest gradient: the two are different programs,
    # which XLA may fuse differently)
    g, g_fixed = jax.jit(jax.grad(loss))(params), jax.jit(jax.grad(fixed))(params)
    leaves = [np.asarray(b) for b in jax.tree_util.tree_leaves(g_fixed)]
    scale = max(np.abs(b).max() for b in leaves)
    for a, b in zip(jax.tree_util.tree_leaves(g), leaves):
        np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-5 * scale)
    # ... and the pseudo-tokens come from the parameters it is given
    other = obj.pseudo_tokens(_params(obj, seed=9), prep)
    assert (np.asarray(other.ids)[w] != np.asarray(pseudo.ids)[w]).mean() > 0.5


def test_btmlm_loss_matches_numpy():
    obj = _btmlm(decoding="sample")
    params = _params(obj)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 20, V, "mono", seed=5,
                                                           num_languages=5).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(4))
    pseudo = obj.pseudo_tokens(params, prep)
    ids = obj.stage2_ids(prep, pseudo)
    lg = ernie_m._encode_logits(NET, params["encoder"], ids, prep,
                                ernie_m.visibility(prep, "bidirectional"),
                                prep["target_positions"], jax.random.PRNGKey(0), True)
    out = obj.loss(params, prep, jax.random.PRNGKey(0), {}, True)
    s, n = _np_ce(lg, prep["target_ids"], prep["target_weights"])
    np.testing.assert_allclose(float(out.losses["loss"]), s, rtol=1e-5)
    assert float(obj.counts(prep)["loss"]) == n > 0
    # sampled pseudo-tokens differ from the argmax ones but are regular tokens
    argmax = _btmlm().pseudo_tokens(params, prep)
    w = np.asarray(pseudo.weights) > 0
    assert (np.asarray(pseudo.ids)[w] != np.asarray(argmax.ids)[w]).any()
    assert (np.asarray(pseudo.ids)[w] >= 4).all()


@pytest.mark.parametrize("make, match", [
    (lambda: BackTranslationMLM(NET, languages=None, target_languages=["de"], proportion=0.0),
     r"BackTranslationMLM\(name='btmlm'\): proportion=0.0 .* must be in \(0, 1\]"),
    (lambda: BackTranslationMLM(NET, languages=None, target_languages=["de"], proportion=1.5),
     r"proportion=1.5"),
    (lambda: BackTranslationMLM(NET, languages=None, target_languages=[]),
     r"target_languages is empty: BTMLM needs the languages of the parallel data"),
    (lambda: BackTranslationMLM(NET, languages=None, target_languages=["de"], decoding="beam"),
     r"decoding='beam' must be one of argmax, sample"),
    (lambda: BackTranslationMLM(Transformer(CFG.replace(num_languages=0)), languages=None,
                                target_languages=["de"]),
     r"BackTranslationMLM\(name='btmlm'\) needs a model with language embeddings, but "
     r"num_languages=0"),
    (lambda: CrossAttentionMLM(Transformer(CFG.replace(num_languages=0))),
     r"CrossAttentionMLM\(name='camlm'\) needs a model with language embeddings"),
    (lambda: CrossAttentionMLM(NET, passes="three"), r"passes='three' must be one of two, one"),
    (lambda: _btmlm(target_languages=["de", "xx"]),
     r"target_languages has 'xx': language 'xx' is not in the language list"),
    (lambda: _btmlm(start_step=150000, train_steps=150000),
     r"BackTranslationMLM\(name='btmlm'\): start_step=150000 is beyond the run's length "
     r"\(train_steps=150000\)"),
    (lambda: _btmlm(start_step=-1), r"start_step=-1 must be an integer >= 0"),
    (lambda: CrossAttentionMLM(NET, corruption="bert"),
     r"corruption='bert' must be one of mask, 80_10_10"),
])
def test_bad_settings_fail_with_the_setting_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_zero_language_table_continues_xlmr_exactly():
    """runs/ernie_m_base.gin adds a language table to XLM-R with language_init='zeros': the
    loaded model computes XLM-R's hidden states whatever the lang_ids."""
    from xlm_jax.train.step import load_pretrained_params

    plain = CFG.replace(num_languages=0)
    ids = jnp.asarray(PAIR["input_ids"])
    xlmr = Transformer(plain).init(jax.random.PRNGKey(1), ids)["params"]
    ernie = Transformer(CFG.replace(language_init="zeros"))
    fresh = nn.meta.unbox(ernie.init(jax.random.PRNGKey(2), ids, lang_ids=ids * 0 + 1)["params"])
    loaded = load_pretrained_params({"encoder": fresh}, nn.meta.unbox(xlmr), "xlmr")["encoder"]
    want = Transformer(plain).apply({"params": nn.meta.unbox(xlmr)}, ids).last_hidden_state
    got = ernie.apply({"params": loaded}, ids, lang_ids=jnp.asarray(PAIR["lang_ids"])
                      ).last_hidden_state
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    normal = Transformer(CFG).init(jax.random.PRNGKey(2), ids, lang_ids=ids)["params"]
    assert np.abs(np.asarray(nn.meta.unbox(normal)["embeddings"]["lang_embeddings"]["embedding"])
                  ).max() > 0  # the default table is not zero


def test_btmlm_start_step_keeps_the_loss_off_until_its_update():
    """Before its `start_step`-th update BTMLM's loss and gradient are 0; from then on the
    loss is the one without a start step."""
    late, now = _btmlm(start_step=2), _btmlm()
    params = _params(now)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 24, V, "mono", seed=1).items()}
    prep = now.prepare(batch, jax.random.PRNGKey(1))
    ref = float(now.loss(params, prep, jax.random.PRNGKey(2), now.init_state(params),
                         True).losses["loss"])
    assert ref > 0 and now.init_state(params) == {}
    state = late.init_state(params)
    got = []
    for _ in range(3):
        out = late.loss(params, prep, jax.random.PRNGKey(2), state, True)
        grad = jax.grad(lambda p: late.loss(p, prep, jax.random.PRNGKey(2), state,
                                            True).losses["loss"])(params)
        got.append((float(out.losses["loss"]), max(float(jnp.abs(g).max())
                                             for g in jax.tree_util.tree_leaves(grad))))
        state = late.after_update(params, state, {})
    assert got[0] == (0.0, 0.0) and got[1] == (0.0, 0.0)
    assert got[2][0] == pytest.approx(ref, rel=1e-6) and got[2][1] > 0
