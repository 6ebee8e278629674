"""export-hf for every kind of model the library trains, checked through `transformers`.

Each kind is a tiny model built with the library's own init (then every parameter moved by
noise, so that LayerNorm ones, zero biases and gate_w = 1 cannot hide a mapping mistake),
saved in the xlm_jax format, exported with `python -m xlm_jax.convert export-hf`, loaded
offline with `AutoModel.from_pretrained(dir, trust_remote_code=True)` and compared at every
layer with `load_encoder(...).hidden_states` on a batch with padding; `import-hf` of the export
must give back exactly the exported parameters.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Before transformers and huggingface_hub read them (when this module is the first to import
# them): offline, and the remote code's module copies in a folder removed at exit.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "HF_MODULES_CACHE" not in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="xlm_jax_tests_hf_modules_")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# transformers puts its remote-code module cache on sys.path the first time it loads remote
# code, once per process; done here, at import, so that no test is the one that changes
# sys.path (tests/testlib/leak_check.py).
from transformers.dynamic_module_utils import init_hf_modules  # noqa: E402

init_hf_modules()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from xlm_jax import model_dir as md  # noqa: E402
from xlm_jax.convert import hf, remote  # noqa: E402
from xlm_jax.convert.__main__ import main as convert_main  # noqa: E402
from xlm_jax.encoder import load_encoder  # noqa: E402
from xlm_jax.models.config import ModelConfig  # noqa: E402
from xlm_jax.models.reassemble import nlu_encoder  # noqa: E402
from xlm_jax.models.transformer import Transformer  # noqa: E402

TOL = 1e-4
TINY = dict(vocab_size=60, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
            max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)
# Each kind: (config, whether the model keeps its MLM head, the class AutoModel must build).
KINDS = {
    # XLM-R's shape: exported as XLM-R, read by transformers' own XLMRobertaModel
    "xlmr": (ModelConfig(**TINY), True, "XLMRobertaModel"),
    # the league's InfoXLM models (gin_configs/league/common.gin): pre-LN, absolute positions
    # and the gated relative bias with one 'locality' table; here with a padded vocabulary
    "infoxlm_league": (ModelConfig(**TINY, ln_style="pre", position_type="both",
                                   relative_init="locality", pad_vocab_to_multiple_of=16),
                       True, "XlmJaxModel"),
    # an XLM-E discriminator: relative positions only; few buckets and a short max distance
    # so that the batch reaches the log buckets and the saturated ones
    "xlme_discriminator": (ModelConfig(**TINY, position_type="relative", relative_buckets=8,
                                       relative_max_distance=10), False, "XlmJaxModel"),
    # a VECO stack (cross-attention in every layer) with one bucket table per layer
    "veco_nlu": (ModelConfig(**{**TINY, "num_layers": 3}, ln_style="pre", position_type="both",
                             share_relative_table=False, cross_attention=True),
                 True, "XlmJaxModel"),
    # ERNIE-M: XLM-R's layers plus a language table; the scanned (stacked) layer layout
    "ernie_m": (ModelConfig(**TINY, num_languages=5, scan_layers=True), True, "XlmJaxModel"),
}
LENGTHS = (11, 6, 3, 14)  # padded to 16: every row but the last has padding


def _random_params(cfg: ModelConfig, with_mlm_head: bool, seed: int = 0) -> dict:
    ids = np.ones((1, 4), np.int32)
    lang = {"lang_ids": ids} if cfg.num_languages else {}
    params = Transformer(cfg, with_mlm_head=with_mlm_head).init(jax.random.PRNGKey(seed), ids,
                                                               **lang)["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x) + rng.normal(0.0, 0.1, np.shape(x)).astype(np.float32),
        nn.meta.unbox(params))


def _batch(cfg: ModelConfig, seed: int = 0):
    """ids [B, T] with padding (pad id 1), the mask, and lang_ids (None without a table)."""
    rng = np.random.default_rng(seed)
    ids = np.ones((len(LENGTHS), 16), np.int64)
    for b, n in enumerate(LENGTHS):
        ids[b, 0], ids[b, n - 1] = 0, 2
        ids[b, 1:n - 1] = rng.integers(4, cfg.vocab_size, n - 2)
    mask = (ids != cfg.pad_id).astype(np.int64)
    lang = None
    if cfg.num_languages:
        lang = rng.integers(1, cfg.num_languages, ids.shape) * mask
    return ids, mask, lang


def _model_dir(tmp_path, kind: str) -> tuple[str, ModelConfig, dict]:
    cfg, head, _ = KINDS[kind]
    params = _random_params(cfg, head)
    path = str(tmp_path / "model")
    hf.save_xlm_jax(path, cfg, params)
    return path, cfg, params


def _hf_hidden(hf_dir, ids, mask, lang=None, auto=transformers.AutoModel):
    model = auto.from_pretrained(str(hf_dir), trust_remote_code=True).eval()
    extra = {"lang_ids": torch.tensor(lang)} if lang is not None else {}
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    output_hidden_states=True, **extra)
    return model, out


def _leaves_equal(a, b) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_matches_load_encoder_at_every_layer_and_imports_back(kind, tmp_path):
    src, cfg, _ = _model_dir(tmp_path, kind)
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", src, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    expected_class = KINDS[kind][2]
    if expected_class == "XLMRobertaModel":
        assert config["model_type"] == "xlm-roberta" and "auto_map" not in config
    else:
        assert config["model_type"] == "xlm_jax" and config["auto_map"] == remote.AUTO_MAP
        assert (out / "modeling_xlm_jax.py").exists() and (out / "configuration_xlm_jax.py").exists()

    ids, mask, lang = _batch(cfg)
    model, got = _hf_hidden(out, ids, mask, lang)
    assert type(model).__name__ == expected_class
    ours = load_encoder(src).hidden_states(ids, mask, lang_ids=lang)
    theirs = np.stack([h.numpy() for h in got.hidden_states])
    assert theirs.shape == ours.shape == (cfg.num_layers + 1,) + ids.shape + (cfg.hidden_size,)
    diff = np.abs(theirs - ours).max(axis=(1, 2, 3))
    print(f"{kind}: max |HF - load_encoder| per layer {np.array2string(diff, precision=2)}")
    assert (diff < TOL).all(), diff
    np.testing.assert_array_equal(got.last_hidden_state.numpy(), theirs[-1])

    back = tmp_path / "back"
    assert convert_main(["import-hf", "--hf_dir", str(out), "--out", str(back)]) == 0
    want_cfg, want = hf.load_xlm_jax(src)
    if want_cfg.cross_attention:  # what is exported is VECO's NLU encoder
        want_cfg, want = nlu_encoder(want_cfg, want)
    got_cfg, params = hf.load_xlm_jax(str(back))
    _leaves_equal(params, want)
    if expected_class != "XLMRobertaModel":  # the self-contained format keeps the whole config
        assert got_cfg == want_cfg


def test_masked_lm_logits_and_a_model_without_language_ids(tmp_path):
    """AutoModelForMaskedLM gives `Encoder.mlm_logits` (vocabulary padding dropped); a model
    with language embeddings called without lang_ids says what it needs."""
    src, cfg, _ = _model_dir(tmp_path, "ernie_m")
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", src, "--out", str(out)]) == 0
    ids, mask, lang = _batch(cfg, seed=1)
    model, got = _hf_hidden(out, ids, mask, lang, auto=transformers.AutoModelForMaskedLM)
    want = load_encoder(src).mlm_logits(ids, mask, lang_ids=lang)
    assert got.logits.shape == want.shape == ids.shape + (cfg.vocab_size,)
    np.testing.assert_allclose(got.logits.numpy(), want, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="has language embeddings .* pass lang_ids"):
        model(input_ids=torch.tensor(ids))


def test_padded_vocabulary_rows_round_trip(tmp_path):
    src, cfg, params = _model_dir(tmp_path, "infoxlm_league")
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", src, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["padded_vocab_size"]) == (60, 64)
    table = params["embeddings"]["word_embeddings"]["embedding"]
    assert np.abs(table[60:]).min() > 0  # the padding rows are not zeros here
    ids, mask, _ = _batch(cfg)
    model, got = _hf_hidden(out, ids, mask, auto=transformers.AutoModelForMaskedLM)
    assert got.logits.shape[-1] == 60  # the padding columns dropped, as Encoder.mlm_logits
    cfg_back, back = remote.load_remote_dir(str(out))
    np.testing.assert_array_equal(back["embeddings"]["word_embeddings"]["embedding"], table)
    # load_encoder (and so the trainer's init_from) reads the export directly
    np.testing.assert_array_equal(load_encoder(str(out)).hidden_states(ids, mask),
                                  load_encoder(src).hidden_states(ids, mask))


def _trainer_dir(tmp_path, cfg: ModelConfig, steps=(1, 2)) -> tuple[str, dict]:
    """A trainer model_dir: config + `checkpoints/<step>/state` train states holding the
    encoder beside an objective's module (what `load_xlm_jax` reads), one params per step."""
    import orbax.checkpoint as ocp

    path = str(tmp_path / "run")
    md.write_config(path, cfg)
    md.write_languages(path, ["de", "en", "fr", "zh"])
    encoders = {}
    for step in steps:
        encoders[step] = _random_params(cfg, False, seed=step)
        state = {"step": np.int32(step),
                 "params": {"encoder": encoders[step],
                            "objectives": {"rtd_head": {"kernel": np.ones((16, 1), np.float32)}}}}
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(os.path.join(md.checkpoints_dir(path), str(step), md.STATE_ITEM), state)
    return path, encoders


