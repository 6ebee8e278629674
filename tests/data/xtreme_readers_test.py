"""XTREME dataset readers: exact parses of small files in each format (XNLI/PAWS-X TSV as
`csv.writer` writes it, PAN-X/UD-POS token<TAB>label, CoNLL, CoNLL-U, SQuAD JSON), every input
error (file and line in the message), and the discovery of the XTREME download layout."""
import ast
import csv
import json
import os
import sys

import pytest

from xlm_jax.data import xtreme_readers as xr
from xlm_jax.data.xtreme_readers import Answer, PairExample, QAExample, TaggedSentence


def _write(path, text: str | bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def _write_tsv(path, rows) -> str:
    """As XTREME's utils_preprocess writes them: csv.writer, tab-delimited (CRLF line ends)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t").writerows(rows)
    return str(path)


def _squad(paragraphs) -> dict:
    """SQuAD v1.1 JSON: paragraphs = [(context, [(id, question, [(text, start), ...]), ...])]."""
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": c, "qas": [
            {"id": i, "question": q, "answers": [{"text": t, "answer_start": s} for t, s in a]}
            for i, q, a in qas]}
        for c, qas in paragraphs]}]}


def _raises(fn, *parts):
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# ----------------------------------------------------------------------------- XNLI / PAWS-X

XNLI_DE = [
    ["Der Mann schläft.", "Ein Mann ruht sich aus.", "entailment"],
    ['"Komm her", sagte sie.', "Sie blieb stumm.", "contradiction"],
    ["Er kauft Brot.", "Er kauft Brot für seine Mutter.", "neutral"],
]


def test_read_pair_tsv_xnli_exact_with_csv_quoting_and_crlf(tmp_path):
    path = _write_tsv(tmp_path / "xnli" / "dev-de.tsv", XNLI_DE)
    with open(path, "rb") as f:
        raw = f.read()
    assert b"\r\n" in raw and b'"""Komm her"", sagte sie."' in raw  # really the quoted form
    got = xr.read_pair_tsv(path, "de", xr.XNLI_LABELS)
    assert got == [PairExample(a, b, label, "de") for a, b, label in XNLI_DE]


def test_read_pair_tsv_unlabeled_test_file_and_pawsx(tmp_path):
    path = _write_tsv(tmp_path / "test-zh.tsv", [["他在读书。", "他正在看书。"], ["天气很好。", "下雨了。"]])
    assert xr.read_pair_tsv(path, "zh", xr.XNLI_LABELS) == [
        PairExample("他在读书。", "他正在看书。", None, "zh"), PairExample("天气很好。", "下雨了。", None, "zh")]
    path = _write_tsv(tmp_path / "dev-ja.tsv",
                      [["東京は大きい。", "東京は小さい。", "0"], ["猫が寝ている。", "寝ているのは猫だ。", "1"]])
    assert [e.label for e in xr.read_pair_tsv(path, "ja", xr.PAWSX_LABELS)] == ["0", "1"]
    # a UTF-8 byte order mark is dropped
    path = _write(tmp_path / "bom.tsv", "\ufeffΗ γάτα κοιμάται.\tΗ γάτα ξυπνά.\tcontradiction\n")
    assert xr.read_pair_tsv(path, "el") == [
        PairExample("Η γάτα κοιμάται.", "Η γάτα ξυπνά.", "contradiction", "el")]


def test_read_pair_tsv_errors(tmp_path):
    good = "Hola.\tAdiós.\tneutral\n"
    path = _write(tmp_path / "cols.tsv", good + "Hola.\tAdiós.\tneutral\textra\n")
    _raises(lambda: xr.read_pair_tsv(path, "es"), "cols.tsv:2:", "expected 3", "got 4")
    path = _write(tmp_path / "one.tsv", "sólo una columna\n")
    _raises(lambda: xr.read_pair_tsv(path, "es"), "one.tsv:1:", "got 1")
    path = _write(tmp_path / "mixed.tsv", good + good + "Hola.\tAdiós.\n")
    _raises(lambda: xr.read_pair_tsv(path, "es"), "mixed.tsv:3:", "expected 3", "got 2")
    path = _write(tmp_path / "label.tsv", good + "Hola.\tAdiós.\tcontradictory\n")
    _raises(lambda: xr.read_pair_tsv(path, "es", xr.XNLI_LABELS), "label.tsv:2:", "'contradictory'",
            "contradiction, entailment, neutral")
    path = _write(tmp_path / "paws.tsv", "A.\tB.\t1\nC.\tD.\t2\n")
    _raises(lambda: xr.read_pair_tsv(path, "en", xr.PAWSX_LABELS), "paws.tsv:2:", "'2'")
    path = _write(tmp_path / "quote.tsv", good + '"unclosed" x\tB.\tneutral\n')
    _raises(lambda: xr.read_pair_tsv(path, "es"), "quote.tsv:2:", "quoting")
    path = _write(tmp_path / "utf.tsv", good.encode() + good.encode() + b"Caf\xe9.\tB.\tneutral\n")
    _raises(lambda: xr.read_pair_tsv(path, "es"), "utf.tsv:3:", "invalid UTF-8", "0xe9")
    path = _write(tmp_path / "empty.tsv", "")
    _raises(lambda: xr.read_pair_tsv(path, "es"), "empty.tsv", "empty")


# ----------------------------------------------------------------------------- tagging

PANX_DE = "Angela\tB-PER\nMerkel\tI-PER\nbesucht\tO\nParis\tB-LOC\n\nDie\tO\nUNO\tB-ORG\ntagt\tO\n\n\n"


def test_read_tagged_xtreme_exact(tmp_path):
    path = _write(tmp_path / "dev-de.tsv", PANX_DE)
    assert xr.read_tagged(path, "de", labels=xr.PANX_LABELS) == [
        TaggedSentence(("Angela", "Merkel", "besucht", "Paris"), ("B-PER", "I-PER", "O", "B-LOC"), "de"),
        TaggedSentence(("Die", "UNO", "tagt"), ("O", "B-ORG", "O"), "de")]
    path = _write(tmp_path / "test-hi.tsv", "नरेंद्र\nमोदी\n\nदिल्ली\n")  # XTREME test files: tokens only
    assert xr.read_tagged(path, "hi") == [TaggedSentence(("नरेंद्र", "मोदी"), None, "hi"),
                                          TaggedSentence(("दिल्ली",), None, "hi")]
    path = _write(tmp_path / "raw", "fr:Jacques\tB-PER\nfr:Chirac\tI-PER\n")  # raw PAN-X: `lang:` prefix
    assert xr.read_tagged(path, "fr", strip_lang_prefix=True) == [
        TaggedSentence(("Jacques", "Chirac"), ("B-PER", "I-PER"), "fr")]
    # CRLF line ends (a file edited on Windows) leave no '\r' in the labels
    path = _write(tmp_path / "crlf.tsv", PANX_DE.replace("\n", "\r\n"))
    assert xr.read_tagged(path, "de", labels=xr.PANX_LABELS) == xr.read_tagged(tmp_path / "dev-de.tsv", "de")
    # a token holding U+2028 stays one token (str.splitlines would split it)
    path = _write(tmp_path / "sep.tsv", "a\u2028b\tO\n")
    assert xr.read_tagged(path, "en")[0].tokens == ("a\u2028b",)


def test_read_tagged_xtreme_errors(tmp_path):
    path = _write(tmp_path / "mixed.tsv", "Roma\tB-LOC\nè\n")
    _raises(lambda: xr.read_tagged(path, "it"), "mixed.tsv:2:", "no label")
    path = _write(tmp_path / "three.tsv", "Roma\tB-LOC\n\nè\tO\tx\n")
    _raises(lambda: xr.read_tagged(path, "it"), "three.tsv:3:", "3 tab-separated")
    path = _write(tmp_path / "lab.tsv", "Roma\tB-LOC\nè\tB-CITY\n")
    _raises(lambda: xr.read_tagged(path, "it", labels=xr.PANX_LABELS), "lab.tsv:2:", "'B-CITY'")
    path = _write(tmp_path / "prefix", "it:Roma\tB-LOC\nè\tO\n")
    _raises(lambda: xr.read_tagged(path, "it", strip_lang_prefix=True), "prefix:2:", "'it:'")
    path = _write(tmp_path / "utf.tsv", b"Roma\tB-LOC\n\n\xff\xfe\tO\n")
    _raises(lambda: xr.read_tagged(path, "it"), "utf.tsv:3:", "invalid UTF-8")
    path = _write(tmp_path / "blank.tsv", "\n\n")
    _raises(lambda: xr.read_tagged(path, "it"), "blank.tsv", "empty")
    path = _write(tmp_path / "doc.tsv", "-DOCSTART-\tO\n\n")
    _raises(lambda: xr.read_tagged(path, "it"), "doc.tsv", "no sentences")
    _raises(lambda: xr.read_tagged(path, "it", fmt="iob"), "'iob'")


def test_read_tagged_conll(tmp_path):
    text = ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
            "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
    path = _write(tmp_path / "eng.train", text)
    assert xr.read_tagged(path, "en", fmt="conll") == [
        TaggedSentence(("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC"), "en"),
        TaggedSentence(("Peter", "Blackburn"), ("B-PER", "I-PER"), "en")]
    path = _write(tmp_path / "nolabel.conll", "Peter\tB-PER\nBlackburn\n")
    _raises(lambda: xr.read_tagged(path, "en", fmt="conll"), "nolabel.conll:2:", "no label")


CONLLU = """# sent_id = 1
# text = Vámonos al mar.
1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_
1\tVamos\tir\tVERB\t_\t_\t0\troot\t_\t_
2\tnos\tnosotros\tPRON\t_\t_\t1\tobj\t_\t_
3-4\tal\t_\t_\t_\t_\t_\t_\t_\t_
3\ta\ta\tADP\t_\t_\t5\tcase\t_\t_
4\tel\tel\tDET\t_\t_\t5\tdet\t_\t_
5\tmar\tmar\tNOUN\t_\t_\t1\tobl\t_\t_
5.1\tvamos\tir\tVERB\t_\t_\t_\t1:conj\t_\t_
6\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_

# sent_id = 2
1\tHola\thola\tINTJ\t_\t_\t0\troot\t_\t_
"""


def test_read_tagged_conllu(tmp_path):
    path = _write(tmp_path / "es_ancora-ud-dev.conllu", CONLLU)
    assert xr.read_tagged(path, "es", fmt="conllu") == [
        TaggedSentence(("Vamos", "nos", "a", "el", "mar", "."),
                       ("VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"), "es"),
        TaggedSentence(("Hola",), ("INTJ",), "es")]
    path = _write(tmp_path / "cols.conllu", "# c\n1\tHola\thola\tINTJ\t_\n")
    _raises(lambda: xr.read_tagged(path, "es", fmt="conllu"), "cols.conllu:2:", "10", "got 5")
    path = _write(tmp_path / "upos.conllu", CONLLU.replace("NOUN", "NN"))
    _raises(lambda: xr.read_tagged(path, "es", fmt="conllu"), "upos.conllu:9:", "'NN'")


# ----------------------------------------------------------------------------- QA

AR_CONTEXT = "القاهرة هي عاصمة مصر. يعيش فيها أكثر من عشرين مليون شخص."
VI_CONTEXT = "Hà Nội là thủ đô của Việt Nam.\nSông Hồng chảy qua thành phố."


def test_read_squad_exact(tmp_path):
    data = _squad([(AR_CONTEXT, [("q1", "ما هي عاصمة مصر؟", [("القاهرة", 0), ("القاهرة", 0)])]),
                   (VI_CONTEXT, [("q2", "Sông nào chảy qua Hà Nội?", [("Sông Hồng", 31)]),
                                 ("q3", "Thủ đô?", [("", 0)])])])  # XTREME's blanked test answer
    path = _write(tmp_path / "xquad.ar.json", json.dumps(data, ensure_ascii=False, indent=1))
    assert xr.read_squad(path, "ar") == [
        QAExample("q1", "ما هي عاصمة مصر؟", AR_CONTEXT, (Answer("القاهرة", 0), Answer("القاهرة", 0)), "ar"),
        QAExample("q2", "Sông nào chảy qua Hà Nội?", VI_CONTEXT, (Answer("Sông Hồng", 31),), "ar"),
        QAExample("q3", "Thủ đô?", VI_CONTEXT, (), "ar")]


def test_read_squad_errors(tmp_path):
    bad = _squad([(AR_CONTEXT, [("q-good", "?", [("مصر", 17)]), ("q-bad", "?", [("مصر", 16)])])])
    path = _write(tmp_path / "bad.json", json.dumps(bad))
    _raises(lambda: xr.read_squad(path, "ar"), "bad.json", "'q-bad'", "answer_start 16")
    path = _write(tmp_path / "syntax.json", '{\n "version": "1.1",\n "data": [\n  {,}\n ]\n}\n')
    _raises(lambda: xr.read_squad(path, "en"), "syntax.json:4:", "invalid JSON")
    path = _write(tmp_path / "utf.json", b'{\n "data": [\n  "caf\xc3"\n ]\n}\n')
    _raises(lambda: xr.read_squad(path, "en"), "utf.json:3:", "invalid UTF-8")
    path = _write(tmp_path / "shape.json", json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}))
    _raises(lambda: xr.read_squad(path, "en"), "shape.json", "data[0].paragraphs[0]", "'context'")
    path = _write(tmp_path / "nothing.json", json.dumps({"version": "1.1", "data": []}))
    _raises(lambda: xr.read_squad(path, "en"), "nothing.json", "no questions")
    path = _write(tmp_path / "empty.json", " \n")
    _raises(lambda: xr.read_squad(path, "en"), "empty.json", "empty")


