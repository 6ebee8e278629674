"""Parity with `transformers` XLM-R: hidden states of every layer and MLM logits, both ways."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import xlm_jax  # noqa: E402
from xlm_jax.convert.__main__ import main as convert_main  # noqa: E402

TOL = 1e-4


def _random_hf_model(vocab=120, hidden=64, layers=3, heads=4, mlp=128, max_pos=40, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.XLMRobertaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=mlp, max_position_embeddings=max_pos, type_vocab_size=1,
        layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    model = transformers.XLMRobertaForMaskedLM(cfg).eval()
    with torch.no_grad():  # LayerNorm ones/zeros and zero biases would hide mapping mistakes
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.2 if "LayerNorm" in name or "layer_norm" in name else 0.05)
            if name.endswith("LayerNorm.weight") or name.endswith("layer_norm.weight"):
                p.add_(1.0)
    return model


def _padded_batch(vocab, lengths=(11, 7, 3, 16), seed=0):
    rng = np.random.default_rng(seed)
    T = max(lengths)
    ids = np.ones((len(lengths), T), np.int64)  # pad = 1
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n - 1] = 0, 2
        ids[b, 1:n - 1] = rng.integers(4, vocab, n - 2)
    return ids, (ids != 1).astype(np.int64)


def _hf_outputs(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    output_hidden_states=True)
    return np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy()


def _assert_parity(enc, model, ids, mask):
    hf_hidden, hf_logits = _hf_outputs(model, ids, mask)
    ours = enc.hidden_states(ids, mask)
    assert ours.shape == hf_hidden.shape == (model.config.num_hidden_layers + 1,) + ids.shape + (
        model.config.hidden_size,)
    np.testing.assert_allclose(ours, hf_hidden, atol=TOL, rtol=0)
    np.testing.assert_allclose(enc.mlm_logits(ids, mask), hf_logits, atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model = _random_hf_model()
    d = tmp_path_factory.mktemp("hf")
    model.save_pretrained(d)
    return str(d), model


def test_load_hf_safetensors_matches_transformers(hf_dir):
    d, model = hf_dir
    ids, mask = _padded_batch(model.config.vocab_size)
    _assert_parity(xlm_jax.load_encoder(d), model, ids, mask)


def test_load_pytorch_bin_matches(hf_dir, tmp_path):
    d, model = hf_dir
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(open(os.path.join(d, "config.json")).read())
    ids, mask = _padded_batch(model.config.vocab_size, seed=1)
    _assert_parity(xlm_jax.load_encoder(str(tmp_path)), model, ids, mask)


def test_import_export_roundtrip_through_transformers(hf_dir, tmp_path):
    d, model = hf_dir
    ours, back = tmp_path / "xlm_jax", tmp_path / "hf_again"
    assert convert_main(["import-hf", "--hf_dir", d, "--out", str(ours)]) == 0
    assert convert_main(["export-hf", "--checkpoint", str(ours), "--out", str(back)]) == 0
    reloaded = transformers.XLMRobertaForMaskedLM.from_pretrained(str(back)).eval()
    ids, mask = _padded_batch(model.config.vocab_size, seed=2)
    a_hidden, a_logits = _hf_outputs(model, ids, mask)
    b_hidden, b_logits = _hf_outputs(reloaded, ids, mask)
    np.testing.assert_allclose(b_hidden, a_hidden, atol=TOL, rtol=0)
    np.testing.assert_allclose(b_logits, a_logits, atol=TOL, rtol=0)
    # and our own loader on the xlm_jax directory agrees with transformers too
    _assert_parity(xlm_jax.load_encoder(str(ours)), model, ids, mask)


def test_padded_vocabulary_model_matches_and_exports(hf_dir, tmp_path):
    """An xlm_jax model with a padded vocabulary (120 -> 128 rows) built from the HF weights
    gives transformers' hidden states and logits, and exports back to exactly 120 rows."""
    from xlm_jax.convert import hf

    d, model = hf_dir
    cfg = hf.hf_config_to_model_config(json.load(open(os.path.join(d, "config.json"))))
    cfg = cfg.replace(pad_vocab_to_multiple_of=32)
    params = hf.hf_state_to_params(hf.read_hf_weights(d), cfg, source=d)
    emb = params["embeddings"]["word_embeddings"]["embedding"]
    assert emb.shape == (128, 64) and not emb[120:].any()
    ours, back = tmp_path / "padded", tmp_path / "hf_again"
    hf.save_xlm_jax(str(ours), cfg, params)
    ids, mask = _padded_batch(model.config.vocab_size, seed=3)
    _assert_parity(xlm_jax.load_encoder(str(ours)), model, ids, mask)
    assert convert_main(["export-hf", "--checkpoint", str(ours), "--out", str(back)]) == 0
    reloaded = transformers.XLMRobertaForMaskedLM.from_pretrained(str(back)).eval()
    assert reloaded.config.vocab_size == 120
    assert tuple(reloaded.roberta.embeddings.word_embeddings.weight.shape) == (120, 64)
    _assert_parity(xlm_jax.load_encoder(str(ours)), reloaded, ids, mask)


def test_shape_mismatch_names_parameter_and_shapes(hf_dir, tmp_path):
    d, _ = hf_dir
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    os.symlink(os.path.join(d, "model.safetensors"), tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as e:
        xlm_jax.load_encoder(str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg
    assert "intermediate.dense.weight" in msg and "(128, 64)" in msg and "(64, 96)" in msg


def test_xlm_jax_config_shape_mismatch(hf_dir, tmp_path):
    d, _ = hf_dir
    out = tmp_path / "ours"
    assert convert_main(["import-hf", "--hf_dir", d, "--out", str(out)]) == 0
    cfg = json.load(open(out / "xlm_jax_config.json"))
    cfg["vocab_size"] = 130
    (out / "xlm_jax_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"word_embeddings/embedding has shape \(120, 64\) but the "
                                         r"config expects \(130, 64\)"):
        xlm_jax.load_encoder(str(out))


@pytest.mark.slow  # real base shapes take minutes
def test_real_base_shapes(tmp_path):
    model = _random_hf_model(vocab=250002, hidden=768, layers=12, heads=12, mlp=3072, max_pos=514)
    model.save_pretrained(tmp_path)
    ids, mask = _padded_batch(250002, lengths=(40, 17))
    _assert_parity(xlm_jax.load_encoder(str(tmp_path)), model, ids, mask)