def test_step_picks_the_checkpoint_and_bad_input_is_one_line(tmp_path, capsys):
    cfg = KINDS["xlme_discriminator"][0].replace(num_languages=5)
    run, encoders = _trainer_dir(tmp_path, cfg)
    ids, mask, lang = _batch(cfg)
    for step in (1, None):  # default: the latest
        out = tmp_path / f"hf_{step}"
        argv = ["export-hf", "--checkpoint", run, "--out", str(out)]
        assert convert_main(argv + (["--step", str(step)] if step else [])) == 0
        _, got = _hf_hidden(out, ids, mask, lang)
        want = load_encoder(run, step=step).hidden_states(ids, mask, lang_ids=lang)
        np.testing.assert_allclose(got.hidden_states[-1].numpy(), want[-1], atol=TOL, rtol=0)
        _leaves_equal(remote.load_remote_dir(str(out))[1], encoders[step or 2])
        config = json.loads((out / "config.json").read_text())
        assert config["languages"] == ["de", "en", "fr", "zh"]
        assert md.read_languages(str(out)) == ["de", "en", "fr", "zh"]
    capsys.readouterr()

    def error(argv):
        assert convert_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        return err

    err = error(["export-hf", "--checkpoint", run, "--out", str(tmp_path / "x"), "--step", "7"])
    assert "no checkpoint for step 7; available: [1, 2]" in err
    assert not (tmp_path / "x").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = error(["export-hf", "--checkpoint", run, "--out", str(blocker / "hf")])
    assert "export-hf --out: cannot write to" in err and str(blocker / "hf") in err
    src, _, _ = _model_dir(tmp_path, "xlmr")
    err = error(["export-hf", "--checkpoint", src, "--out", str(tmp_path / "y"), "--step", "3"])
    assert "holds one set of parameters (params/) and no trainer checkpoints" in err
    err = error(["export-hf", "--checkpoint", str(tmp_path / "nothing"), "--out",
                 str(tmp_path / "z")])
    assert "not an xlm_jax model directory" in err


