"""One sentence-embedding path: Tatoeba retrieval's vectors are `Encoder.embed`'s, bit for bit;
both match an independent numpy mean/cls pooling of `Encoder.hidden_states`; one default
max length (`DEFAULT_MAX_LENGTH`, capped at the position table) for both; input errors."""
import os

import jax
import numpy as np
import pytest

from xlm_jax.encoder import DEFAULT_MAX_LENGTH, Encoder
from xlm_jax.evaluation import retrieval
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.transformer import Transformer

DEMO_SPM = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data", "spm.model")
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # ~180 tokens
SENTS = ["the cat sat on the mat", "Guten Morgen", "Добрый день, как дела?", "これはテストです",
         "x", "", "a much longer sentence with many words in it, and then some more",
         "the cat sat on the mat", LONG, "she reads a long book"]


def _encoder(tmp_path_factory, max_positions: int) -> Encoder:
    """A tiny random 2-layer model for the demo SentencePiece vocabulary."""
    import flax.linen as nn

    cfg = ModelConfig(vocab_size=8002, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                      max_positions=max_positions, dropout_rate=0.0, attention_dropout_rate=0.0)
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0),
                                                 np.ones((1, 4), np.int32))["params"])
    spm_dir = tmp_path_factory.mktemp("spm")
    with open(DEMO_SPM, "rb") as f:
        (spm_dir / "spm.model").write_bytes(f.read())
    return Encoder(cfg, jax.tree_util.tree_map(np.asarray, params), str(spm_dir))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Position table of 40 tokens: less than DEFAULT_MAX_LENGTH."""
    return _encoder(tmp_path_factory, max_positions=42)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """XLM-R's position table (512 tokens): more than DEFAULT_MAX_LENGTH."""
    return _encoder(tmp_path_factory, max_positions=514)


# ----------------------------------------------------------------------------- one path

@pytest.mark.parametrize("pool", ["mean", "cls"])
@pytest.mark.parametrize("batch_size", [3, 64])
def test_retrieval_vectors_are_encoder_embed(small, pool, batch_size):
    """The same sentences, layer, pool, length and batch size give identical vectors through
    `retrieval.embed_layers` (all layers from one pass) and `Encoder.embed` (one layer).
    Before the two shared one path they differed in the last bits (retrieval pooled in numpy,
    `embed` with `heads.pool` on padded-to-max_length batches)."""
    got = retrieval.embed_layers(small, SENTS, [0, 1, 2], pool=pool, max_length=32,
                                 batch_size=batch_size)
    assert got.shape == (3, len(SENTS), 16) and got.dtype == np.float32
    for k in range(3):
        want = small.embed(SENTS, layer=k, pool=pool, batch_size=batch_size, max_length=32)
        np.testing.assert_array_equal(got[k], want)
    np.testing.assert_array_equal(got[:, 0], got[:, 7])  # a repeated sentence, the same vector


def test_retrieval_and_embed_default_to_the_same_length(large, small):
    """Without `max_length` both use DEFAULT_MAX_LENGTH (capped at the position table): before,
    `embed` defaulted to 512 tokens and retrieval to 128 (an error on a 40-token model)."""
    for enc in (large, small):
        want = enc.embed(SENTS, layer=2, batch_size=64)
        np.testing.assert_array_equal(retrieval.embed_layers(enc, SENTS, [2])[0], want)


def test_evaluate_embeds_through_encoder_embed_layers(small, tmp_path, monkeypatch):
    """`retrieval.evaluate` (the demo's path) embeds only through `Encoder.embed_layers`, and
    runs without `max_length` on a model whose table is shorter than the default."""
    eng = ["the cat sat on the mat", "a dog ran in the park", "we eat bread every day", LONG]
    (tmp_path / "tatoeba.aa-eng.aa").write_text("\n".join(eng) + "\n")
    (tmp_path / "tatoeba.aa-eng.eng").write_text("\n".join(eng) + "\n")
    calls = []
    real = small.embed_layers

    def spy(sentences, layers, **kwargs):
        calls.append(kwargs)
        return real(sentences, layers, **kwargs)

    monkeypatch.setattr(small, "embed_layers", spy)
    res = retrieval.evaluate(small, str(tmp_path), "all")
    assert calls and all(c["max_length"] is None and c["batch_size"] == 64 for c in calls)
    assert res.per_language["aa"].mean == 1.0


