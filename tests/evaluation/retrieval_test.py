"""Tatoeba retrieval: the metric against a brute-force reference, the all-layer embedding
against `Encoder.embed`, the CLI end to end on a tiny random model, its input errors, and
models with language embeddings (each side embedded in its own language)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from xlm_jax.evaluation import embedding, retrieval

ENGLISH = [
    "the cat sat on the mat", "a dog ran in the park", "we eat bread every day",
    "she reads a long book", "the sun is very hot", "my brother plays music",
    "rain falls on the old roof", "they walk to school", "birds sing in the morning",
    "he drinks cold water", "the river runs to the sea", "you write a short letter",
]


def _png_ok(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 2000


# ----------------------------------------------------------------------------- the metric

def _brute_force(src: np.ndarray, tgt: np.ndarray) -> float:
    """Independent reference: loops over pairs with the textbook cosine formula."""
    correct = 0
    for i in range(len(src)):
        best, best_j = -np.inf, -1
        for j in range(len(tgt)):
            cos = float(np.dot(src[i], tgt[j]) / (np.linalg.norm(src[i]) * np.linalg.norm(tgt[j])))
            if cos > best:
                best, best_j = cos, j
        correct += best_j == i
    return correct / len(src)


def test_retrieval_accuracy_planted_matches():
    rng = np.random.default_rng(0)
    n, d = 40, 16
    src = rng.normal(size=(n, d))
    tgt = rng.normal(size=(n, d))
    planted = rng.choice(n, size=27, replace=False)
    # Planted: a scaled, slightly noisy copy (cosine ~1); the rest: the opposite vector
    # (cosine -1, so the gold can never be the nearest). Expected acc@1 is exactly 27/40.
    tgt[planted] = 3.0 * src[planted] + 1e-4 * rng.normal(size=(27, d))
    rest = np.setdiff1d(np.arange(n), planted)
    tgt[rest] = -src[rest]
    acc = retrieval.retrieval_accuracy(src.astype(np.float32), tgt.astype(np.float32))
    assert acc == pytest.approx(27 / 40)
    assert acc == pytest.approx(_brute_force(src, tgt))


def test_retrieval_accuracy_random_matches_reference_and_is_cosine_not_dot():
    rng = np.random.default_rng(1)
    src, tgt = rng.normal(size=(30, 8)), rng.normal(size=(30, 8))
    tgt[:10] = src[:10] + 0.3 * rng.normal(size=(10, 8))
    assert retrieval.retrieval_accuracy(src, tgt) == pytest.approx(_brute_force(src, tgt))
    # A huge-norm distractor wins a dot-product search but not a cosine one: the cosine of
    # e0 with [30, 30, 1] is 0.707 < 0.9988 (row 0's gold), its dot product 30 > 1.
    src2 = np.eye(3)
    tgt2 = np.array([[1.0, 0.05, 0.0], [0.0, 1.0, 0.0], [30.0, 30.0, 1.0]])
    assert (src2 @ tgt2.T).argmax(axis=1).tolist() == [2, 2, 2]  # dot product: acc 1/3
    assert retrieval.retrieval_accuracy(src2, tgt2) == 1.0
    assert _brute_force(src2, tgt2) == 1.0


def test_retrieval_accuracy_shape_errors():
    with pytest.raises(ValueError, match=r"equal shape, got \(3, 4\) and \(2, 4\)"):
        retrieval.retrieval_accuracy(np.ones((3, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="N=0"):
        retrieval.retrieval_accuracy(np.ones((0, 4)), np.ones((0, 4)))


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def spm_path(tmp_path_factory, train_xlmr_spm):
    """The demo SentencePiece model if present, else a tiny one trained on the test text."""
    demo = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data", "spm.model")
    if os.path.exists(demo):
        return os.path.abspath(demo)
    d = tmp_path_factory.mktemp("spm")
    text = d / "train.txt"
    text.write_text("\n".join(ENGLISH + [" ".join(reversed(s.split())) for s in ENGLISH]) * 4)
    return train_xlmr_spm(text, d / "spm", 80, model_type="unigram", character_coverage=1.0)


def _tiny_model(spm_path: str, num_languages: int = 0, ln_style: str = "post"):
    """A tiny random model for `spm_path`'s vocabulary: (config, numpy params)."""
    import flax.linen as nn
    import sentencepiece as spm

    from xlm_jax.models.config import ModelConfig
    from xlm_jax.models.transformer import Transformer

    size = spm.SentencePieceProcessor(model_file=spm_path).get_piece_size()
    cfg = ModelConfig(vocab_size=size + 2, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                      max_positions=42, dropout_rate=0.0, attention_dropout_rate=0.0,
                      num_languages=num_languages, ln_style=ln_style)
    ids = np.full((1, 4), 5, np.int32)
    kw = {"lang_ids": np.ones_like(ids)} if num_languages else {}
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), ids, **kw)["params"])
    return cfg, jax.tree_util.tree_map(np.asarray, params)


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory, spm_path):
    """A directory holding `spm_path` as spm.model (what the encoder looks for)."""
    d = tmp_path_factory.mktemp("spmdir")
    with open(spm_path, "rb") as f:
        (d / "spm.model").write_bytes(f.read())
    return str(d)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spm_path, spm_dir):
    from xlm_jax.convert import hf

    cfg, params = _tiny_model(spm_path)
    out = tmp_path_factory.mktemp("model") / "m"
    hf.save_xlm_jax(str(out), cfg, params, spm_from=spm_dir)
    return str(out)


