"""Bad inputs give one clear line naming the file / key / value (or are skipped and counted)."""

import json
import logging
import random

import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")
pytest.importorskip("sentencepiece")

from xlm_jax.data import converters, preprocessors as prep, registry, sources, synthetic  # noqa
from xlm_jax.data.pipeline import make_batch_iterator  # noqa: E402
from xlm_jax.data.vocab import get_vocabulary  # noqa: E402


# seqio's registries put back after each test: the tests register tasks (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")


def one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, train_xlmr_spm):
    d = tmp_path_factory.mktemp("badspm")
    rnd = random.Random(0)
    words = ["good", "line", "text", "more", "words", "here", "bon", "texte"]
    (d / "t.txt").write_text("\n".join(" ".join(rnd.choice(words) for _ in range(5))
                                       for _ in range(100)))
    return get_vocabulary(train_xlmr_spm(d / "t.txt", d / "m", 30))


@pytest.fixture
def mono_dir(tmp_path):
    (tmp_path / "en.txt").write_text("good line\nmore words\n\nnext text\n")
    (tmp_path / "fr.txt").write_text("bon texte\n")
    return tmp_path


def test_missing_language_file_names_path_and_languages_found(mono_dir, vocab):
    with pytest.raises(FileNotFoundError) as e:
        registry.register_monolingual("bad_missing", str(mono_dir), ["en", "de"], vocab)
    msg = one_line(e)
    assert f"{mono_dir}/de.txt[.xz|.gz] does not exist" in msg
    assert "languages found in" in msg and "['en', 'fr']" in msg
    with pytest.raises(FileNotFoundError) as e:
        registry.register_monolingual("bad_nodir", str(mono_dir / "nope"), ["en"], vocab)
    assert f"corpus directory {mono_dir}/nope does not exist" in one_line(e)


def test_empty_file_is_an_error(mono_dir, vocab):
    (mono_dir / "es.txt").write_text("")
    (mono_dir / "it.txt").write_text("\n  \n\n")
    for lang in ("es", "it"):
        with pytest.raises(ValueError) as e:
            registry.register_monolingual("bad_empty", str(mono_dir), ["en", lang], vocab)
        msg = one_line(e)
        assert f"empty corpus: {mono_dir}/{lang}.txt has no usable documents" in msg


def test_invalid_utf8_lines_are_skipped_counted_and_reported(mono_dir, vocab, caplog):
    (mono_dir / "de.txt").write_bytes(b"good line\n\xff\xfe broken\nmore words\n\n"
                                      b"text \xc3\x28 here\n\nhere text\n")
    with caplog.at_level(logging.WARNING):
        reg = registry.register_monolingual("bad_utf8", str(mono_dir), ["de"], vocab)
    assert reg.stats["de"].invalid_utf8_lines == 2
    assert reg.stats["de"].examples == 2  # doc 2 lost its only line; docs 1 and 3 remain
    assert any(f"{mono_dir}/de.txt: skipped 2 lines that are not valid UTF-8" in r.getMessage()
               for r in caplog.records)
    entries = json.loads((mono_dir / registry.STATS_FILE).read_text())["entries"]
    assert [e["stats"]["invalid_utf8_lines"] for e in entries.values()
            if e["files"] == ["de.txt"]] == [2]
    # the pipeline sees only the valid lines
    docs = list(sources.iter_documents(str(mono_dir / "de.txt")))
    assert docs == [["good line", "more words"], ["here text"]]


def test_parallel_line_count_mismatch_names_both_files_and_counts(tmp_path, vocab):
    (tmp_path / "en-fr.en").write_text("good line\nmore words\ntext\n")
    (tmp_path / "en-fr.fr").write_text("bon texte\nbon\n")
    with pytest.raises(ValueError) as e:
        registry.register_parallel("bad_par", str(tmp_path), ["en-fr"], vocab)
    msg = one_line(e)
    assert (f"parallel files have different line counts: {tmp_path}/en-fr.en has 3 lines, "
            f"{tmp_path}/en-fr.fr has 2 lines") in msg
    (tmp_path / "en-de.en").write_text("good\n")
    with pytest.raises(FileNotFoundError) as e:
        registry.register_parallel("bad_par2", str(tmp_path), ["en-de"], vocab)
    assert f"found {tmp_path}/en-de.en but not {tmp_path}/en-de.de" in one_line(e)
    with pytest.raises(FileNotFoundError) as e:
        registry.register_parallel("bad_par3", str(tmp_path), ["en-sw"], vocab)
    msg = one_line(e)
    assert "no parallel corpus for en-sw" in msg and "pairs found: ['en-de', 'en-fr']" in msg