# ----------------------------------------------------------------------------- the reference

def _reference(enc: Encoder, sentences, layer: int, pool: str, max_length: int,
               pad_to: int | None = None) -> np.ndarray:
    """numpy float64 pooling of `hidden_states`: each sentence alone, `<s> tokens </s>` built
    here (truncated to `max_length`), padded to `pad_to` tokens (None: no padding at all)."""
    tok, out = enc.tokenizer, []
    for s in sentences:
        ids = [tok.bos_id] + tok.encode(s)[:max_length - 2] + [tok.eos_id]
        width = pad_to or len(ids)
        row = np.full((1, width), enc.config.pad_id, np.int32)
        row[0, :len(ids)] = ids
        mask = np.zeros((1, width), bool)
        mask[0, :len(ids)] = True
        hidden = np.asarray(enc.hidden_states(row, mask)[layer], np.float64)[0]  # [T, D]
        out.append(hidden[0] if pool == "cls" else hidden[mask[0]].mean(axis=0))
    return np.stack(out)


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_embed_matches_numpy_pooling_of_hidden_states(small, large, pool):
    for layer in (0, 1, 2):
        for enc, max_length in ((small, 40), (large, 24)):
            want = _reference(enc, SENTS, layer, pool, max_length)
            got = enc.embed(SENTS, layer=layer, pool=pool, batch_size=4, max_length=max_length)
            np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    # Padding is masked: a sentence padded to 40 tokens pools like the unpadded one.
    padded = _reference(small, SENTS, 2, pool, 40, pad_to=40)
    np.testing.assert_allclose(padded, _reference(small, SENTS, 2, pool, 40), atol=2e-5, rtol=0)


def test_default_max_length_truncates_at_128(large, small):
    assert DEFAULT_MAX_LENGTH == 128
    assert large.default_max_length == 128 and small.default_max_length == 40
    assert len(large.tokenizer.encode(LONG)) + 2 > 256  # the default changes this vector
    got = large.embed([LONG, "x"], layer=2)
    np.testing.assert_array_equal(got, large.embed([LONG, "x"], layer=2, max_length=128))
    np.testing.assert_allclose(got, _reference(large, [LONG, "x"], 2, "mean", 128), atol=2e-5)
    assert np.abs(large.embed([LONG], layer=2, max_length=256) - got[:1]).max() > 1e-3
    np.testing.assert_array_equal(small.embed([LONG], layer=1),
                                  small.embed([LONG], layer=1, max_length=40))


# ----------------------------------------------------------------------------- errors

def test_embed_input_errors(small):
    with pytest.raises(ValueError,
                       match=r"max_length=41 exceeds the position table .* \(max 40 tokens\)"):
        small.embed(SENTS, layer=1, max_length=41)
    with pytest.raises(ValueError, match=r"pool='max' is not one of cls, mean"):
        retrieval.embed_layers(small, SENTS, [1], pool="max")
    with pytest.raises(ValueError, match=r"layer=3 out of range \[0, 2\]"):
        small.embed_layers(SENTS, [0, 3])
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        small.embed(SENTS, layer=1, batch_size=0)
    with pytest.raises(ValueError, match="layers: empty list"):
        small.embed_layers(SENTS, [])
    with pytest.raises(TypeError, match="single str"):
        small.embed("one sentence", layer=1)
    assert small.embed([], layer=1).shape == (0, 16)
    assert small.embed_layers([], [0, 2]).shape == (2, 0, 16)
