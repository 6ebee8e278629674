"""`Encoder` on models with language embeddings (`num_languages > 0`): `embed(lang=...)` against
a direct `Transformer.encode` computation, the language list (default and given), and the
errors for a missing or unknown language.

Most encoders are built directly (`Encoder(cfg, params, dir_with_spm)`);
`test_load_encoder_reads_a_language_model` goes through a saved model directory."""
import os

import jax
import numpy as np
import pytest

from xlm_jax.data.features import language_index
from xlm_jax.data.sampling import KNOWN_LANGUAGES
from xlm_jax.encoder import Encoder
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.transformer import Transformer

DEMO_SPM = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data", "spm.model")
SENTS = ["the cat sat on the mat", "Guten Morgen", "a much longer sentence with many words in it",
         "x"]
DEFAULT_LIST = sorted(KNOWN_LANGUAGES)


def make_model(tmp_path_factory, num_languages: int) -> tuple[str, ModelConfig, dict]:
    """A tiny random model: (a directory holding the demo SentencePiece model as spm.model,
    config, numpy params), for `Encoder(cfg, params, dir)`."""
    import flax.linen as nn

    cfg = ModelConfig(vocab_size=8002, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                      max_positions=66, dropout_rate=0.0, attention_dropout_rate=0.0,
                      num_languages=num_languages)
    ids = np.full((1, 4), 5, np.int32)
    kw = {"lang_ids": np.ones_like(ids)} if num_languages else {}
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), ids, **kw)["params"])
    params = jax.tree_util.tree_map(np.asarray, params)
    spm_dir = tmp_path_factory.mktemp("spm")
    with open(DEMO_SPM, "rb") as f:
        (spm_dir / "spm.model").write_bytes(f.read())
    return str(spm_dir), cfg, params


@pytest.fixture(scope="module")
def lang_model(tmp_path_factory):
    return make_model(tmp_path_factory, num_languages=len(DEFAULT_LIST) + 1)


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    return make_model(tmp_path_factory, num_languages=0)


def _reference(cfg, params, tok, sents, layer, lang_id):
    """Mean-pooled hidden states of `layer` straight from `Transformer.encode` (its default
    padding mask and positions), pooled in numpy."""
    ids, mask = tok.encode_batch(sents, 32)
    ids, mask = np.asarray(ids), np.asarray(mask, bool)
    out = Transformer(cfg).apply({"params": params}, ids, lang_ids=np.where(mask, lang_id, 0),
                                 return_hidden_states=True, method=Transformer.encode)
    hidden = np.asarray(out.hidden_states[layer], np.float64)
    w = mask[..., None].astype(np.float64)
    return (hidden * w).sum(axis=1) / w.sum(axis=1)


def test_embed_with_lang_matches_transformer_encode(lang_model):
    path, cfg, params = lang_model
    enc = Encoder(cfg, params, path)
    assert enc.languages == DEFAULT_LIST
    for layer in (0, 2):
        got = enc.embed(SENTS, layer=layer, lang="de", batch_size=3, max_length=32)
        want = _reference(cfg, params, enc.tokenizer, SENTS, layer,
                          language_index("de", DEFAULT_LIST))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        fr = enc.embed(SENTS, layer=layer, lang="fr", max_length=32)
        assert np.abs(fr - got).max() > 1e-3  # the language changes the vectors


def test_mlm_logits_take_lang_ids(lang_model):
    path, cfg, params = lang_model
    enc = Encoder(cfg, params, path)
    ids, mask = enc.tokenizer.encode_batch(SENTS, 16)
    with pytest.raises(ValueError, match="num_languages"):
        enc.mlm_logits(ids, mask)
    de = enc.lang_ids_for("de", mask)
    model = Transformer(cfg)

    def full(mdl, i, l):  # the default padding mask and positions of `encode`
        return mdl.full_mlm_logits(mdl.encode(i, lang_ids=l).last_hidden_state)

    want = model.apply({"params": params}, np.asarray(ids), de, method=full)
    got = enc.mlm_logits(ids, mask, de)
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(got[real], np.asarray(want)[real], atol=1e-4, rtol=0)
    assert np.abs(enc.mlm_logits(ids, mask, enc.lang_ids_for("fr", mask)) - got).max() > 1e-3


def test_given_language_list_sets_the_ids(lang_model):
    path, cfg, params = lang_model
    enc = Encoder(cfg, params, path, language_list=["fr", "de"])
    assert enc.lang_id("de") == 2 != language_index("de", DEFAULT_LIST)
    got = enc.embed(SENTS, layer=1, lang="de", max_length=32)
    np.testing.assert_allclose(got, _reference(cfg, params, enc.tokenizer, SENTS, 1, 2),
                               atol=1e-5, rtol=0)


def test_default_list_is_the_registry_default():
    from xlm_jax.data import registry
    from xlm_jax.encoder import default_language_list

    assert default_language_list() == registry.default_language_list()


def test_missing_or_unknown_language_is_a_clear_error(lang_model):
    path, cfg, params = lang_model
    enc = Encoder(cfg, params, path)
    ids, mask = enc.tokenizer.encode_batch(SENTS, 16)
    for call in (lambda: enc.hidden_states(ids, mask), lambda: enc.embed(SENTS, layer=1)):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and f"num_languages={len(DEFAULT_LIST) + 1}" in msg
        assert "lang=" in msg and "lang_ids=" in msg
    with pytest.raises(ValueError, match="language 'zz' is not in the language list"):
        enc.embed(SENTS, layer=1, lang="zz")
    with pytest.raises(ValueError, match=r"lang_ids shape \(4, 3\) differs"):
        enc.hidden_states(ids, mask, np.ones((4, 3), np.int32))
    # A list longer than the model's table: an id past its rows is an error, not a NaN vector.
    small = Encoder(cfg, params, path, language_list=[f"l{i}" for i in range(len(DEFAULT_LIST) + 1)])
    with pytest.raises(ValueError, match=r"'l\d+' has lang_ids value \d+ but .* only "
                                         r"num_languages="):
        small.embed(SENTS, layer=1, lang=f"l{len(DEFAULT_LIST)}")


def test_plain_model_ignores_the_language(plain_model):
    path, cfg, params = plain_model
    enc = Encoder(cfg, params, path)
    ids, mask = enc.tokenizer.encode_batch(SENTS, 16)
    base = enc.hidden_states(ids, mask)
    np.testing.assert_array_equal(enc.hidden_states(ids, mask, np.full(ids.shape, 7)), base)
    np.testing.assert_array_equal(enc.embed(SENTS, layer=2, lang="zz"),
                                  enc.embed(SENTS, layer=2))


def test_load_encoder_reads_a_language_model(lang_model, tmp_path):
    from xlm_jax.convert import hf
    from xlm_jax.encoder import load_encoder

    spm_dir, cfg, params = lang_model
    hf.save_xlm_jax(str(tmp_path / "m"), cfg, params, spm_from=spm_dir)
    enc = load_encoder(str(tmp_path / "m"), language_list=["fr", "de"])
    assert enc.languages == ["fr", "de"]
    want = Encoder(cfg, params, spm_dir, ["fr", "de"]).embed(SENTS, layer=1, lang="de",
                                                             max_length=32)
    np.testing.assert_allclose(enc.embed(SENTS, layer=1, lang="de", max_length=32), want,
                               atol=1e-6)
