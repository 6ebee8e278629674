"""`python -m xlm_jax.translate` as users run it: a few fine-tuning steps on a demo pair task,
then beam search over a test file; bleu.json holds the sacreBLEU score of translations.txt
against the references (recomputed here); misaligned test files fail before training."""
import json
import os
import subprocess
import sys

import pytest

from tests.testlib.cli_run import env as cli_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TATOEBA = os.path.join(ROOT, "tasks", "demo_data", "tatoeba")


def _run(args):
    # One CPU device, as a user's CPU run has (the suite's own 8 would nearly double the
    # compile time of the sharded train and decode steps).
    return subprocess.run([sys.executable, "-m", "xlm_jax.translate",
                           "--gin_file=demo/veco_translate.gin", *args], cwd=ROOT,
                          env=cli_env(1), capture_output=True, text=True, timeout=600)


def _test_files(tmp_path, n_src=8, n_tgt=8):
    src = open(os.path.join(TATOEBA, "tatoeba.de-eng.eng"), encoding="utf-8").read().split("\n")
    tgt = open(os.path.join(TATOEBA, "tatoeba.de-eng.de"), encoding="utf-8").read().split("\n")
    (tmp_path / "src.txt").write_text("\n".join(src[:n_src]) + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("\n".join(tgt[:n_tgt]) + "\n", encoding="utf-8")
    return [f"--gin.SOURCE_FILE='{tmp_path / 'src.txt'}'",
            f"--gin.TARGET_FILE='{tmp_path / 'tgt.txt'}'"], tgt[:n_tgt]


def test_translate_trains_decodes_and_scores(tmp_path):
    sacrebleu = pytest.importorskip("sacrebleu")
    pytest.importorskip("seqio")
    files, refs = _test_files(tmp_path)
    out = tmp_path / "run"
    r = _run([f"--model_dir={out}", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=8",
              "--gin.optim.OptimizerConfig.warmup_steps=1", *files])
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.load(open(out / "bleu.json"))
    hyps = open(out / "translations.txt", encoding="utf-8").read().split("\n")[:-1]
    assert len(hyps) == 8 and result["sentences"] == 8 and result["beam_size"] == 4
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert f"BLEU {result['bleu']:.2f} (en->de, 8 sentences, beam 4)" in r.stdout


def test_misaligned_test_files_fail_before_training(tmp_path):
    files, _ = _test_files(tmp_path, n_src=8, n_tgt=7)
    r = _run([f"--model_dir={tmp_path / 'run'}", *files])
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: translate: ") and "src.txt has 8 lines" in err
    assert "tgt.txt has 7" in err and "line-aligned" in err
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_language_without_a_language_id_token_fails_before_training(tmp_path):
    """The test set's target language, then the pair task's own languages, against
    LANGUAGE_TOKENS: each a one-line error naming the language, before anything is trained."""
    pytest.importorskip("seqio")
    files, _ = _test_files(tmp_path)
    r = _run([f"--model_dir={tmp_path / 'a'}", "--gin.LANGUAGE_TOKENS=['en', 'fr']", *files])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: translate: target_lang='de' has no language-id token (language_tokens=['en', "
        "'fr'])")
    r = _run([f"--model_dir={tmp_path / 'b'}", "--gin.LANGUAGE_TOKENS=['en', 'fr']",
              "--gin.TARGET_LANG='fr'", *files])
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()[-1]
    assert "language 'de' has no language-id token (language_tokens=['en', 'fr'])" in err
    assert "the task's rows are in en, de" in err
    # nothing was saved: the trainer's checkpoints/ appears at its first save
    assert not (tmp_path / "b" / "checkpoints").exists()