def test_parallel_bad_lines_are_skipped_and_counted(tmp_path, vocab, caplog):
    (tmp_path / "en-fr.en").write_bytes(b"good line\nbad \xff\nmore\n\ntext\n")
    (tmp_path / "en-fr.fr").write_bytes(b"bon texte\nbon\nbon\nbon\n\n")
    (tmp_path / "en-it.tsv").write_text("good\tbon\nno tab here\ntoo\tmany\ttabs\nline\ttexte\n")
    with caplog.at_level(logging.WARNING):
        reg = registry.register_parallel("bad_pskip", str(tmp_path), ["en-fr", "en-it"], vocab)
    fr, it = reg.stats["en-fr"], reg.stats["en-it"]
    assert (fr.examples, fr.invalid_utf8_lines, fr.empty_pairs) == (2, 1, 2)
    assert (it.examples, it.malformed_lines) == (2, 2)
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "skipped 1 lines that are not valid UTF-8" in messages
    assert f"{tmp_path}/en-it.tsv: skipped 2 lines without exactly one tab" in messages
    assert list(sources.iter_pairs(sources.find_parallel_files(str(tmp_path), "en", "fr"))) == [
        ("good line", "bon texte"), ("more", "bon")]


def test_unknown_language_codes(mono_dir, vocab):
    with pytest.raises(ValueError) as e:
        registry.register_monolingual("bad_lang", str(mono_dir), ["EN!"], vocab)
    assert "invalid language code 'EN!'" in one_line(e)
    with pytest.raises(ValueError) as e:
        registry.register_monolingual("bad_lang", str(mono_dir), ["qq"], vocab)
    assert "language 'qq' is not in the language list" in one_line(e)
    with pytest.raises(ValueError) as e:
        registry.register_monolingual("bad_lang", str(mono_dir), ["fr"], vocab,
                                      language_list=["en", "de"])
    assert "language 'fr' is not in the language list (2 languages: en, de)" in one_line(e)
    with pytest.raises(ValueError) as e:
        registry.register_parallel("bad_pair", str(mono_dir), ["en_fr"], vocab)
    assert "invalid language pair 'en_fr'" in one_line(e)


@pytest.mark.parametrize("alpha", [0, -0.5, float("nan")])
def test_alpha_must_be_positive_and_is_checked_before_any_io(tmp_path, vocab, alpha):
    for register, members in ((registry.register_monolingual, ["en"]),
                              (registry.register_parallel, ["en-fr"])):
        with pytest.raises(ValueError) as e:  # not FileNotFoundError: alpha is checked first
            register("bad_alpha", str(tmp_path / "missing"), members, vocab, alpha=alpha)
        assert "alpha must be a finite number > 0" in one_line(e)


def test_bad_registration_arguments(mono_dir, vocab):
    cases = [
        (lambda: registry.register_monolingual("bad-name", str(mono_dir), ["en"], vocab),
         "invalid name_prefix 'bad-name'"),
        (lambda: registry.register_monolingual("bad_k", str(mono_dir), ["en"], vocab,
                                               kind="pair"),
         "register_monolingual('bad_k'): unknown kind 'pair': expected one of mono, split_pair "
         "(old names: veco = split_pair)"),
        (lambda: registry.register_parallel("bad_k", str(mono_dir), ["en-fr"], vocab,
                                            kind="bilingual"),
         "register_parallel('bad_k'): unknown kind 'bilingual': expected one of pair, "
         "split_pair, mixup_pair (old names: veco = split_pair, mixup = mixup_pair)"),
        (lambda: registry.register_monolingual("bad_r", str(mono_dir), ["en"], vocab,
                                               rate_by="bytes"), "rate_by must be"),
        (lambda: registry.register_monolingual("bad_d", str(mono_dir), ["en", "en"], vocab),
         "duplicate languages"),
        (lambda: registry.register_monolingual("bad_n", str(mono_dir), [], vocab),
         "no languages given"),
        (lambda: registry.register_parallel("bad_m", str(mono_dir), ["en-fr"], vocab,
                                            kind="mixup_pair"), "needs >= 2 pairs"),
        (lambda: registry.register_parallel("bad_dp", str(mono_dir), ["en-fr", "en-fr"], vocab),
         "duplicate pairs"),
    ]
    for fn, text in cases:
        with pytest.raises(ValueError) as e:
            fn()
        assert text in one_line(e)