# ----------------------------------------------------------------------------- layout discovery

def _download_tree(root) -> None:
    """A miniature of XTREME's `download/` folder, plus files the readers must ignore."""
    _write_tsv(root / "xnli" / "train-en.tsv", [["A man sleeps.", "A man rests.", "entailment"]])
    _write_tsv(root / "xnli" / "dev-de.tsv", XNLI_DE)
    _write_tsv(root / "xnli" / "dev-sw.tsv", [["Mtoto analala.", "Mtoto yuko macho.", "contradiction"]])
    _write_tsv(root / "xnli" / "test-de.tsv", [r[:2] for r in XNLI_DE])
    _write_tsv(root / "pawsx" / "dev-ko.tsv", [["서울은 크다.", "서울은 작다.", "0"]])
    _write(root / "panx" / "dev-de.tsv", PANX_DE)
    _write(root / "udpos" / "dev-tr.tsv", "Ali\tPROPN\nokula\tNOUN\ngitti\tVERB\n.\tPUNCT\n\n")
    _write(root / "udpos" / "dev-tr.mt.tsv", "ignored\n")
    squad = _squad([("Paris is in France.", [("s1", "Where?", [("France", 12)])])])
    _write(root / "squad" / "train-v1.1.json", json.dumps(squad))
    qa = json.dumps(_squad([(AR_CONTEXT, [("x1", "?", [("", 0)])])]), ensure_ascii=False)
    for lang in ("ar", "zh"):
        _write(root / "xquad" / f"xquad.{lang}.json", qa)
    _write(root / "mlqa" / "MLQA_V1" / "test" / "test-context-ar-question-ar.json", qa)
    # cross-lingual pairs are not XTREME's MLQA test sets: not listed
    _write(root / "mlqa" / "MLQA_V1" / "test" / "test-context-de-question-ar.json", qa)
    _write(root / "mlqa" / "MLQA_V1" / "dev" / "dev-context-vi-question-vi.json", qa)
    train = root / "tydiqa" / "tydiqa-goldp-v1.1-train"
    _write(train / "tydiqa.goldp.fi.train.json", qa)
    _write(train / "tydiqa.sw.train.json", qa)  # the name scripts/train_qa.sh uses
    _write(train / "tydiqa.fi.train.json", qa)  # ignored: tydiqa.goldp.fi.train.json is preferred
    _write(train / "tydiqa-goldp-v1.1-train.json", qa)  # the undivided file: not a language
    _write(root / "tydiqa" / "tydiqa-goldp-v1.1-dev" / "tydiqa.goldp.ko.dev.json", qa)


