"""read_tfds against real TFDS datasets prepared locally (no network, no mocks).

The installed tensorflow_datasets wheel ships no `dummy_data` folders, so the raw files each
builder downloads (XNLI-1.0.zip, x-final.tar.gz, panx_dataset.tar, xquad.*.json, MLQA_V1.zip,
the TyDiQA GoldP files, SQuAD v1.1, the UD 2.5 tarball) are written here in their original
formats, tiny. They are put where TFDS's DownloadManager looks for finished downloads
(`download_dir/<builder>/<name from url and checksum>` + its `.INFO` file): for URLs whose
checksum TFDS registers, the name and INFO carry the registered checksum (TFDS trusts a cached
download and does not rehash it); for the others, the file's own checksum. The real builders
then extract those files, run their `_generate_examples` and write real TFDS files with
`download_and_prepare`; read_tfds reads them back with `tfds.builder` + `as_dataset`.

xtreme_pos needs the `conllu` package to prepare; without it those tests are skipped.
"""
from __future__ import annotations

import importlib.resources
import importlib.resources.abc  # noqa: F401  (the attribute TFDS uses)
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile
import zipfile

import pytest

from xlm_jax.data.tfds_readers import read_tfds
from xlm_jax.data.xtreme_readers import Answer, PairExample, QAExample, TaggedSentence

tfds = pytest.importorskip("tensorflow_datasets")

XNLI_LANGS = "ar bg de el en es fr hi ru sw th tr ur vi zh".split()
TYDI = {"ar": "arabic", "bn": "bengali", "en": "english", "fi": "finnish", "id": "indonesian",
        "ko": "korean", "ru": "russian", "sw": "swahili", "te": "telugu"}
HAS_CONLLU = importlib.util.find_spec("conllu") is not None


# ----------------------------------------------------------------------------- raw files

