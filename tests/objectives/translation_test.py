"""VECO translation fine-tuning: the label-smoothed loss against numpy, the decoder reading the
encoder's embeddings and head, the decoder taken from the stack's last/first layers after
`init_from`, causal teacher forcing, greedy decoding through the evaluation path equal to an
uncached step-by-step argmax, and the errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.evaluation.bleu import translate_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params
from xlm_jax.objectives.translation import Translation

V = 40
CFG = get_config("tiny", vocab_size=V, num_layers=3, hidden_size=32, num_heads=4, mlp_dim=48,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 cross_attention=True, num_languages=4, pad_vocab_to_multiple_of=8)


# VECO's way: no language table; three language-id tokens in the padding rows 40..47
TOKENS = ("a", "b", "c")
TOKEN_CFG = CFG.replace(num_languages=0, pad_vocab_to_multiple_of=16)


def _setup(cfg=CFG, **kw):
    net = Transformer(cfg)
    obj = Translation(net, decoder_layers=2, **{"languages": None, **kw})
    params = nn.meta.unbox(init_params(net, [WeightedObjective(obj)], 16, jax.random.PRNGKey(0)))
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(3, 12, V, "split_pair", seed=1,
                                                           num_languages=3).items()}
    return obj, params, obj.prepare(batch, jax.random.PRNGKey(0))


def test_label_smoothed_loss_matches_numpy():
    obj, params, prep = _setup(label_smoothing=0.2)
    memory = obj.encode_source(params, prep)
    logits = np.asarray(obj.decoder_logits(params, prep, memory), np.float64)
    out = obj.loss(params, prep, jax.random.PRNGKey(1), {}, deterministic=True)
    y, seg = np.asarray(prep["y_input_ids"]), np.asarray(prep["y_segment_ids"])
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    total, count = 0.0, 0
    for b in range(y.shape[0]):
        for t in range(y.shape[1] - 1):
            if seg[b, t + 1] > 0:
                nll = -logp[b, t, y[b, t + 1]]
                smooth = -logp[b, t, :V].mean()  # the real vocabulary, not its padding
                total += 0.8 * nll + 0.2 * smooth
                count += 1
    assert logits.shape[-1] == 40 and count == float(obj.counts(prep)["loss"]) > 10
    assert float(out.metrics["nll"].count) == count
    np.testing.assert_allclose(float(out.losses["loss"]), total, rtol=1e-5)


def test_the_decoder_reads_the_encoders_embeddings_and_head():
    obj, params, prep = _setup()
    own = params["objectives"]["decoder"]
    assert "embeddings" not in own and "mlm_head" not in own and sorted(
        k for k in own if k.startswith("layers_")) == ["layers_0", "layers_1"]
    assert "cross_attention" in own["layers_0"]

    def decoder_only(p):  # the decoder's loss with the encoder's output held fixed
        logits = obj.decoder_logits(p, prep, jax.lax.stop_gradient(obj.encode_source(p, prep)))
        return jnp.sum(jax.nn.log_softmax(logits)[..., 7])

    g = jax.jit(jax.grad(decoder_only))(params)
    assert np.abs(np.asarray(g["encoder"]["embeddings"]["word_embeddings"]["embedding"])).max() > 0
    assert np.abs(np.asarray(g["encoder"]["mlm_head"]["dense"]["kernel"])).max() > 0
    assert np.abs(np.asarray(g["encoder"]["layers_0"]["mlp"]["output"]["kernel"])).max() == 0


@pytest.mark.parametrize("take, layers", [("last", (1, 2)), ("first", (0, 1))])
def test_adapt_pretrained_takes_the_stack_layers(take, layers):
    obj, params, _ = _setup(take=take)
    adapted = obj.adapt_pretrained(params)
    for i, src in enumerate(layers):
        a = jax.tree_util.tree_leaves(adapted["objectives"]["decoder"][f"layers_{i}"])
        b = jax.tree_util.tree_leaves(params["encoder"][f"layers_{src}"])
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(params["objectives"]["decoder"]["layers_0"]["mlp"]["output"][
        "kernel"], adapted["objectives"]["decoder"]["layers_0"]["mlp"]["output"]["kernel"])


def test_teacher_forcing_is_causal():
    obj, params, prep = _setup()
    memory = obj.encode_source(params, prep)
    base = np.asarray(obj.decoder_logits(params, prep, memory))
    y = np.asarray(prep["y_input_ids"]).copy()
    y[0, 5] = 9 if y[0, 5] != 9 else 10
    after = np.asarray(obj.decoder_logits(params, {**prep, "y_input_ids": jnp.asarray(y)},
                                          memory))
    np.testing.assert_array_equal(after[0, :5], base[0, :5])
    assert np.abs(after[0, 5] - base[0, 5]).max() > 0
    np.testing.assert_array_equal(after[1:], base[1:])


@pytest.mark.parametrize("tokens", [False, True], ids=["language_embeddings", "language_tokens"])
def test_greedy_decoding_equals_an_uncached_argmax_through_the_objective(tokens):
    """Source language 2, target 3. With language-id tokens (synthetic lang_ids k ->
    TOKENS[k - 1] -> id V + k - 1) the source's <s> is V + 1 and decoding starts from V + 2."""
    obj, params, prep = (_setup(TOKEN_CFG, language_tokens=TOKENS) if tokens else _setup())
    src = np.asarray(prep["x_input_ids"])
    src_first, start = (V + 1, V + 2) if tokens else (0, 0)
    length = 6
    out = translate_batch(obj, params, jnp.asarray(src), source_lang=2, target_lang=3,
                          beam_size=1, length_penalty=0.0, max_length=length, bos_id=0,
                          eos_id=2, pad_id=1)
    tokens = np.asarray(out.tokens)[:, 0]
    # reference: re-run the whole decoder on the prefix every step, argmax the last position
    valid = src != 1
    src = src.copy()
    src[:, 0] = np.where(valid[:, 0], src_first, src[:, 0])
    x = {"x_input_ids": jnp.asarray(src),
         "x_positions": jnp.asarray(np.where(valid, np.cumsum(valid, 1) - 1, 0)),
         "x_segment_ids": jnp.asarray(valid.astype(np.int32)),
         "x_lang_ids": jnp.asarray(np.where(valid, 2, 0))}
    memory = jax.jit(obj.encode_source)(params, x)
    decoder_logits = jax.jit(obj.decoder_logits)  # one program per prefix length, not per op
    prefix = np.full((src.shape[0], 1), start, np.int32)
    done = np.zeros(src.shape[0], bool)
    for t in range(length - 1):
        n = prefix.shape[1]
        y = {"y_input_ids": jnp.asarray(prefix), "y_positions": jnp.asarray(
            np.broadcast_to(np.arange(n), prefix.shape)),
             "y_segment_ids": jnp.ones(prefix.shape, jnp.int32),
             "y_lang_ids": jnp.full(prefix.shape, 3)}
        logits = np.asarray(decoder_logits(params, {**x, **y}, memory))[:, -1]
        nxt = np.where(done, 1, logits.argmax(-1))
        done |= nxt == 2
        prefix = np.concatenate([prefix, nxt[:, None]], axis=1)
    np.testing.assert_array_equal(tokens, prefix)