def test_forcing_xlm_roberta_names_every_missing_feature(tmp_path, capsys):
    src, _, _ = _model_dir(tmp_path, "infoxlm_league")
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", src, "--out", str(out),
                         "--format", "xlm-roberta"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "XLM-E discriminator" not in err
    assert "ln_style='pre' (pre-LN" in err
    assert "position_type='both' (the XLM-E gated relative position bias" in err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"num_languages=5 \(a language-embedding table"):
        hf.model_config_to_hf_config(KINDS["ernie_m"][0])
    # and an XLM-R-shaped model can be asked for in the self-contained format
    xlmr, _, _ = _model_dir(tmp_path / "x", "xlmr")
    assert convert_main(["export-hf", "--checkpoint", xlmr, "--out", str(tmp_path / "r"),
                         "--format", "xlm_jax"]) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["model_type"] == "xlm_jax"


def test_buckets_agree_with_xlm_jax():
    """The torch T5 buckets equal `position.relative_position_bucket` for every distance up to
    three times the maximum, for the configurations in use and small and large ones."""
    from xlm_jax.convert.hf_remote import modeling_xlm_jax as modeling
    from xlm_jax.models.position import relative_position_bucket

    for buckets, distance in ((32, 128), (8, 10), (4, 3), (16, 64), (64, 512), (320, 1000)):
        rel = np.arange(-3 * distance, 3 * distance + 1)
        want = np.asarray(relative_position_bucket(rel, buckets, distance))
        got = modeling.relative_position_bucket(torch.tensor(rel), buckets, distance).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{buckets} buckets, {distance}")


LOAD_WITHOUT_XLM_JAX = """
import sys
sys.modules["xlm_jax"] = None  # the export must not need the library
import numpy as np, torch, transformers
d = np.load(sys.argv[2])
model = transformers.AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    out = model(input_ids=torch.tensor(d["ids"]), attention_mask=torch.tensor(d["mask"]),
                output_hidden_states=True)
np.save(sys.argv[3], np.stack([h.numpy() for h in out.hidden_states]))
"""


def test_export_loads_offline_without_xlm_jax(tmp_path):
    src, cfg, _ = _model_dir(tmp_path, "infoxlm_league")
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", src, "--out", str(out)]) == 0
    ids, mask, _ = _batch(cfg, seed=2)
    np.savez(tmp_path / "batch.npz", ids=ids, mask=mask)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"),
               PYTHONPATH="")
    r = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_XLM_JAX, str(out),
                        str(tmp_path / "batch.npz"), str(tmp_path / "hidden.npy")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "hidden.npy")
    np.testing.assert_allclose(got, load_encoder(src).hidden_states(ids, mask), atol=TOL, rtol=0)
    assert (tmp_path / "modules").is_dir()  # the remote code was loaded from the export


def test_remote_code_ships_with_the_package():
    """The templates are modules of a package that `setup.py`'s find_packages includes, and
    `template_text` reads them from the installed package."""
    from setuptools import find_packages

    from xlm_jax.convert import hf_remote

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "xlm_jax.convert.hf_remote" in find_packages(root, include=["xlm_jax", "xlm_jax.*"])
    for name in hf_remote.TEMPLATE_FILES:
        assert "import xlm_jax" not in hf_remote.template_text(name)
        assert "from xlm_jax" not in hf_remote.template_text(name)
