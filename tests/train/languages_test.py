"""The trainer's language list: read from the tasks' registrations, checked against the model's
language-embedding table before anything is compiled, written to `model_dir/languages.txt`
and read back by `load_encoder`, so that evaluation uses the `lang_ids` training used."""
import os

import pytest

from testlib.tiny_run import mlm_objectives, train_tiny
from xlm_jax.train import streams as streams_lib, optim

pytest.importorskip("seqio")

from xlm_jax.data import registry  # noqa: E402  (needs TensorFlow)

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data")
SMALL = {"vocab_size": 8002, "num_layers": 1, "hidden_size": 16, "num_heads": 2, "mlp_dim": 32,
         "max_positions": 66, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}


# seqio's registries put back after each test: the tests register tasks (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")


def _register(name, language_list):
    return registry.register_monolingual(name, os.path.join(DEMO, "mono"), ["en", "fr"],
                                         os.path.join(DEMO, "spm.model"),
                                         language_list=language_list, shuffle_buffer_size=8)


def _train(model_dir, task, num_languages, **model):
    return train_tiny(
        model_dir, 1, model={**SMALL, "num_languages": num_languages, **model},
        objectives=mlm_objectives(pair=False, max_predictions=4, mono_task=task), batch=2,
        optimizer=optim.OptimizerConfig(learning_rate=1e-3, warmup_steps=1, total_steps=1),
        spm_model=os.path.join(DEMO, "spm.model"))


def test_language_list_of_tasks():
    _register("lt_a", ["fr", "de", "en"])
    _register("lt_b", ["en", "fr"])
    assert streams_lib.language_list(["synthetic:mono", "lt_a"]) == ["fr", "de", "en"]
    assert streams_lib.language_list(["lt_a_en", "synthetic:pair"]) == ["fr", "de", "en"]
    assert streams_lib.language_list(["synthetic:mono"]) is None
    with pytest.raises(ValueError, match="lt_a_en and lt_b_en .*3 vs 2 languages"):
        streams_lib.language_list(["lt_a", "lt_b"])


def test_trainer_writes_the_list_and_load_encoder_uses_it(tmp_path):
    from xlm_jax.encoder import load_encoder

    _register("lt_c", ["fr", "de", "en"])
    _train(tmp_path, "lt_c", num_languages=4)
    with open(tmp_path / "languages.txt", encoding="utf-8") as f:
        assert f.read() == "fr\nde\nen\n"
    enc = load_encoder(str(tmp_path))
    assert enc.languages == ["fr", "de", "en"] and enc.lang_id("en") == 3
    assert load_encoder(str(tmp_path), language_list=["en"]).languages == ["en"]


def test_too_small_language_table_fails_before_training(tmp_path):
    _register("lt_d", ["fr", "de", "en"])
    with pytest.raises(ValueError, match="num_languages=3 is too small .* 3 languages.*>= 4"):
        _train(tmp_path, "lt_d", num_languages=3)
    assert not os.path.exists(tmp_path / "xlm_jax_config.json")


def test_vocabulary_larger_than_the_model_fails_before_training(tmp_path):
    # Before this check the ids past the table became NaN embeddings: "non-finite loss nan at
    # step 1", naming no cause.
    _register("lt_e", ["fr", "en"])
    with pytest.raises(ValueError, match=r"task lt_e_(en|fr) \(in lt_e\) has a vocabulary of 8002 ids "
                                         r"but the model has vocab_size=256; set the model's "
                                         r"vocab_size to 8002"):
        _train(tmp_path, "lt_e", num_languages=0, vocab_size=256)
    assert not os.path.exists(tmp_path / "xlm_jax_config.json")
    assert streams_lib.vocabulary_size(["synthetic:mono", "lt_e_en"]) == (8002, "lt_e_en")