@pytest.fixture(scope="module")
def lang_model(spm_path, spm_dir):
    """(config, params, spm dir) of a model with language embeddings for the default language
    list. Encoders are built from it directly: `load_encoder` cannot read such a model yet
    (tests/models/encoder_lang_test.py::test_load_encoder_reads_a_language_model)."""
    from xlm_jax.encoder import default_language_list

    cfg, params = _tiny_model(spm_path, num_languages=len(default_language_list()) + 1)
    return cfg, params, spm_dir


@pytest.fixture(scope="module")
def encoder(model_dir):
    from xlm_jax.encoder import load_encoder

    return load_encoder(model_dir)


@pytest.fixture(scope="module")
def tatoeba_dir(tmp_path_factory):
    """`aa` translations are the English strings themselves (acc@1 must be 1.0);
    `bb` are the English words reversed (a random model scores whatever it scores)."""
    d = tmp_path_factory.mktemp("tatoeba")
    eng = "\n".join(ENGLISH) + "\n"
    (d / "tatoeba.aa-eng.aa").write_text(eng)
    (d / "tatoeba.aa-eng.eng").write_text(eng)
    (d / "tatoeba.bb-eng.bb").write_text("\n".join(" ".join(reversed(s.split())) for s in ENGLISH))
    (d / "tatoeba.bb-eng.eng").write_text(eng)
    (d / "README").write_text("not a data file")
    return str(d)


@pytest.fixture(scope="module")
def lang_tatoeba_dir(tmp_path_factory):
    """Registry codes: `de` is the English words reversed; `fr` shares its first six lines with
    `de` (the same strings in two languages' files) and repeats English on the rest (the same
    string on both sides)."""
    d = tmp_path_factory.mktemp("tatoeba_lang")
    eng = "\n".join(ENGLISH) + "\n"
    rev = [" ".join(reversed(s.split())) for s in ENGLISH]
    (d / "tatoeba.de-eng.de").write_text("\n".join(rev) + "\n")
    (d / "tatoeba.de-eng.eng").write_text(eng)
    (d / "tatoeba.fr-eng.fr").write_text("\n".join(rev[:6] + ENGLISH[6:]) + "\n")
    (d / "tatoeba.fr-eng.eng").write_text(eng)
    return str(d)


# ----------------------------------------------------------------------------- embedding

def test_embed_layers_matches_encoder_embed(encoder):
    sents = ENGLISH[:7] + ["short", "a much longer sentence than the others with many words in it"]
    got = retrieval.embed_layers(encoder, sents, [0, 1, 2], pool="mean", max_length=32,
                                 batch_size=4)
    assert got.shape == (3, len(sents), 16)
    for k, layer in enumerate([0, 1, 2]):
        want = encoder.embed(sents, layer=layer, pool="mean", batch_size=3, max_length=32)
        np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-5)
    cls = retrieval.embed_layers(encoder, sents, [2], pool="cls", max_length=32, batch_size=16)
    np.testing.assert_allclose(cls[0], encoder.embed(sents, layer=2, pool="cls", max_length=32),
                               rtol=1e-4, atol=1e-5)