def test_task_files_discovers_the_xtreme_layout(tmp_path):
    _download_tree(tmp_path)
    j = os.path.join
    r = str(tmp_path)
    assert xr.task_files(r, "xnli", "dev") == {"de": j(r, "xnli", "dev-de.tsv"),
                                               "sw": j(r, "xnli", "dev-sw.tsv")}
    assert xr.task_files(r, "xnli", "train") == {"en": j(r, "xnli", "train-en.tsv")}
    assert xr.task_files(r, "pawsx", "test") == {}
    assert xr.task_files(r, "udpos", "dev") == {"tr": j(r, "udpos", "dev-tr.tsv")}
    assert xr.task_files(r, "squad", "train") == {"en": j(r, "squad", "train-v1.1.json")}
    assert xr.task_files(r, "xquad", "test") == {"ar": j(r, "xquad", "xquad.ar.json"),
                                                 "zh": j(r, "xquad", "xquad.zh.json")}
    mlqa = j(r, "mlqa", "MLQA_V1")
    assert xr.task_files(r, "mlqa", "test") == {"ar": j(mlqa, "test", "test-context-ar-question-ar.json")}
    assert xr.task_files(r, "mlqa", "dev") == {"vi": j(mlqa, "dev", "dev-context-vi-question-vi.json")}
    train = j(r, "tydiqa", "tydiqa-goldp-v1.1-train")
    assert xr.task_files(r, "tydiqa", "train") == {"fi": j(train, "tydiqa.goldp.fi.train.json"),
                                                   "sw": j(train, "tydiqa.sw.train.json")}
    assert list(xr.task_files(r, "tydiqa", "dev")) == ["ko"]
    _raises(lambda: xr.task_files(r, "xquad", "dev"), "xquad", "'dev'", "test")
    # TyDiQA's XTREME "test" set is its dev folder: the error says so (and only for TyDiQA)
    _raises(lambda: xr.task_files(r, "tydiqa", "test"), "'test'", "goldp dev folder", "'dev'")
    assert "TyDiQA" not in _raises(lambda: xr.task_files(r, "squad", "test"), "'test'")
    _raises(lambda: xr.task_files(r, "xcopa", "test"), "'xcopa'")
    _raises(lambda: xr.task_files(str(tmp_path / "nowhere"), "panx", "dev"), os.path.join("nowhere", "panx"))


