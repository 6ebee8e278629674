"""The vocabulary over a tensor axis: an indivisible table is a one-line error before anything
compiles; padding it (`pad_vocab_to_multiple_of`) trains on tensor=4 exactly as on one device;
initialising from an HF XLM-R directory copies its weights into the padded tables."""
import os

import numpy as np
import pytest

from testlib.tiny_run import TINY_MODEL, mlm_objectives, train_tiny
from xlm_jax.convert import hf
from xlm_jax.train import partitioning

SMALL = {"vocab_size": 250}  # 250 = 2 x 5^3: no tensor axis of 4 divides it


def _train(model_dir, steps, overrides=None, **kw):
    return train_tiny(model_dir, steps, model={**SMALL, **(overrides or {})},
                      objectives=mlm_objectives(pair=False), **kw)


def test_indivisible_vocabulary_is_named_before_compiling(tmp_path):
    with pytest.raises(ValueError) as e:
        _train(tmp_path / "m", 2, mesh=partitioning.MeshConfig(data=2, tensor=4), num_devices=8)
    msg = str(e.value).splitlines()[0]  # gin appends "In call to configurable ..." below
    assert "word_embeddings" in msg and "'vocab'" in msg and "size 250" in msg
    assert "pad_vocab_to_multiple_of" in msg
    assert not os.path.exists(tmp_path / "m" / "checkpoints" / "2")


def test_padded_vocabulary_on_tensor_four_matches_single_device(tmp_path):
    pad = {"pad_vocab_to_multiple_of": 128}
    single = _train(tmp_path / "one", 4, pad)
    # The same model without padding: with jax's partitionable threefry the first 250 rows of
    # the padded table draw the unpadded table's values, so the two runs must agree exactly.
    plain = _train(tmp_path / "plain", 4)
    sharded = _train(tmp_path / "four", 4, pad, mesh=partitioning.MeshConfig(data=2, tensor=4),
                     num_devices=8)
    assert single.losses[0] > 5.0
    np.testing.assert_allclose(single.losses, plain.losses, atol=1e-5, rtol=0)
    np.testing.assert_allclose(sharded.losses, single.losses, atol=1e-5, rtol=0)
    a = hf.load_xlm_jax(str(tmp_path / "four"))[1]
    b = hf.load_xlm_jax(str(tmp_path / "one"))[1]
    emb_a = np.asarray(a["embeddings"]["word_embeddings"]["embedding"])
    emb_b = np.asarray(b["embeddings"]["word_embeddings"]["embedding"])
    assert emb_a.shape == (256, 32)
    np.testing.assert_allclose(emb_a, emb_b, atol=1e-5, rtol=0)


def test_init_from_hf_dir_into_padded_model(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_model = transformers.XLMRobertaForMaskedLM(transformers.XLMRobertaConfig(
        vocab_size=250, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1,
        layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2))
    hf_model.save_pretrained(tmp_path / "hf")
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    _train(tmp_path / "run", 1, {"pad_vocab_to_multiple_of": 128, "num_layers": 2},
           init_from=str(tmp_path / "hf"), save_initial=True)
    params = hf.load_xlm_jax(str(tmp_path / "run"), step=0)[1]
    emb = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
    assert emb.shape == (256, 32)
    np.testing.assert_array_equal(emb[:250], state["roberta.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(np.asarray(params["mlm_head"]["bias"])[:250], state["lm_head.bias"])
    np.testing.assert_array_equal(
        np.asarray(params["layers_1"]["mlp"]["output"]["kernel"]),
        state["roberta.encoder.layer.1.output.dense.weight"].T)
    # a different vocabulary is refused, naming both sizes
    with pytest.raises(ValueError, match=r"vocab_size=250 but the model being trained has "
                                         r"vocab_size=300"):
        _train(tmp_path / "other", 1, {"vocab_size": 300, "num_layers": 2},
               init_from=str(tmp_path / "hf"))


def test_other_indivisible_dimensions_name_their_rule():
    import flax.linen as nn
    import jax

    from xlm_jax.models.config import get_config
    from xlm_jax.models.transformer import Transformer

    cfg = get_config("tiny", **{**TINY_MODEL, "mlp_dim": 66})
    model = Transformer(cfg)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), np.zeros((2, 8), np.int32)))
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, tensor=4))
    rules = partitioning.standard_logical_axis_rules()
    with pytest.raises(ValueError) as e:
        partitioning.check_divisible(boxed, partitioning.logical_shardings(boxed, mesh, rules))
    msg = str(e.value)
    assert msg.startswith("train state['params']['layers_0']['mlp']['intermediate']['bias']: "
                          "dimension 0 (logical axis 'mlp') has size 66"), msg
    assert "change the logical axis rule for 'mlp' or the mesh" in msg
    # replicating `mlp` (an axis-rule override) makes the same mesh valid
    rules = partitioning.standard_logical_axis_rules([("mlp", None), ("activation_mlp", None)])
    partitioning.check_divisible(boxed, partitioning.logical_shardings(boxed, mesh, rules))
    assert nn.get_partition_spec(boxed)["params"]["embeddings"]["word_embeddings"]["embedding"] \
        == jax.sharding.PartitionSpec("vocab", "embed")