def _zip(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def _tar(path, files, mode="w"):
    with tarfile.open(path, mode) as t:
        for name, data in files.items():
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def _tar_bytes(files, mode="w:gz"):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _squad(questions, title="T"):
    """SQuAD JSON: questions = [(id, question, context, [(text, start), ...])]."""
    return json.dumps({"version": "1.1", "data": [{"title": title, "paragraphs": [
        {"context": ctx, "qas": [{"id": qid, "question": q,
                                  "answers": [{"text": t, "answer_start": s} for t, s in ans]}]}
        for qid, q, ctx, ans in questions]}]}, ensure_ascii=False)


XNLI_HEADER = ("language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\t"
               "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tpromptID\tpairID\tgenre\t"
               "label1\tlabel2\tlabel3\tlabel4\tlabel5\tsentence1_tokenized\t"
               "sentence2_tokenized\tmatch")
# XNLI-1.0: pairID -> label; every pair in all 15 languages (TFDS's Translation needs them).
XNLI_PAIRS = {"test": {"1": "neutral", "2": "contradiction"}, "dev": {"3": "entailment"}}


def _xnli_text(lang, pid, side):
    return f'{lang} {side}{pid} "quoted"' if pid == "1" and side == "p" else f"{lang} {side}{pid}"


def _xnli_zip(path):
    files = {}
    for split, pairs in XNLI_PAIRS.items():
        rows = [XNLI_HEADER]
        for pid, label in pairs.items():
            for lang in XNLI_LANGS:
                rows.append("\t".join([lang, label, "", "", "", "", _xnli_text(lang, pid, "p"),
                                       _xnli_text(lang, pid, "h"), "9", pid, "fiction", label,
                                       "", "", "", "", "", "", ""]))
        files[f"XNLI-1.0/xnli.{split}.tsv"] = "\n".join(rows) + "\n"
    _zip(path, files)


# xtreme_xnli translate-train: (en premise, en hypothesis, label as in the files)
MT_PAIRS = [("The cat sat.", "A cat sits.", "entailment"),
            ("It rained.", "It was dry.", "contradictory")]


def _mt_tsv(lang):
    return "".join(f"{p}\t{h}\t{lang}: {p}\t{lang}: {h}\t{label}\n" for p, h, label in MT_PAIRS)


PAWS = {  # lang -> file -> [(id, sentence1, sentence2, label)]
    "en": {"train.tsv": [("1", "A b c.", "C b a.", "1"), ("2", "D e.", "E d.", "0")],
           "dev_2k.tsv": [("3", "F g.", "G f.", "0")],
           "test_2k.tsv": [("4", "H i.", "I h.", "1"), ("5", "J k.", "K j.", "0")]},
    "de": {"translated_train.tsv": [("6", "Ein b.", "B ein.", "1")],
           "dev_2k.tsv": [("7", "Zwei c.", "C zwei.", "1")],
           "test_2k.tsv": [("8", "Drei d.", "D drei.", "0")]},
}

PANX = {  # lang -> split -> sentences of (token, tag)
    "en": {"train": [[("Rick", "B-PER"), ("Sanchez", "I-PER"), ("lives", "O"), ("in", "O"),
                      ("Seattle", "B-LOC")],
                     [("The", "O"), ("UN", "B-ORG"), ("met", "O"), ("at", "O"),
                      ("12:30", "O")]],
           "dev": [[("Paris", "B-LOC"), ("Hilton", "I-ORG")]],
           "test": [[("Morty", "B-PER"), ("smiles", "O")]]},
    "fr": {"train": [[("Jean", "B-PER"), ("aime", "O"), ("Lyon", "B-LOC")]],
           "dev": [[("Bonjour", "O")]],
           "test": [[("Air", "B-ORG"), ("France", "I-ORG")]]},
}


def _panx_file(lang, sentences):
    return "".join("".join(f"{lang}:{tok}\t{tag}\n" for tok, tag in s) + "\n" for s in sentences)


XQUAD = {
    "en": {"test": [("x1", "Who?", "Alice met Bob.", [("Alice", 0)]),
                    ("x2", "Whom?", "Alice met Bob.", [("Bob", 10), ("Bob", 10)])]},
    "de": {"test": [("x1", "Wer?", "Alice traf Bob.", [("Alice", 0)])],
           "translate-train": [("tt1", "Was?", "Ein Haus.", [("Haus", 4)])],
           "translate-dev": [("td1", "Wo?", "Im Wald.", [("Wald", 3)])],
           "translate-test": [("te1", "Who? (de-en)", "In the wood.", [("wood", 7)])]},
}

MLQA = {
    "en": {"dev": [("m1", "What?", "A red car.", [("red car", 2)])],
           "test": [("m2", "Which?", "The blue sky.", [("blue", 4)]),
                    ("m3", "Blank?", "Nothing here.", [("", 0)])]},
    "de": {"dev": [("m4", "Was?", "Ein rotes Auto.", [("rotes", 4)])],
           "test": [("m5", "Welche?", "Der blaue Himmel.", [("blaue", 4)])]},
}

SQUAD = {"train": [("s1", "Q1?", "Context one.", [("one", 8)])],
         "dev": [("s2", "Q2?", "Context two.", [("two", 8), ("Context two", 0)])]}


def _tydi_train():
    return [("english-11-0", "Where?", "In Oslo.", [("Oslo", 3)]),
          ("english-12-1", "When?", "At noon.", [("noon", 3)]),
          ("finnish--13-0", "Missä?", "Helsingissä.", [("Helsingissä", 0)]),
          ("arabic-14-0", "أين؟", "في القاهرة.", [("القاهرة", 3)])]


def _tydi_dev(lang):
    return [(f"{TYDI[lang]}-dev-{lang}", f"q {lang}?", f"context of {lang}.", [(lang, 11)])]


def _tydi_translate(lang):
    return [(f"tt-{lang}", f"tq {lang}?", f"translated {lang}.", [(lang, 11)])]


UD = {  # UD folder -> file prefix -> split -> sentences of (form, upos)
    "UD_English-EWT": ("en_ewt-ud", {
        "train": [[("I", "PRON"), ("run", "VERB"), (".", "PUNCT")]],
        "dev": [[("Go", "VERB")]],
        "test": [[("Big", "ADJ"), ("dogs", "NOUN")]]}),
    # TFDS's config xtreme_pos_tl reads the Tamil treebank (its ta/tl names are swapped)
    "UD_Tamil-TTB": ("ta_ttb-ud", {
        "train": [[("அவன்", "PRON"), ("வந்தான்", "VERB")]],
        "dev": [[("நான்", "PRON")]],
        "test": [[("இது", "DET"), ("நல்லது", "ADJ")]]}),
    "UD_Tagalog-TRG": ("tl_trg-ud", {"test": [[("Kumain", "VERB"), ("ako", "PRON")]]}),
}


def _conllu(sentences):
    out = []
    for i, s in enumerate(sentences):
        out.append(f"# sent_id = {i}\n")
        for j, (form, upos) in enumerate(s, 1):
            out.append(f"{j}\t{form}\t{form.lower()}\t{upos}\t_\t_\t0\troot\t_\t_\n")
        out.append("\n")
    return "".join(out)


# ----------------------------------------------------------------------------- preparation

def _seed(builder, download_dir, url, path, original_fname):
    """Put `path` where DownloadManager finds a finished download of `url`."""
    from etils import epath
    from tensorflow_datasets.core.download import checksums
    from tensorflow_datasets.core.download import resource as resource_lib

    infos = checksums.get_all_url_infos()
    infos.update(type(builder).url_infos or {})
    expected = infos.get(url)
    url_info = expected or checksums.compute_url_info(path)
    dst = os.path.join(download_dir, builder.name,
                       resource_lib.get_dl_fname(url, expected.checksum if expected else None))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(path, dst)
    resource_lib.write_info_file(url=url, path=epath.Path(dst), dataset_name=builder.name,
                                 original_fname=original_fname, url_info=url_info)


def _prepare(ref, data_dir, download_dir, raw_dir, downloads):
    """downloads: {url: (file name, bytes or str)}: seeded, then the real builder prepares."""
    builder = tfds.builder(ref, data_dir=data_dir)
    for url, (fname, content) in downloads.items():
        path = os.path.join(raw_dir, f"{builder.name}-{fname}")
        if not os.path.exists(path):
            if callable(content):
                content(path)
            else:
                with open(path, "wb") as f:
                    f.write(content.encode() if isinstance(content, str) else content)
        _seed(builder, download_dir, url, path, fname)
    builder.download_and_prepare(
        download_dir=download_dir,
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    assert builder.is_prepared()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds")
    data, dl, raw = str(root / "data"), str(root / "downloads"), str(root / "raw")
    os.makedirs(raw)
    tfds.disable_progress_bar()
    with pytest.MonkeyPatch.context() as mp:
        # tensorflow_datasets 4.9.10 imports the `importlib_resources` backport when it locates
        # a builder's checksums file (download_and_prepare only), but declares it only for
        # Python < 3.9; the standard library module is the same API on 3.11.
        if importlib.util.find_spec("importlib_resources") is None:
            mp.setitem(sys.modules, "importlib_resources", importlib.resources)
        _prepare_all(data, dl, raw)
    return data


def _prepare_all(data, dl, raw):
    p = lambda ref, downloads: _prepare(ref, data, dl, raw, downloads)  # noqa: E731

    p("xnli", {"https://cims.nyu.edu/~sbowman/xnli/XNLI-1.0.zip": ("XNLI-1.0.zip", _xnli_zip)})
    p("xtreme_xnli", {
        "https://storage.googleapis.com/xtreme_translations/XNLI/translate-train/"
        f"en-{lang}-translated.tsv": (f"en-{lang}-translated.tsv", _mt_tsv(lang))
        for lang in XNLI_LANGS if lang != "en"})

    def paws(path):
        _tar(path, {f"x-final/{lang}/{name}":
                    "id\tsentence1\tsentence2\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows)
                    for lang, files in PAWS.items() for name, rows in files.items()}, "w:gz")
    for lang in PAWS:
        p(f"paws_x_wiki/{lang}", {"https://storage.googleapis.com/paws/pawsx/x-final.tar.gz":
                                  ("x-final.tar.gz", paws)})

    def panx(path):
        _tar(path, {f"{lang}.tar.gz": _tar_bytes({s: _panx_file(lang, sents)
                                                  for s, sents in splits.items()})
                    for lang, splits in PANX.items()})
    for lang in PANX:
        p(f"wikiann/{lang}", {"https://www.dropbox.com/s/12h3qqog6q4bjve/panx_dataset.tar?dl=1":
                              ("panx_dataset.tar", panx)})

    xq = "https://github.com/deepmind/xquad/raw/master/xquad.{}.json"
    mt = "https://storage.googleapis.com/xtreme_translations/"
    p("xquad/en", {xq.format("en"): ("xquad.en.json", _squad(XQUAD["en"]["test"]))})
    de = XQUAD["de"]
    p("xquad/de", {
        xq.format("de"): ("xquad.de.json", _squad(de["test"])),
        mt + "SQuAD/translate-train/squad.translate.train.en-de.json":
            ("squad.translate.train.en-de.json", _squad(de["translate-train"])),
        mt + "SQuAD/translate-dev/squad.translate.dev.en-de.json":
            ("squad.translate.dev.en-de.json", _squad(de["translate-dev"])),
        mt + "XQuAD/translate-test/xquad.translate.test.de-en.json":
            ("xquad.translate.test.de-en.json", _squad(de["translate-test"]))})

    def mlqa(path):
        _zip(path, {f"MLQA_V1/{s}/{s}-context-{lang}-question-{lang}.json": _squad(qs)
                    for lang, splits in MLQA.items() for s, qs in splits.items()})
    for lang in MLQA:
        p(f"mlqa/{lang}",
          {"https://dl.fbaipublicfiles.com/MLQA/MLQA_V1.zip": ("MLQA_V1.zip", mlqa)})

    gold = "https://storage.googleapis.com/tydiqa/v1.1/tydiqa-goldp-v1.1-"
    dev_all = [q for lang in TYDI for q in _tydi_dev(lang)]
    tydi = {
        gold + "train.json": ("tydiqa-goldp-v1.1-train.json", _squad(_tydi_train())),
        gold + "dev.json": ("tydiqa-goldp-v1.1-dev.json", _squad(dev_all)),
        gold + "dev.tgz": ("tydiqa-goldp-v1.1-dev.tgz", _tar_bytes({
            f"tydiqa-goldp-v1.1-dev/tydiqa-goldp-dev-{name}.json": _squad(_tydi_dev(lang))
            for lang, name in TYDI.items()}))}
    for lang in TYDI:
        if lang != "en":
            name = f"tydiqa.translate.train.en-{lang}.json"
            url = mt + "TyDiQA-GoldP/translate-train/" + name
            tydi[url] = (name, _squad(_tydi_translate(lang)))
    p("tydi_qa/goldp", tydi)

    squad = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
    p("squad/v1.1", {squad + "train-v1.1.json": ("train-v1.1.json", _squad(SQUAD["train"])),
                     squad + "dev-v1.1.json": ("dev-v1.1.json", _squad(SQUAD["dev"]))})

    if HAS_CONLLU:
        def ud(path):
            _tar(path, {f"ud-treebanks-v2.5/{folder}/{prefix}-{s}.conllu": _conllu(sents)
                        for folder, (prefix, splits) in UD.items()
                        for s, sents in splits.items()}, "w:gz")
        url = ("https://lindat.mff.cuni.cz/repository/xmlui/bitstream/handle/11234/1-3105/"
               "ud-treebanks-v2.5.tgz")
        for config in ("xtreme_pos_en", "xtreme_pos_tl", "xtreme_pos_ta"):
            p(f"xtreme_pos/{config}", {url: ("ud-treebanks-v2.5.tgz", ud)})


# ----------------------------------------------------------------------------- expectations

def _qa(questions, lang):
    return [QAExample(qid, q, ctx, tuple(Answer(t, s) for t, s in ans if (t, s) != ("", 0)), lang)
            for qid, q, ctx, ans in questions]


def _sorted(examples):
    return sorted(examples, key=repr)


# ----------------------------------------------------------------------------- tests

def test_xnli_dev_test_all_languages(data_dir):
    test = read_tfds("xnli", "test", data_dir=data_dir)
    assert list(test) == XNLI_LANGS
    for lang in XNLI_LANGS:
        assert _sorted(test[lang]) == _sorted(
            PairExample(_xnli_text(lang, pid, "p"), _xnli_text(lang, pid, "h"), label, lang)
            for pid, label in XNLI_PAIRS["test"].items())
    dev = read_tfds("xnli", "dev", "fr, sw", data_dir=data_dir)
    assert dev == {"fr": [PairExample("fr p3", "fr h3", "entailment", "fr")],
                   "sw": [PairExample("sw p3", "sw h3", "entailment", "sw")]}
    assert read_tfds("xnli", "validation", ["sw"], data_dir=data_dir) == {"sw": dev["sw"]}


def test_xnli_train_is_xtreme_translate_train(data_dir):
    train = read_tfds("xnli", "train", ["en", "de"], data_dir=data_dir)
    # 'contradictory' (the translate-train files' spelling) reads as XTREME's 'contradiction'
    labels = {"entailment": "entailment", "contradictory": "contradiction"}
    assert _sorted(train["en"]) == _sorted(PairExample(p, h, labels[lab], "en")
                                           for p, h, lab in MT_PAIRS)
    assert _sorted(train["de"]) == _sorted(PairExample(f"de: {p}", f"de: {h}", labels[lab], "de")
                                           for p, h, lab in MT_PAIRS)


def test_pawsx_labels_are_0_1(data_dir):
    for split, fname in (("train", None), ("dev", "dev_2k.tsv"), ("test", "test_2k.tsv")):
        got = read_tfds("pawsx", split, data_dir=data_dir)  # every prepared language: de, en
        assert list(got) == ["de", "en"]
        for lang in got:
            name = fname or ("train.tsv" if lang == "en" else "translated_train.tsv")
            assert _sorted(got[lang]) == _sorted(PairExample(s1, s2, label, lang)
                                                 for _, s1, s2, label in PAWS[lang][name])
    assert {ex.label for ex in read_tfds("pawsx", "train", "en", data_dir)["en"]} == {"0", "1"}


def test_panx_tags(data_dir):
    for split, raw in (("train", "train"), ("dev", "dev"), ("validation", "dev"), ("test", "test")):
        got = read_tfds("panx", split, ["en", "fr"], data_dir=data_dir)
        for lang in ("en", "fr"):
            assert _sorted(got[lang]) == _sorted(
                TaggedSentence(tuple(t for t, _ in s), tuple(tag for _, tag in s), lang)
                for s in PANX[lang][raw])
    assert list(read_tfds("panx", "test", data_dir=data_dir)) == ["en", "fr"]


def test_xquad_and_translate_splits(data_dir):
    got = read_tfds("xquad", "test", data_dir=data_dir)
    assert list(got) == ["de", "en"]
    for lang in got:
        assert _sorted(got[lang]) == _sorted(_qa(XQUAD[lang]["test"], lang))
    for split in ("translate-train", "translate-dev", "translate-test"):
        assert read_tfds("xquad", split, ["de"], data_dir) == {"de": _qa(XQUAD["de"][split], "de")}


def test_mlqa_drops_blanked_answers(data_dir):
    test = read_tfds("mlqa", "test", ["en"], data_dir=data_dir)
    assert _sorted(test["en"]) == _sorted(_qa(MLQA["en"]["test"], "en"))
    assert [ex.answers for ex in test["en"] if ex.id == "m3"] == [()]
    dev = read_tfds("mlqa", "dev", data_dir=data_dir)
    assert {lang: _sorted(v) for lang, v in dev.items()} == {
        lang: _sorted(_qa(MLQA[lang]["dev"], lang)) for lang in ("de", "en")}


def test_tydiqa_train_split_by_id_language(data_dir):
    train = read_tfds("tydiqa", "train", ["en", "fi", "ar"], data_dir=data_dir)
    raw = {q[0]: q for q in _tydi_train()}
    assert {lang: sorted(ex.id for ex in v) for lang, v in train.items()} == {
        "en": ["english-11-0", "english-12-1"], "fi": ["finnish--13-0"], "ar": ["arabic-14-0"]}
    assert train["ar"] == _qa([raw["arabic-14-0"]], "ar")
    with pytest.raises(ValueError, match=r"^TFDS dataset tydi_qa/goldp split train has no "
                                         r"question of language 'sw'"):
        read_tfds("tydiqa", "train", ["sw"], data_dir=data_dir)


def test_tydiqa_dev_per_language_and_translate_train(data_dir):
    dev = read_tfds("tydiqa", "dev", data_dir=data_dir)
    assert list(dev) == sorted(TYDI)
    for lang in TYDI:
        assert dev[lang] == _qa(_tydi_dev(lang), lang)
    assert read_tfds("tydiqa", "translate-train", ["ko"], data_dir) == {
        "ko": _qa(_tydi_translate("ko"), "ko")}


def test_squad(data_dir):
    assert read_tfds("squad", "train", data_dir=data_dir) == {"en": _qa(SQUAD["train"], "en")}
    assert read_tfds("squad", "dev", data_dir=data_dir) == {"en": _qa(SQUAD["dev"], "en")}


@pytest.mark.skipif(not HAS_CONLLU, reason="preparing xtreme_pos needs the conllu package")
def test_udpos_with_tamil_tagalog_fix(data_dir):
    def expect(folder, split, lang):
        return [TaggedSentence(tuple(f for f, _ in s), tuple(u for _, u in s), lang)
                for s in UD[folder][1][split]]
    got = read_tfds("udpos", "dev", ["en", "ta"], data_dir=data_dir)
    assert got == {"en": expect("UD_English-EWT", "dev", "en"),
                   "ta": expect("UD_Tamil-TTB", "dev", "ta")}
    assert read_tfds("udpos", "test", ["tl"], data_dir) == {
        "tl": expect("UD_Tagalog-TRG", "test", "tl")}
    assert list(read_tfds("udpos", "test", data_dir=data_dir)) == ["en", "ta", "tl"]
    with pytest.raises(ValueError, match=r"xtreme_pos/xtreme_pos_ta .* has no split 'train'"):
        read_tfds("udpos", "train", ["tl"], data_dir)


# ----------------------------------------------------------------------------- errors

def test_unprepared_data_dir(tmp_path, data_dir):
    empty = str(tmp_path / "empty")
    with pytest.raises(ValueError) as e:
        read_tfds("xnli", "dev", ["en"], data_dir=empty)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"TFDS dataset xnli (version 1.1.0) is not prepared in data_dir {empty}")
    assert f"tfds build xnli --data_dir={empty}" in msg
    # a language whose config was not prepared, next to prepared ones
    with pytest.raises(ValueError, match=rf"^TFDS dataset paws_x_wiki/fr .*not prepared in "
                                         rf"data_dir {data_dir}: .*tfds build paws_x_wiki/fr"):
        read_tfds("pawsx", "dev", ["en", "fr"], data_dir=data_dir)
    with pytest.raises(ValueError, match=r"^no TFDS wikiann config with a 'test' split is prepared "
                                         r"in data_dir .*empty: .*tfds build wikiann/en"):
        read_tfds("panx", "test", data_dir=empty)


def test_unknown_task_split_language(data_dir):
    with pytest.raises(ValueError, match=r"^unknown TFDS task 'nope' \(expected one of xnli, "):
        read_tfds("nope", "test", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"^task xquad has no split 'dev' in TFDS "
                                         r"\(expected one of test, translate-train"):
        read_tfds("xquad", "dev", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"^unknown language 'xx' for task xnli split test in TFDS "
                                         r"xnli \(expected one of ar, bg, "):
        read_tfds("xnli", "test", ["en", "xx"], data_dir=data_dir)
    with pytest.raises(ValueError, match=r"^unknown language 'en' for task tydiqa split "
                                         r"translate-train"):
        read_tfds("tydiqa", "translate-train", ["en"], data_dir=data_dir)
    with pytest.raises(ValueError, match=r"^unknown language 'ja' for task mlqa"):
        read_tfds("mlqa", "test", "ja", data_dir=data_dir)


def test_finetuning_reads_the_same_examples_from_tfds(data_dir, gin_isolated):
    """`FinetuneTask(source="tfds")`: the task's train/dev/test come from the prepared TFDS
    datasets (zero-shot: English train and dev, every language's test). FinetuneTask is
    gin-configurable: calling it records gin's operative config, which `gin_isolated` puts
    back."""
    from xlm_jax.finetune import tasks as tasks_lib

    data = tasks_lib.load(tasks_lib.FinetuneTask(xtreme_task="pawsx", data_dir=data_dir,
                                                 source="tfds", labels=("0", "1")))
    assert list(data.train) == ["en"] and list(data.dev) == ["en"]
    assert sorted(data.test) == ["de", "en"]
    assert _sorted(data.test["de"]) == _sorted(read_tfds("pawsx", "test", "de", data_dir)["de"])
    assert _sorted(data.train["en"]) == _sorted(
        PairExample(s1, s2, label, "en") for _, s1, s2, label in PAWS["en"]["train.tsv"])