def test_evaluate_against_reference(encoder, tatoeba_dir):
    res = retrieval.evaluate(encoder, tatoeba_dir, "all", max_length=32, batch_size=8)
    assert sorted(res.per_layer) == [0, 1, 2]
    bb = [" ".join(reversed(s.split())) for s in ENGLISH]
    for layer in (0, 1, 2):
        assert res.per_layer_language[layer]["aa"].src_to_eng == 1.0
        assert res.per_layer_language[layer]["aa"].eng_to_src == 1.0
        src = encoder.embed(bb, layer=layer, max_length=32)
        eng = encoder.embed(ENGLISH, layer=layer, max_length=32)
        score = res.per_layer_language[layer]["bb"]
        assert score.src_to_eng == pytest.approx(_brute_force(src, eng))
        assert score.eng_to_src == pytest.approx(_brute_force(eng, src))
        # the per-sentence hits behind them (what the demo's bootstrap resamples)
        assert len(score.hits[0]) == len(ENGLISH) == score.num_pairs
        assert np.mean(score.hits[0]) == score.src_to_eng
        assert np.mean(score.hits[1]) == score.eng_to_src
        want_avg = (2.0 + score.src_to_eng + score.eng_to_src) / 4
        assert res.per_layer[layer] == pytest.approx(want_avg)
    assert res.best_layer == max([0, 1, 2], key=lambda k: (res.per_layer[k], -k))
    assert res.average == pytest.approx(res.per_layer[res.best_layer])


def test_all_layers_cost_one_forward_pass(encoder, tatoeba_dir, monkeypatch):
    """`all` must not run the model once per layer, nor embed the shared English file twice."""
    seen = []
    real = encoder.hidden_states

    def counting(ids, mask=None, lang_ids=None, layer_norm="none"):
        seen.append(np.asarray(ids).shape)
        return real(ids, mask, lang_ids, layer_norm)

    monkeypatch.setattr(encoder, "hidden_states", counting)
    retrieval.evaluate(encoder, tatoeba_dir, 0, max_length=32, batch_size=64)
    one_layer = list(seen)
    seen.clear()
    retrieval.evaluate(encoder, tatoeba_dir, "all", max_length=32, batch_size=64)
    assert seen == one_layer
    # 24 distinct strings: the 12 English ones (aa's both sides and bb's English side) embedded
    # once, and bb's 12 reversed ones; each group is one batch padded to 16 rows.
    assert sum(shape[0] for shape in seen) == 32