def test_bad_pipeline_arguments():
    for kwargs, text in (({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
                         ({"sequence_length": 4}, "sequence_length must be an int >= 8"),
                         ({"shard_index": 2, "num_shards": 2}, "shard_index=2 must be in"),
                         ({"start_step": -1}, "start_step must be an int >= 0"),
                         ({"seed": "x"}, "seed must be an int, got 'x'")):
        args = dict(task_or_mixture="any", batch_size=2, sequence_length=16, seed=0)
        args.update(kwargs)
        with pytest.raises(ValueError) as e:
            make_batch_iterator(**args)
        assert text in one_line(e)


def test_bad_synthetic_arguments():
    for kwargs, text in (({"kind": "foo"}, "unknown example kind 'foo'"),
                         ({"seq_len": 4, "kind": "pair"}, "seq_len must be an int >= 6, got 4"),
                         ({"vocab_size": 5}, "vocab_size must be an int >= 6, got 5"),
                         ({"pad_fraction": 1.0}, "pad_fraction must be in [0, 1)")):
        args = dict(batch_size=2, seq_len=16, vocab_size=50)
        args.update(kwargs)
        with pytest.raises(ValueError) as e:
            synthetic.synthetic_batch(**args)
        assert text in one_line(e)


def test_bad_converter_and_preprocessor_arguments(vocab):
    with pytest.raises(ValueError) as e:
        converters.SplitPairConverter(pack=True)
    assert "SplitPairConverter cannot pack" in one_line(e)
    with pytest.raises(ValueError) as e:
        converters.task_feature_lengths("words", 8)
    assert "unknown example kind 'words'" in one_line(e)
    ds = tf.data.Dataset.from_tensors({"text": tf.constant("x")})
    with pytest.raises(ValueError) as e:
        prep.tokenize(ds, {"input_ids": seqio.Feature(vocab)}, {"lines": "tokens"})
    assert "tokenize: no feature 'lines' to tokenize (features: ['text'])" in one_line(e)
    with pytest.raises(ValueError) as e:
        registry.register_parallel("bad_lim", "unused", ["en-fr"], vocab, max_side_length=2)
    assert "max_side_length=2 (need >= 3)" in one_line(e)


def test_a_latin1_corpus_is_refused_naming_the_encoding(tmp_path, vocab):
    """A corpus saved as Latin-1 loses every accented line as invalid UTF-8: refused in one
    line naming the count and the likely encoding, instead of training on what is left; the
    same text as UTF-8 registers, and a few corrupt lines stay a warning (test above)."""
    lines = [f"le texte numéro {i} est là" if i % 2 else f"bon texte {i}" for i in range(40)]
    text = "\n".join(lines) + "\n"
    (tmp_path / "fr.txt").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError) as e:
        registry.register_monolingual("bad_latin1", str(tmp_path), ["fr"], vocab)
    msg = one_line(e)
    assert f"{tmp_path}/fr.txt: 20 of 40 lines are not valid UTF-8" in msg
    assert "Latin-1 / Windows-1252" in msg
    (tmp_path / "fr.txt").write_bytes(text.encode("utf-8"))
    reg = registry.register_monolingual("good_latin1_fixed", str(tmp_path), ["fr"], vocab)
    assert reg.stats["fr"].invalid_utf8_lines == 0
    (tmp_path / "de.txt").write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    assert "UTF-16" in sources.likely_encoding([str(tmp_path / "de.txt")])
