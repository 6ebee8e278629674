"""Tests for xlm_jax.data.train_spm: the XLM-R layout and the alpha-smoothed training mix."""

import collections
import gzip
import lzma
import pathlib
import re

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from xlm_jax.data import train_spm, vocab

# Each language's sentences start with a marker word so the training text can be attributed.
SIZES = {"de": 1200, "fr": 150, "sw": 12}


_SYLLABLES = {"de": "ha us gar ten stra sse fen ster ber lin kno chen".split(),
              "fr": "mai son jar din ru e fe ne tre pa ris lou".split(),
              "sw": "nyu mba bu sta ni ba ra bara di ri sha ki".split()}


def _sentence(lang, i):
    syl = _SYLLABLES[lang]
    words = ["".join(syl[(i * k + j * 5 + k) % 12] for j in range(2 + (i + k) % 2))
             for k in range(1, 5)]
    return f"{lang}mark " + " ".join(words) + f" {i}"


def _write_corpus(root: pathlib.Path) -> pathlib.Path:
    """de as .txt, fr as .txt.gz, sw as .txt.xz; documents of 5 lines separated by blank lines."""
    root.mkdir(parents=True, exist_ok=True)
    for lang, n in SIZES.items():
        lines = []
        for i in range(n):
            if i and i % 5 == 0:
                lines.append("")
            lines.append(_sentence(lang, i))
        text = "\n".join(lines) + "\n"
        if lang == "de":
            (root / "de.txt").write_text(text, encoding="utf-8")
        elif lang == "fr":
            with gzip.open(root / "fr.txt.gz", "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            with lzma.open(root / "sw.txt.xz", "wt", encoding="utf-8") as f:
                f.write(text)
    (root / "README").write_text("ignored\n")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    corpus = _write_corpus(root / "corpus")
    result = train_spm.train_spm(str(corpus), str(root / "out" / "m"), vocab_size=120,
                                 alpha=0.3, sentences=1000, seed=0, keep_training_text=True)
    return corpus, result


def test_xlmr_layout(trained):
    _, result = trained
    sp = spm.SentencePieceProcessor(model_file=result.model_path)
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    assert sp.id_to_piece(0) == "<unk>" and sp.id_to_piece(1) == "<s>" and sp.id_to_piece(2) == "</s>"
    assert sp.get_piece_size() == 120
    proto = sentencepiece_model_pb2.ModelProto.FromString(open(result.model_path, "rb").read())
    assert proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    assert proto.trainer_spec.character_coverage == pytest.approx(0.9995)
    # No machine-specific paths are recorded in the model.
    assert proto.trainer_spec.model_prefix == "m" and list(proto.trainer_spec.input) == ["m.train.txt"]
    # Loads as an XLM-R tokenizer: 120 pieces -> 122 ids.
    tok = vocab.XLMRTokenizer(result.model_path)
    assert tok.vocab_size == 122 and tok.encode("dehaus")


def test_training_mix_follows_smoothed_rates(trained):
    _, result = trained
    assert result.sentence_counts == SIZES  # blank lines are document breaks, not sentences
    # Hand-computed p_j = n_j^0.3 / sum: 1200^0.3 = 8.3899, 150^0.3 = 4.4960, 12^0.3 = 2.1074,
    # sum 14.9933.
    expected = {"de": 0.559573, "fr": 0.299868, "sw": 0.140559}
    assert result.rates == pytest.approx(expected, abs=1e-5)
    lines = pathlib.Path(result.training_text).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1000
    written = collections.Counter(line.split()[0][:2] for line in lines)
    assert sum(written.values()) == 1000
    for lang, p in expected.items():
        assert abs(written[lang] - 1000 * p) <= 1, (lang, written[lang], 1000 * p)
    assert dict(written) == result.sampled_counts


def test_upsampling_repeats_evenly_and_downsampling_has_no_repeats(trained):
    _, result = trained
    lines = pathlib.Path(result.training_text).read_text(encoding="utf-8").splitlines()
    # sw: 12 sentences drawn 140 or 141 times -> every sentence 11 or 12 times.
    sw = collections.Counter(line for line in lines if line.startswith("swmark"))
    assert set(sw) == {_sentence("sw", i) for i in range(12)}
    assert set(sw.values()) <= {11, 12}
    # de: 1200 (distinct) sentences, 560 drawn without replacement.
    de = collections.Counter(line for line in lines if line.startswith("demark"))
    assert len(de) == result.sampled_counts["de"] and set(de.values()) == {1}


def test_sample_counts_sum_exactly():
    counts = train_spm.sample_counts({"a": 3, "b": 3, "c": 3}, 0.3, 10)
    assert sum(counts.values()) == 10 and sorted(counts.values()) == [3, 3, 4]


def test_deterministic(trained, tmp_path):
    corpus, result = trained
    again = train_spm.train_spm(str(corpus), str(tmp_path / "m"), vocab_size=120, alpha=0.3,
                                sentences=1000, seed=0, keep_training_text=True)
    assert open(again.model_path, "rb").read() == open(result.model_path, "rb").read()
    assert (pathlib.Path(again.training_text).read_bytes()
            == pathlib.Path(result.training_text).read_bytes())
    other = train_spm.train_spm(str(corpus), str(tmp_path / "s1"), vocab_size=120, alpha=0.3,
                                sentences=1000, seed=1, keep_training_text=True)
    assert (pathlib.Path(other.training_text).read_bytes()
            != pathlib.Path(result.training_text).read_bytes())


def test_training_text_removed_by_default(trained, tmp_path):
    corpus, _ = trained
    result = train_spm.train_spm(str(corpus), str(tmp_path / "m"), vocab_size=120,
                                 sentences=300)
    assert result.training_text is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model", "m.vocab"]


def test_cli(trained, tmp_path, capsys):
    corpus, _ = trained
    rc = train_spm.main(["--input_dir", str(corpus), "--model_prefix", str(tmp_path / "cli"),
                         "--vocab_size", "100", "--alpha", "0.5", "--sentences", "400"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith("language\tcorpus_sentences\t") and "\nsw\t12\t" in out
    assert (tmp_path / "cli.model").exists()
    rc = train_spm.main(["--input_dir", str(tmp_path / "missing"), "--model_prefix",
                         str(tmp_path / "x")])
    assert rc == 2
    assert "missing' is not a directory" in capsys.readouterr().err


def test_input_errors(tmp_path):
    with pytest.raises(ValueError, match="no {lang}.txt"):
        train_spm.find_language_files(str(tmp_path))
    (tmp_path / "english.txt").write_text("a b\n")
    with pytest.raises(ValueError, match=r"english\.txt.*'english'"):
        train_spm.find_language_files(str(tmp_path))
    (tmp_path / "english.txt").unlink()
    (tmp_path / "de.txt").write_text("a b\n")
    with gzip.open(tmp_path / "de.txt.gz", "wt") as f:
        f.write("c d\n")
    with pytest.raises(ValueError, match=r"'de' has two files.*de\.txt.*de\.txt\.gz"):
        train_spm.find_language_files(str(tmp_path))
    (tmp_path / "de.txt.gz").unlink()
    (tmp_path / "fr.txt").write_text("\n\n")
    with pytest.raises(ValueError, match=r"fr\.txt: language 'fr' has no sentences"):
        train_spm.train_spm(str(tmp_path), str(tmp_path / "m"), vocab_size=20)


def test_bad_arguments(trained, tmp_path):
    corpus, _ = trained
    with pytest.raises(ValueError, match="alpha=0"):
        train_spm.train_spm(str(corpus), str(tmp_path / "m"), alpha=0)
    with pytest.raises(ValueError, match="--sentences must be a positive int, got 0"):
        train_spm.train_spm(str(corpus), str(tmp_path / "m"), sentences=0)
    with pytest.raises(ValueError, match=r"training on .*corpus failed: .*Vocabulary size"):
        train_spm.train_spm(str(corpus), str(tmp_path / "m"), vocab_size=50_000, sentences=200)


def _demo_english(root: pathlib.Path, lines: int) -> pathlib.Path:
    """`root/en.txt`: the first `lines` lines of the demo corpus's English (real text)."""
    demo = pathlib.Path(__file__).resolve().parents[2] / "tasks" / "demo_data" / "mono"
    with lzma.open(demo / "en.txt.xz", "rt", encoding="utf-8") as f:
        text = [line for _, line in zip(range(lines), f)]
    root.mkdir(parents=True)
    (root / "en.txt").write_text("".join(text), encoding="utf-8")
    return root


def test_a_corpus_too_small_for_the_vocabulary_warns_once_before_the_table(tmp_path, capsys):
    """100 demo lines (~3.5k characters) for 100 pieces: below 100 characters per piece, one
    WARNING line on stderr naming the sizes and the rule; the model is trained anyway."""
    corpus = _demo_english(tmp_path / "small", 100)
    rc = train_spm.main(["--input_dir", str(corpus), "--model_prefix", str(tmp_path / "m"),
                         "--vocab_size", "100", "--sentences", "3000"])
    assert rc == 0 and (tmp_path / "m.model").exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("WARNING: train_spm: the corpus is small for 100 pieces: "), line
    assert re.search(r": [\d,]+ characters in \d+ distinct sentences, \d+ per piece, below the "
                     r"rule of 100 characters per piece \(our choice\); the 3,000 sampled "
                     r"sentences repeat each one \d+\.\dx on average, .*: use --vocab_size \d+ "
                     r"or less, or more text$", line), line
    result = train_spm.train_spm(str(corpus), str(tmp_path / "again"), vocab_size=100,
                                 sentences=3000, on_warning=lambda _: None)
    assert result.warning == line.removeprefix("WARNING: ")


def test_an_adequate_corpus_gives_no_warning_and_a_labelled_table(tmp_path, capsys):
    corpus = _demo_english(tmp_path / "enough", 400)
    rc = train_spm.main(["--input_dir", str(corpus), "--model_prefix", str(tmp_path / "m"),
                         "--vocab_size", "100", "--sentences", "3000"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "language\tcorpus_sentences\tsampling_rate\tsampled_sentences\trepeats"
    n = sum(1 for line in (corpus / "en.txt").read_text().splitlines() if line.strip())
    assert lines[1] == f"en\t{n}\t1.00000\t3000\t{3000 / n:.2f}" and lines[2].startswith("wrote ")


def test_corpus_warning_rule():
    """Exactly below MIN_CHARACTERS_PER_PIECE characters per piece; the 320 KB corpus of the
    report, 8000 pieces, 300000 sampled sentences."""
    rule = train_spm.MIN_CHARACTERS_PER_PIECE
    assert train_spm.corpus_warning(rule * 8000, 5000, 8000, 300_000) is None
    assert train_spm.corpus_warning(320_000, 5000, 8000, 300_000) == (
        "train_spm: the corpus is small for 8000 pieces: 320,000 characters in 5,000 distinct "
        "sentences, 40 per piece, below the rule of 100 characters per piece (our choice); the "
        "300,000 sampled sentences repeat each one 60.0x on average, so the pieces fit those "
        "sentences: use --vocab_size 3200 or less, or more text")
    assert train_spm.corpus_warning(500, 200, 100, 100).endswith(
        "each piece is estimated from few occurrences: use more text")