@pytest.mark.parametrize("kw, cfg, match", [
    ({"decoder_layers": 4}, {}, r"decoder_layers=4 must be in \[1, 3\] \(the encoder has 3"),
    ({"take": "middle"}, {}, r"take='middle' must be one of last, first"),
    ({"label_smoothing": 1.0}, {}, r"label_smoothing=1.0 must be in \[0, 1\)"),
    ({}, {"num_languages": 0}, r"without language_tokens .* num_languages=0; set"),
    ({"language_tokens": ["en", "de"]}, {"pad_vocab_to_multiple_of": 1},
     r"language_tokens=\['en', 'de'\] need 2 rows .* has 0 \(padded_vocab_size=40\)"),
    ({"language_tokens": ["en", "en"]}, {}, r"language_tokens=\['en', 'en'\] must be distinct"),
])
def test_bad_settings_name_the_value(kw, cfg, match):
    with pytest.raises(ValueError, match=match):
        Translation(Transformer(CFG.replace(**cfg)),
                    **{"decoder_layers": 2, "languages": None, **kw})


def test_language_tokens_open_each_row_with_its_language():
    """prepare() puts the row's language-id token where each source and target row had <s>;
    padding rows keep their padding; a listed language missing from the run's list, and a task
    language without a token, are errors naming the language."""
    obj, _, prep = _setup(TOKEN_CFG, language_tokens=TOKENS)
    raw = synthetic_batch(3, 12, V, "split_pair", seed=1, num_languages=3)
    for side in ("x_", "y_"):
        ids, lang = np.asarray(prep[side + "input_ids"]), raw[side + "lang_ids"][:, 0]
        live = raw[side + "segment_ids"][:, 0] > 0
        np.testing.assert_array_equal(ids[live, 0], V + lang[live] - 1)
        np.testing.assert_array_equal(ids[~live, 0], raw[side + "input_ids"][~live, 0])
        np.testing.assert_array_equal(ids[:, 1:], raw[side + "input_ids"][:, 1:])
    net = Transformer(TOKEN_CFG)
    run = Translation(net, decoder_layers=2, language_tokens=TOKENS,
                      languages=["de", "c", "a", "b"])
    assert list(run._token_table) == [-1, -1, V + 2, V, V + 1]  # lang_ids 1..4; "de": none
    with pytest.raises(ValueError, match=r"names 'b', which is not in the tasks' language"):
        Translation(net, decoder_layers=2, language_tokens=TOKENS, languages=["a", "c"])
    with pytest.raises(ValueError, match=r"language 'de' has no language-id token \(language_"
                                         r"tokens=\['a', 'b', 'c'\]\); add it \(the task's "
                                         r"rows are in a, de\)"):
        Translation(net, decoder_layers=2, language_tokens=TOKENS, languages=["a", "b", "c", "de"],
                    task_languages=["a", "de"])
