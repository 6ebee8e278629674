"""Config validation, the encoder's bad-input errors, and import hygiene (no TensorFlow)."""
import subprocess
import sys

import jax
import numpy as np
import pytest

from xlm_jax.models.config import SIZES, ModelConfig, get_config
from xlm_jax.models.transformer import Transformer, default_positions, fairseq_position_ids


def test_named_sizes():
    base = get_config("base")
    assert (base.num_layers, base.hidden_size, base.mlp_dim, base.num_heads, base.vocab_size) == (
        12, 768, 3072, 12, 250002)
    assert base.padded_vocab_size == 250112 and get_config("tiny").padded_vocab_size == 8002
    assert (get_config("large").num_layers, get_config("large").hidden_size) == (24, 1024)
    assert (get_config("xl").num_layers, get_config("xl").mlp_dim, get_config("xl").num_heads) == (
        48, 6144, 24)
    assert get_config("small").num_layers == 6
    assert base.max_sequence_length == 512 and base.layer_norm_eps == 1e-5


def test_unknown_size_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        get_config("huge")
    for name in SIZES:
        assert name in str(e.value)


@pytest.mark.parametrize("field,value,needle", [
    ("hidden_size", 130, "divisible by num_heads"),
    ("position_type", "rotary", "absolute, relative, both"),
    ("dtype", "float8", "float32"),
    ("dropout_rate", 1.5, "[0, 1)"),
    ("num_layers", 0, "positive"),
    ("num_languages", 1, "row 0 is padding"),
    ("num_languages", -1, "must be 0"),
    ("language_init", "uniform", "normal, zeros"),
    ("relative_init", "alibi", "normal, locality"),
])
def test_config_validation(field, value, needle):
    with pytest.raises(ValueError) as e:
        get_config("tiny", **{field: value})
    assert field in str(e.value) and needle in str(e.value)


def test_unknown_override_field():
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        get_config("tiny", hiden_size=3)


def test_positions_follow_fairseq():
    ids = np.array([[0, 7, 8, 2, 1, 1]])
    valid = ids != 1
    pos = fairseq_position_ids(default_positions(valid), valid, pad_id=1)
    # HF: cumsum(ids != pad) * (ids != pad) + pad
    hf = np.cumsum(valid, axis=1) * valid + 1
    np.testing.assert_array_equal(np.asarray(pos), hf)


def test_too_long_sequence_is_a_clear_error():
    cfg = get_config("tiny", vocab_size=50, num_layers=1, max_positions=10)
    model = Transformer(cfg)
    ids = np.full((1, 9), 5, np.int32)
    with pytest.raises(ValueError, match="sequence length 9 exceeds the position table"):
        model.init(jax.random.PRNGKey(0), ids)


def test_embed_without_spm_says_where_it_looked(tmp_path):
    import xlm_jax
    from xlm_jax.convert import hf

    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                      max_positions=20)
    model = Transformer(cfg)
    import flax.linen as nn

    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), np.ones((1, 4), np.int32))["params"])
    hf.save_xlm_jax(str(tmp_path / "m"), cfg, jax.tree_util.tree_map(np.asarray, params))
    enc = xlm_jax.load_encoder(str(tmp_path / "m"))
    with pytest.raises(FileNotFoundError) as e:
        enc.embed(["hello"], layer=1)
    assert str(tmp_path / "m" / "sentencepiece.bpe.model") in str(e.value)
    assert str(tmp_path / "m" / "spm.model") in str(e.value)