def test_final_layer_norm_states_are_numpys_layer_norm_below_the_last_layer(spm_path, spm_dir,
                                                                             tatoeba_dir, encoder):
    """`layer_norm="final"` on a pre-LN model: every state below the last is the raw state
    through the final LayerNorm (numpy: (x - mean) / sqrt(var + eps) * scale + bias), the last
    is unchanged (it has passed it already), and retrieval scores those states; a post-LN
    model and an unknown value are one-line errors raised before anything is embedded."""
    from xlm_jax.encoder import Encoder

    cfg, params = _tiny_model(spm_path, ln_style="pre")
    params["final_norm"]["scale"] = np.linspace(0.5, 1.5, cfg.hidden_size, dtype=np.float32)
    params["final_norm"]["bias"] = np.linspace(-0.1, 0.1, cfg.hidden_size, dtype=np.float32)
    enc = Encoder(cfg, params, spm_dir)
    ids, mask = enc.tokenizer.encode_batch(ENGLISH[:4], 16)
    raw, normed = enc.hidden_states(ids, mask), enc.hidden_states(ids, mask, layer_norm="final")
    mean = raw.mean(-1, keepdims=True)
    var = ((raw - mean) ** 2).mean(-1, keepdims=True)
    want = ((raw - mean) / np.sqrt(var + cfg.layer_norm_eps) * params["final_norm"]["scale"]
            + params["final_norm"]["bias"])
    np.testing.assert_allclose(normed[:-1], want[:-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(normed[-1], raw[-1])
    assert np.abs(normed[1] - raw[1]).max() > 0.1  # the option changes what is scored

    res = retrieval.evaluate(enc, tatoeba_dir, "all", max_length=32, layer_norm="final")
    bb = [" ".join(reversed(s.split())) for s in ENGLISH]
    src = enc.embed(bb, layer=1, max_length=32, layer_norm="final")
    eng = enc.embed(ENGLISH, layer=1, max_length=32, layer_norm="final")
    assert res.per_layer_language[1]["bb"].src_to_eng == pytest.approx(_brute_force(src, eng))
    assert res.to_json()["layer_norm"] == "final"
    assert retrieval.RetrievalResult.from_json(res.to_json()).layer_norm == "final"

    with pytest.raises(ValueError, match=r"layer_norm='final' is for pre-LN models; .* is "
                                         r"post-LN, whose states are normalised already"):
        retrieval.evaluate(encoder, tatoeba_dir, "all", layer_norm="final")
    with pytest.raises(ValueError, match=r"layer_norm='last' must be one of none, final"):
        enc.hidden_states(ids, mask, layer_norm="last")


# ----------------------------------------------------------------------------- CLI

def test_cli_all_layers(model_dir, tatoeba_dir, tmp_path, capsys):
    out = tmp_path / "res" / "after.json"
    rc = retrieval.main(["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer", "all",
                         "--max_length", "32", "--batch_size", "8", "--output_json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    # the per-layer table: one row per layer, each language's mean and the average, the best
    # layer marked
    printed = capsys.readouterr().out.splitlines()
    rows = {int(r.split()[0].rstrip("*")): r for r in printed if r[:5].strip().rstrip("*").isdigit()}
    assert sorted(rows) == [0, 1, 2]
    for k, row in rows.items():
        cells = row.split()[1:]
        per = data["per_layer_language"][str(k)]
        assert cells == [f"{100 * per[l]['mean']:.1f}" for l in ("aa", "bb")] + [
            f"{100 * data['per_layer'][str(k)]:.2f}"]
        assert row.split()[0].endswith("*") == (k == data["best_layer"])
    assert data["layer"] == "all" and data["checkpoint"] == os.path.abspath(model_dir)
    assert data["step"] is None
    assert sorted(data["per_layer"]) == ["0", "1", "2"]
    best = max(range(3), key=lambda k: (data["per_layer"][str(k)], -k))
    assert data["best_layer"] == best
    assert data["average"] == pytest.approx(data["per_layer"][str(best)])
    assert set(data["per_language"]) == {"aa", "bb"}
    aa, bb = data["per_language"]["aa"], data["per_language"]["bb"]
    assert aa["aa->eng"] == 1.0 and aa["eng->aa"] == 1.0 and aa["mean"] == 1.0
    assert bb["mean"] == pytest.approx((bb["bb->eng"] + bb["eng->bb"]) / 2)
    assert data["average"] == pytest.approx((aa["mean"] + bb["mean"]) / 2)
    assert _png_ok(str(tmp_path / "res" / "after.png"))  # default: next to the JSON
    # The JSON round-trips into the dataclass the report reads.
    back = retrieval.RetrievalResult.load(str(out))
    assert back.average == pytest.approx(data["average"]) and back.best_layer == best


def test_cli_without_output_json_prints_the_same_table_and_writes_nothing(
        model_dir, tatoeba_dir, tmp_path, capsys, monkeypatch):
    """issue 55: the table a user reads needs no JSON file; the printed lines are the JSON
    run's, less the path."""
    argv = ["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer", "all",
            "--max_length", "32", "--batch_size", "8"]
    out = tmp_path / "with" / "r.json"
    assert retrieval.main(argv + ["--output_json", str(out)]) == 0
    with_json = capsys.readouterr().out.splitlines()
    monkeypatch.chdir(tmp_path / "with")
    before = sorted(os.listdir(tmp_path))
    assert retrieval.main(argv) == 0
    without = capsys.readouterr().out.splitlines()
    assert sorted(os.listdir(tmp_path)) == before and sorted(os.listdir(".")) == ["r.json",
                                                                                 "r.png"]
    assert without[:-1] == [line for line in with_json if not line.startswith("plot ->")][:-1]
    assert with_json[-2].endswith(f" -> {out}") and without[-1] == with_json[-2].split(" -> ")[0]
    average = json.loads(out.read_text())["average"]
    assert without[-1].endswith(f"average acc@1 {100 * average:.2f}")


def test_cli_single_layer_languages_and_plot(model_dir, tatoeba_dir, tmp_path):
    out = tmp_path / "one.json"
    rc = retrieval.main(["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer", "1",
                         "--languages", "aa", "--max_length", "32", "--output_json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["layer"] == 1 and list(data["per_language"]) == ["aa"]
    assert data["average"] == 1.0 and "per_layer" not in data
    assert not (tmp_path / "one.png").exists()  # no plot unless asked for a single layer
    plot = tmp_path / "bars.png"
    assert retrieval.main(["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer",
                           "2", "--max_length", "32", "--output_json", str(out), "--plot",
                           str(plot)]) == 0
    assert _png_ok(str(plot))


def test_cli_step_is_passed_through_only_when_given(model_dir, tatoeba_dir, tmp_path,
                                                    monkeypatch, encoder):
    import xlm_jax.encoder as encoder_mod

    calls = []

    def fake_load(path, **kwargs):
        calls.append((path, kwargs))
        return encoder

    monkeypatch.setattr(encoder_mod, "load_encoder", fake_load)
    args = ["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer", "0",
            "--languages", "aa", "--max_length", "32", "--output_json", str(tmp_path / "s.json")]
    assert retrieval.main(args + ["--step", "300"]) == 0
    assert calls[-1] == (model_dir, {"step": 300})
    assert json.loads((tmp_path / "s.json").read_text())["step"] == 300
    assert retrieval.main(args) == 0
    assert calls[-1] == (model_dir, {})


def _error(capsys, argv) -> str:
    rc = retrieval.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_cli_errors(model_dir, tatoeba_dir, tmp_path, capsys):
    base = ["--checkpoint", model_dir, "--max_length", "32",
            "--output_json", str(tmp_path / "x.json")]
    missing = str(tmp_path / "nope")
    err = _error(capsys, base + ["--tatoeba_dir", missing, "--layer", "0"])
    assert missing in err and "tatoeba.{xx}-eng.{xx}" in err

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "tatoeba.aa-eng.aa").write_text("x\n")  # the eng side is missing
    err = _error(capsys, base + ["--tatoeba_dir", str(empty), "--layer", "0"])
    assert str(empty) in err and "no Tatoeba files" in err and "tatoeba.{xx}-eng.eng" in err

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tatoeba.cc-eng.cc").write_text("one\ntwo\nthree\n")
    (bad / "tatoeba.cc-eng.eng").write_text("one\ntwo\n")
    err = _error(capsys, base + ["--tatoeba_dir", str(bad), "--layer", "0"])
    assert (f"{bad / 'tatoeba.cc-eng.cc'} has 3 lines" in err
            and f"{bad / 'tatoeba.cc-eng.eng'} has 2" in err)

    err = _error(capsys, base + ["--tatoeba_dir", tatoeba_dir, "--layer", "3"])
    assert "layer=3 out of range" in err and "0..2" in err

    err = _error(capsys, base + ["--tatoeba_dir", tatoeba_dir, "--layer", "0",
                                 "--languages", "aa,zz"])
    assert "zz" in err and "found: aa, bb" in err

    with pytest.raises(SystemExit):
        retrieval.main(base + ["--tatoeba_dir", tatoeba_dir, "--layer", "last"])
    assert "--layer 'last': expected an integer or 'all'" in capsys.readouterr().err


def test_modules_import_without_tensorflow():
    code = ("import sys, xlm_jax.evaluation.retrieval, xlm_jax.evaluation.report; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'seqio', 'jax')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_step_recorded_for_a_trainer_model_dir(tmp_path):
    """Without --step the JSON names the checkpoint load_encoder picks: the newest finished."""
    run = tmp_path / "run"
    for step in (100, 300):
        (run / "checkpoints" / str(step) / "state").mkdir(parents=True)
    (run / "checkpoints" / "400").mkdir()  # unfinished: no state item yet
    (run / "xlm_jax_config.json").write_text("{}")
    assert embedding.resolve_step(str(run), None) == 300
    assert embedding.resolve_step(str(run), 100) == 100
    (run / "params").mkdir()  # an exported model dir: load_encoder reads params/, not a step
    assert embedding.resolve_step(str(run), None) is None


# ----------------------------------------------------------------------------- language embeddings

def test_evaluate_language_model_embeds_each_side_in_its_language(lang_model, lang_tatoeba_dir,
                                                                  monkeypatch):
    from xlm_jax.data.features import language_index
    from xlm_jax.encoder import Encoder, default_language_list

    cfg, params, spm_dir = lang_model
    enc, ref = Encoder(cfg, params, spm_dir), Encoder(cfg, params, spm_dir)
    tok = enc.tokenizer
    seen = []  # (real tokens, language id) of every row the model ran on
    real = enc.hidden_states

    def recording(ids, mask=None, lang_ids=None, layer_norm="none"):
        for row, m, lang in zip(np.asarray(ids), np.asarray(mask, bool), np.asarray(lang_ids)):
            assert not lang[~m].any() and len(set(lang[m])) == 1  # one language, 0 on padding
            seen.append((tuple(row[m]), int(lang[m][0])))
        return real(ids, mask, lang_ids, layer_norm)

    monkeypatch.setattr(enc, "hidden_states", recording)
    res = retrieval.evaluate(enc, lang_tatoeba_dir, "all", max_length=32, batch_size=8)

    def tokens(s):
        ids, mask = tok.encode_batch([s], 32)
        return tuple(np.asarray(ids)[0][np.asarray(mask, bool)[0]])

    lines = {lang: retrieval.read_pair(lang_tatoeba_dir, lang).src for lang in ("de", "fr")}
    lid = {lang: language_index(lang, default_language_list()) for lang in ("de", "fr", "en")}
    # Every (language, sentence) embedded exactly once: the English file shared by both
    # languages once as `en`, the six strings in both xx files once per language, and fr's
    # English strings once as `fr` and once as `en`.
    want = ([(tokens(s), lid["en"]) for s in ENGLISH]
            + [(tokens(s), lid[lang]) for lang in ("de", "fr") for s in lines[lang]])
    assert sorted(k for k in seen if k[0] != tokens("")) == sorted(want)  # "" fills batches
    for layer in (0, 1, 2):
        eng = ref.embed(ENGLISH, layer=layer, max_length=32, lang="en")
        for lang in ("de", "fr"):
            src = ref.embed(lines[lang], layer=layer, max_length=32, lang=lang)
            score = res.per_layer_language[layer][lang]
            assert score.src_to_eng == pytest.approx(_brute_force(src, eng))
            assert score.eng_to_src == pytest.approx(_brute_force(eng, src))


def test_cli_language_model_language_list(lang_model, tatoeba_dir, tmp_path,
                                          capsys):
    from xlm_jax.convert import hf

    cfg, params, spm_dir = lang_model
    model_dir = str(tmp_path / "model")
    hf.save_xlm_jax(model_dir, cfg, params, spm_from=spm_dir)
    out = tmp_path / "r.json"
    base = ["--checkpoint", model_dir, "--tatoeba_dir", tatoeba_dir, "--layer", "1",
            "--max_length", "32", "--output_json", str(out)]
    # aa and bb are no registry codes: not in the default list, nor bb in the given one.
    err = _error(capsys, base)
    assert "language 'aa' is not in the language list" in err
    err = _error(capsys, base + ["--language_list", "aa,en"])
    assert "language 'bb' is not in the language list (2 languages: aa, en)" in err
    assert not out.exists()

    codes = tmp_path / "langs.txt"
    codes.write_text("aa\nbb\n\nen\n")
    assert retrieval.main(base + ["--language_list", str(codes)]) == 0
    from_file = json.loads(out.read_text())
    assert set(from_file["per_language"]) == {"aa", "bb"}
    assert retrieval.main(base + ["--language_list", "aa, bb,en"]) == 0
    assert json.loads(out.read_text())["per_language"] == from_file["per_language"]


def test_standard_error_is_the_binomial_formula():
    """Two languages of 50 and 200 pairs, both directions: the mean of four proportions."""
    scores = {"de": retrieval.LanguageScore(0.5, 0.3, 50),
              "fr": retrieval.LanguageScore(0.9, 0.8, 200)}
    result = retrieval.RetrievalResult(0, 0, scores, {0: scores})
    variance = (0.5 * 0.5 / 50 + 0.3 * 0.7 / 50 + 0.9 * 0.1 / 200 + 0.8 * 0.2 / 200) / 16
    assert result.standard_error == pytest.approx(np.sqrt(variance))
    assert result.average == pytest.approx((0.5 + 0.3 + 0.9 + 0.8) / 4)


def _result(hits_by_lang, layer=0):
    """A RetrievalResult of given per-sentence hits ({lang: (forward, backward)})."""
    scores = {lang: retrieval.LanguageScore(float(np.mean(f)), float(np.mean(b)), len(f),
                                            hits=(np.asarray(f, bool), np.asarray(b, bool)))
              for lang, (f, b) in hits_by_lang.items()}
    return retrieval.RetrievalResult(layer, layer, scores, {layer: scores})


def test_paired_bootstrap_matches_the_standard_error_of_a_paired_mean():
    """The bootstrap's spread of a mean difference tends to the plug-in standard error
    sd(d) / sqrt(n) of the per-sentence differences d (ddof 0); the average over languages to
    sqrt(sum of their variances) / languages. Identical models spread 0."""
    rng = np.random.default_rng(3)
    a = {lang: (rng.random(n) < 0.3, rng.random(n) < 0.3) for lang, n in (("de", 80), ("fr", 150))}
    b = {lang: (rng.random(len(f)) < 0.5, rng.random(len(f)) < 0.4) for lang, (f, _) in a.items()}
    spread = retrieval.paired_bootstrap(_result(a), _result(b), resamples=6000, seed=1)
    expected = {}
    for lang in a:
        d = ((b[lang][0].astype(float) + b[lang][1]) - (a[lang][0].astype(float) + a[lang][1])) / 2
        expected[lang] = d.std() / np.sqrt(len(d))
        assert spread.per_language[lang] == pytest.approx(expected[lang], rel=0.05)
    assert spread.average == pytest.approx(np.sqrt(sum(v ** 2 for v in expected.values())) / 2,
                                           rel=0.05)
    same = retrieval.paired_bootstrap(_result(a), _result(a), resamples=50)
    assert same.average == 0 and set(same.per_language.values()) == {0.0}
    with pytest.raises(ValueError, match="languages differ"):
        retrieval.paired_bootstrap(_result(a), _result({"de": b["de"]}))
    # a stored result keeps each sentence's hits (0/1 characters): the same bootstrap
    stored = json.loads(json.dumps(_result(a).to_json()))
    assert stored["per_language"]["de"]["hits"]["de->eng"] == "".join(
        "1" if h else "0" for h in a["de"][0])
    from_json = retrieval.RetrievalResult.from_json(stored)
    again = retrieval.paired_bootstrap(from_json, _result(b), resamples=6000, seed=1)
    assert again == spread
    for lang in a:  # stored without hits (an older file): no paired comparison
        del stored["per_language"][lang]["hits"]
    with pytest.raises(ValueError, match="lacks per-sentence hits"):
        retrieval.paired_bootstrap(retrieval.RetrievalResult.from_json(stored), _result(b))


@pytest.mark.parametrize("hits, message", [
    ("0110", "must be 5 characters 0/1"),
    ("01102", "must be 5 characters 0/1"),
    ("11111", "gives acc@1 1.000000, the file says 0.4"),
])
def test_stored_hits_that_do_not_fit_their_scores_are_one_line_errors(tmp_path, hits, message):
    result = _result({"de": ([0, 1, 1, 0, 0], [1, 1, 0, 0, 0])}).to_json()
    result["per_language"]["de"]["hits"]["de->eng"] = hits
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError) as e:
        retrieval.RetrievalResult.load(str(path))
    assert str(e.value).startswith(f"{path}: per_language['de']['hits']['de->eng']")
    assert message in str(e.value) and "\n" not in str(e.value)