def test_read_task(tmp_path):
    _download_tree(tmp_path)
    r = str(tmp_path)
    got = xr.read_task(r, "xnli", "dev")
    assert list(got) == ["de", "sw"] and got["de"] == [PairExample(a, b, c, "de") for a, b, c in XNLI_DE]
    assert xr.read_task(r, "xnli", "test", "de")["de"][0] == PairExample(*XNLI_DE[0][:2], None, "de")
    assert xr.read_task(r, "udpos", "dev", ["tr"])["tr"] == [
        TaggedSentence(("Ali", "okula", "gitti", "."), ("PROPN", "NOUN", "VERB", "PUNCT"), "tr")]
    assert xr.read_task(r, "panx", "dev")["de"][1].labels == ("O", "B-ORG", "O")
    assert xr.read_task(r, "squad", "train")["en"][0].answers == (Answer("France", 12),)
    assert xr.read_task(r, "mlqa", "test")["ar"][0] == QAExample("x1", "?", AR_CONTEXT, (), "ar")
    msg = _raises(lambda: xr.read_task(r, "xnli", "dev", ["de", "fr"]), "xnli", "dev", "'fr'",
                  os.path.join(r, "xnli"), "languages found: de, sw")
    assert "expected dev-{lang}.tsv" in msg
    _raises(lambda: xr.read_task(r, "pawsx", "test"), "pawsx", "test", os.path.join(r, "pawsx"))
    # the task's label set is enforced
    _write_tsv(tmp_path / "pawsx" / "dev-ko.tsv", [["서울은 크다.", "서울은 작다.", "0"], ["a", "b", "yes"]])
    _raises(lambda: xr.read_task(r, "pawsx", "dev"), "dev-ko.tsv:2:", "'yes'")


# ----------------------------------------------------------------------------- label sets

def test_check_label_sets(tmp_path):
    train = xr.read_tagged(_write(tmp_path / "train-en.tsv", "John\tB-PER\nlives\tO\n"), "en")
    dev = xr.read_tagged(_write(tmp_path / "dev-de.tsv", PANX_DE), "de")
    assert xr.label_set(train) == {"B-PER", "O"}
    xr.check_label_sets(xr.label_set(train), {"O"}, "train-en.tsv", "dev-de.tsv")  # a subset passes
    _raises(lambda: xr.check_label_sets(xr.label_set(train), xr.label_set(dev), "train-en.tsv", "dev-de.tsv"),
            "'B-LOC'", "'B-ORG'", "'I-PER'", "train-en.tsv", "dev-de.tsv")
    pairs = [PairExample("a", "b", "0", "en"), PairExample("c", "d", None, "en")]
    assert xr.label_set(pairs) == {"0"}


def test_module_imports_only_the_standard_library():
    with open(xr.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names and names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)