def test_core_imports_without_tensorflow():
    code = ("import sys; import xlm_jax, xlm_jax.models.transformer, xlm_jax.encoder, "
            "xlm_jax.convert.hf, xlm_jax.train.partitioning, xlm_jax.train.loop, "
            "xlm_jax.train.cli, xlm_jax.objectives.mlm, xlm_jax.accelerator.bench, "
            "xlm_jax.accelerator.lower, xlm_jax.accelerator.smoke, xlm_jax.accelerator.pod_memory, "
            "xlm_jax.accelerator.compile, xlm_jax.league.plan, xlm_jax.models.attention_backends, "
            "xlm_jax.models.fused_attention_tpu, "
            "xlm_jax.data.synthetic, xlm_jax.data.vocab, xlm_jax.evaluation.retrieval; "
            "xlm_jax.load_encoder; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'seqio')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_encode_cli_writes_the_embed_vectors(tmp_path):
    """`python -m xlm_jax.embed` on a tiny model with the demo SentencePiece model beside it
    writes exactly `Encoder.embed`'s vectors; pooling ignores padding (batch independent)."""
    import os
    import shutil

    import flax.linen as nn

    import xlm_jax
    from xlm_jax.convert import hf
    from xlm_jax.embed import main as encode_main

    spm = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data", "spm.model")
    cfg = ModelConfig(vocab_size=8002, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                      max_positions=66)
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0),
                                                 np.ones((1, 4), np.int32))["params"])
    model_dir = tmp_path / "m"
    hf.save_xlm_jax(str(model_dir), cfg, jax.tree_util.tree_map(np.asarray, params))
    shutil.copyfile(spm, model_dir / "spm.model")
    lines = ["Hello world", "Добрый день, как дела?", "これはテストです", "x"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "vecs.npy"
    assert encode_main(["--model", str(model_dir), "--input", str(tmp_path / "in.txt"),
                        "--layer", "1", "--pool", "mean", "--out", str(out)]) == 0
    vecs = np.load(out)
    enc = xlm_jax.load_encoder(str(model_dir))
    assert vecs.shape == (4, 16)
    np.testing.assert_allclose(vecs, enc.embed(lines, layer=1), atol=1e-6)
    # one at a time (no padding) gives the same vectors as the padded batch
    singles = np.concatenate([enc.embed([s], layer=1) for s in lines])
    np.testing.assert_allclose(vecs, singles, atol=1e-5)
    # bad input: missing file -> one-line error, exit code 2
    assert encode_main(["--model", str(model_dir), "--input", str(tmp_path / "nope.txt"),
                        "--out", str(out)]) == 2


def test_bfloat16_compute_keeps_float32_params_and_logits():
    import flax.linen as nn
    import jax.numpy as jnp

    small = dict(vocab_size=96, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)
    ids = np.random.default_rng(0).integers(4, 96, (2, 10)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    pos = np.tile(np.arange(3), (2, 1)).astype(np.int32)
    out = {}
    for dtype in ("float32", "bfloat16"):
        model = Transformer(get_config("tiny", **small, dtype=dtype))
        params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids))["params"]
        assert {str(v.dtype) for v in jax.tree_util.tree_leaves(params)} == {"float32"}

        def run(p):
            h = model.apply({"params": p}, ids, method=Transformer.encode).last_hidden_state
            return h, model.apply({"params": p}, h, pos, method=Transformer.mlm_logits)
        out[dtype] = run(params)
    (h32, l32), (h16, l16) = out["float32"], out["bfloat16"]
    assert h32.dtype == jnp.float32 and h16.dtype == jnp.bfloat16  # activations in bf16
    assert l32.dtype == l16.dtype == jnp.float32  # the loss side stays in float32
    # Same parameters (same init), so bf16 only rounds. Tolerances from the measured max abs
    # error (jax 0.10.2, CPU): hidden 0.0395 (|h| up to 3.4) -> atol 0.1, a 2.5x margin; logits
    # 0.00354 (|logit| up to 0.30) -> atol 0.008, a 2.3x margin. The logit tolerance was 0.05
    # (14x): it passed a decoder fed float8 activations instead of bf16 (error 0.0106).
    np.testing.assert_allclose(np.asarray(h16, np.float32), np.asarray(h32), atol=0.1, rtol=0)
    np.testing.assert_allclose(np.asarray(l16), np.asarray(l32), atol=0.008, rtol=0)
    assert float(jnp.max(jnp.abs(h16.astype(jnp.float32) - h32))) > 0  # really computed in bf16
