"""xlm_jax.evaluation.metrics: SQuAD/MLQA, seqeval, AER and BUCC scores on hand-made cases whose
expected values are worked out by hand in the comments, plus the CLI (the JSON it prints, and
one `error: ...` line with exit status 2 on bad input)."""
import json
import os
import subprocess
import sys

import pytest

from xlm_jax.evaluation.metrics import (aer_scores, bucc_scores, extract_chunks, mlqa_evaluate,
                                        mlqa_normalize_answer, normalize_answer, parse_pairs,
                                        seqeval_files, seqeval_scores, squad_evaluate)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "xlm_jax.evaluation.metrics", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _assert_cli_error(r, *fragments):
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    # bad input: `error: ...`; a usage error: `PROG: error: ... (--help lists every flag)`
    assert len(lines) == 1 and lines[0].startswith(
        ("error: ", "python -m xlm_jax.evaluation.metrics")) and "error: " in lines[0], r.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def _dataset(qas):
    """A SQuAD-format dataset, one paragraph holding `qas` = [(id, [gold texts])]."""
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": qid, "question": "q?", "answers": [{"text": t, "answer_start": 0} for t in golds]}
        for qid, golds in qas]}]}]}


# ---------------------------------------------------------------- SQuAD v1.1

SQUAD = _dataset([
    ("q1", ["The Eiffel Tower!"]),
    ("q2", ["Denver Broncos", "Broncos team"]),
    ("q3", ["1990"]),
    ("q4", ["Santa Clara, California", "Levi's Stadium"]),
])
SQUAD_PRED = {"q1": "eiffel tower", "q2": "Denver Broncos win", "q4": "Levi's Stadium."}


def test_squad_normalization_drops_case_punctuation_articles_and_spaces():
    assert normalize_answer("The Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("  A  cat,   an\tapple ") == "cat apple"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("¿Qué?") == "¿qué"  # SQuAD's punctuation is ASCII only


def test_squad_scores_max_over_gold_answers_and_missing_counts_zero():
    # q1: "eiffel tower" == "eiffel tower"                    EM 1, F1 1
    # q2: vs "denver broncos": same 2, P 2/3, R 1 -> F1 0.8;
    #     vs "broncos team": same 1, P 1/3, R 1/2 -> F1 0.4   EM 0, F1 max 0.8
    # q3: no prediction                                       EM 0, F1 0 (missing 1)
    # q4: "levis stadium" == the 2nd gold "levis stadium"     EM 1, F1 1
    # EM = 100 * 2/4 = 50; F1 = 100 * (1 + 0.8 + 0 + 1)/4 = 70
    r = squad_evaluate(SQUAD["data"], SQUAD_PRED)
    assert r == {"exact_match": 50.0, "f1": pytest.approx(70.0), "total": 4, "missing": 1}
    assert squad_evaluate(SQUAD, SQUAD_PRED) == r  # the whole file object works too


def test_squad_f1_counts_repeated_tokens_as_a_multiset():
    # "cat cat dog" vs "cat dog dog": shared min(2,1) cat + min(1,2) dog = 2; P = R = 2/3
    r = squad_evaluate(_dataset([("a", ["cat dog dog"])]), {"a": "cat cat dog"})
    assert r["f1"] == pytest.approx(100 * 2 / 3) and r["exact_match"] == 0.0


def test_squad_empty_normalized_answers_match_exactly_but_have_zero_f1():
    # official v1.1: "" == "" is an exact match, but F1 is 0 when no token is shared
    r = squad_evaluate(_dataset([("a", ["a"])]), {"a": "The"})
    assert r["exact_match"] == 100.0 and r["f1"] == 0.0


def test_squad_unknown_prediction_id_is_an_error_naming_file_and_id():
    with pytest.raises(ValueError, match=r"preds\.json: prediction id 'q9' is not a question"):
        squad_evaluate(SQUAD, {"q1": "x", "q9": "y"}, pred_name="preds.json")


# ---------------------------------------------------------------- MLQA

def test_mlqa_spanish_articles_and_unicode_punctuation():
    # es drops "la"; "¿" and "?" are Unicode punctuation (category Po)
    assert mlqa_normalize_answer("¿La Casa Blanca?", "es") == "casa blanca"
    data = _dataset([("e", ["la casa blanca"])])
    assert mlqa_evaluate(data, {"e": "Casa blanca"}, "es")["exact_match"] == 100.0
    # under en, "la" stays: "casa blanca" vs "la casa blanca": P 1, R 2/3 -> F1 0.8
    r = mlqa_evaluate(data, {"e": "Casa blanca"}, "en")
    assert r["exact_match"] == 0.0 and r["f1"] == pytest.approx(80.0)


def test_mlqa_chinese_mixed_segmentation_gives_character_f1():
    assert mlqa_normalize_answer("北京大学。", "zh") == "北 京 大 学"  # "。" is punctuation
    assert mlqa_normalize_answer("abc中文 de", "zh") == "abc 中 文 de"
    # gold 北/京/大/学, pred 北/京: shared 2, P 1, R 1/2 -> F1 2/3; EM 0
    r = mlqa_evaluate(_dataset([("z", ["北京大学"])]), {"z": "北京"}, "zh")
    assert r["exact_match"] == 0.0 and r["f1"] == pytest.approx(100 * 2 / 3)


def test_mlqa_arabic_removes_al_like_the_official_regex():
    # "الكتاب" -> " كتاب" -> "كتاب": exact match with "كتاب"
    r = mlqa_evaluate(_dataset([("r", ["الكتاب"])]), {"r": "كتاب"}, "ar")
    assert r["exact_match"] == 100.0
    # official `\sال^|ال`: the first branch never matches, so every ال goes, inside words too
    assert mlqa_normalize_answer("المال", "ar") == "م"


def test_mlqa_unknown_language_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'fr'.*ar, de, en, es, hi, vi, zh"):
        mlqa_evaluate(SQUAD, SQUAD_PRED, "fr")


# ---------------------------------------------------------------- seqeval

def test_chunks_i_without_b_type_change_and_iobes():
    assert extract_chunks(["I-PER", "I-PER", "O"]) == [("PER", 0, 1)]  # I- starts a chunk
    assert extract_chunks(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]
    assert extract_chunks(["S-PER", "B-LOC", "E-LOC", "S-LOC"]) == [
        ("PER", 0, 0), ("LOC", 1, 2), ("LOC", 3, 3)]
    assert extract_chunks(["B-LOC", "E-LOC", "I-LOC"]) == [("LOC", 0, 1), ("LOC", 2, 2)]
    assert extract_chunks(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    # bare prefixes have the type "_": O I I is one chunk, I after E starts another
    assert extract_chunks(["O", "I", "I", "E", "I"]) == [("_", 1, 3), ("_", 4, 4)]


def test_seqeval_readme_example():
    # seqeval's documented example: f1_score(...) == 0.50 (MISC span wrong, PER right)
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    r = seqeval_scores(gold, pred)
    assert (r["precision"], r["recall"], r["f1"]) == (50.0, 50.0, 50.0)


# Cross-checked once by hand against seqeval 1.2.2's get_entities (default mode):
#   gold chunks PER(0,1) LOC(3,4) LOC(5,5) ORG(7,7) MISC(8,9) MISC(10,10) PER(12,12) LOC(13,13)
#   pred chunks PER(0,1) LOC(3,5) ORG(7,7) MISC(8,10) PER(12,13)
#   correct PER(0,1), ORG(7,7): P = 2/5 = 40, R = 2/8 = 25, F1 = 2*.4*.25/.65 = 30.769...
XGOLD = [["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC"],
         ["S-ORG", "B-MISC", "E-MISC", "I-MISC"], ["B-PER", "I-LOC", "O"]]
XPRED = [["I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC"],
         ["B-ORG", "B-MISC", "I-MISC", "E-MISC"], ["B-PER", "I-PER", "O"]]


def test_seqeval_matches_reference_values_and_per_type():
    r = seqeval_scores(XGOLD, XPRED)
    assert r["precision"] == pytest.approx(40.0) and r["recall"] == pytest.approx(25.0)
    assert r["f1"] == pytest.approx(30.769230769230766)
    assert r["per_type"]["PER"] == {"precision": 50.0, "recall": 50.0, "f1": 50.0, "support": 2}
    assert r["per_type"]["ORG"]["f1"] == 100.0 and r["per_type"]["LOC"]["support"] == 3
    assert r["per_type"]["MISC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}


def test_seqeval_chunks_do_not_cross_sentences():
    # [B-PER] [I-PER]: two gold chunks; pred [B-PER] [O]: 1 of 1 right -> P 100, R 50
    r = seqeval_scores([["B-PER"], ["I-PER"]], [["B-PER"], ["O"]])
    assert (r["precision"], r["recall"]) == (100.0, 50.0)


def _conll(path, sentences, docstart=False):
    lines = ["-DOCSTART- -X- O O", ""] if docstart else []
    for sentence in sentences:
        lines += [f"{tok} X {label}" for tok, label in sentence] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def test_seqeval_files_skip_docstart_and_use_first_and_last_columns(tmp_path):
    toks = [[f"w{i}{j}" for j in range(len(s))] for i, s in enumerate(XGOLD)]
    gold = _conll(tmp_path / "g.conll", [list(zip(t, s)) for t, s in zip(toks, XGOLD)], True)
    pred = _conll(tmp_path / "p.conll", [list(zip(t, s)) for t, s in zip(toks, XPRED)])
    assert seqeval_files(gold, pred)["f1"] == pytest.approx(30.769230769230766)


def test_seqeval_files_token_mismatch_names_both_files_and_lines(tmp_path):
    gold = _conll(tmp_path / "g.conll", [[("a", "O"), ("b", "B-PER")]])
    pred = _conll(tmp_path / "p.conll", [[("a", "O"), ("c", "B-PER")]], docstart=True)
    with pytest.raises(ValueError, match=r"g\.conll line 2 \(token 'b'\) vs .*p\.conll line 4"):
        seqeval_files(gold, pred)


# ---------------------------------------------------------------- AER

def test_aer_sums_over_the_corpus_and_possible_links_only_help_precision():
    # S = {1:(0,0), 1:(2,2), 2:(0,1)} (3); P = S + {1:(1,1)} (4)
    # A = {1:(0,0), 1:(1,1), 1:(2,1), 2:(0,1), 2:(1,0)} (5)
    # A∩S = {1:(0,0), 2:(0,1)} = 2;  A∩P = A∩S + {1:(1,1)} = 3
    # AER = 1 - (2+3)/(5+3) = 0.375; P = 3/5; R = 2/3
    # (per-sentence averaging would give (0.4 + 1/3)/2 = 0.3667 instead)
    r = aer_scores(["0-0 1p1 2-2", "0-1"], ["0-0 1-1 2-1", "0-1 1-0"])
    assert r["aer"] == pytest.approx(37.5)
    assert r["precision"] == pytest.approx(60.0) and r["recall"] == pytest.approx(100 * 2 / 3)
    # only the possible-only link predicted: A∩S = 0, A∩P = 1
    # P = 1/1, R = 0/3, AER = 1 - (0+1)/(1+3) = 0.75
    r = aer_scores(["0-0 1p1 2-2", "0-1"], ["1-1", ""])
    assert r == {"aer": 75.0, "precision": 100.0, "recall": 0.0}


def test_aer_rejects_malformed_and_possible_links_in_predictions():
    with pytest.raises(ValueError, match=r"pred\.txt line 2: malformed link '1-x'"):
        aer_scores(["0-0", "1-1"], ["0-0", "1-x"], pred_name="pred.txt")
    with pytest.raises(ValueError, match=r"line 1: malformed link '1p1'.*only in gold"):
        aer_scores(["1p1"], ["1p1"])


# ---------------------------------------------------------------- BUCC

def test_bucc_pair_set_scores():
    gold = parse_pairs(["de-1\ten-1\n", "de-2\ten-2\n", "de-3\ten-3\n", "\n"])
    pred = parse_pairs(["de-1\ten-1", "de-2\ten-3", "de-3\ten-3", "de-4\ten-4", "de-1\ten-1"])
    # correct 2 (de-1, de-3); the duplicate counts once: P = 2/4, R = 2/3, F1 = 4/7
    r = bucc_scores(gold, pred)
    assert r["precision"] == 50.0 and r["recall"] == pytest.approx(100 * 2 / 3)
    assert r["f1"] == pytest.approx(100 * 4 / 7)


def test_bucc_malformed_line_names_file_and_line():
    with pytest.raises(ValueError, match=r"cands\.tsv line 2: expected 'src_id<TAB>tgt_id'"):
        parse_pairs(["a\tb", "a b"], name="cands.tsv")


# ---------------------------------------------------------------- CLI

def test_cli_squad_and_mlqa_print_json(tmp_path):
    gold, pred = tmp_path / "dev.json", tmp_path / "pred.json"
    gold.write_text(json.dumps(SQUAD))
    pred.write_text(json.dumps(SQUAD_PRED))
    r = _cli("squad", "--gold", str(gold), "--pred", str(pred))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["exact_match"] == 50.0 and out["f1"] == pytest.approx(70.0)
    assert (out["total"], out["missing"]) == (4, 1)
    gold.write_text(json.dumps(_dataset([("z", ["北京大学"])])), encoding="utf-8")
    pred.write_text(json.dumps({"z": "北京"}), encoding="utf-8")
    r = _cli("mlqa", "--gold", str(gold), "--pred", str(pred), "--lang", "zh")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["f1"] == pytest.approx(100 * 2 / 3)


def test_cli_squad_invalid_json_and_mlqa_bad_language(tmp_path):
    gold, pred = tmp_path / "dev.json", tmp_path / "pred.json"
    gold.write_text(json.dumps(SQUAD))
    pred.write_text('{\n  "q1": "x",\n  "q2": \n}\n')
    _assert_cli_error(_cli("squad", "--gold", str(gold), "--pred", str(pred)),
                      str(pred), "line 4")
    pred.write_text(json.dumps({"nope": "x"}))
    _assert_cli_error(_cli("squad", "--gold", str(gold), "--pred", str(pred)),
                      str(pred), "'nope'")
    _assert_cli_error(_cli("mlqa", "--gold", str(gold), "--pred", str(pred), "--lang", "fr"),
                      "'fr'", "ar, de, en, es, hi, vi, zh")


def test_cli_seqeval(tmp_path):
    gold = _conll(tmp_path / "g.conll", [[("a", "I-PER"), ("b", "I-PER"), ("c", "B-LOC")]])
    pred = _conll(tmp_path / "p.conll", [[("a", "B-PER"), ("b", "I-PER"), ("c", "B-ORG")]])
    # gold PER(0,1) LOC(2,2); pred PER(0,1) ORG(2,2): P = R = F1 = 1/2
    r = _cli("seqeval", "--gold", gold, "--pred", pred)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["precision"], out["recall"], out["f1"]) == (50.0, 50.0, 50.0)
    assert out["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    (tmp_path / "bad.conll").write_text("a O\nb\n")
    _assert_cli_error(_cli("seqeval", "--gold", gold, "--pred", str(tmp_path / "bad.conll")),
                      "bad.conll line 2", "one column")


def test_cli_aer(tmp_path):
    gold, pred = tmp_path / "gold.talp", tmp_path / "pred.talp"
    gold.write_text("0-0 1p1 2-2\n0-1\n")
    pred.write_text("0-0 1-1 2-1\n0-1 1-0\n")
    r = _cli("aer", "--gold", str(gold), "--pred", str(pred))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["aer"] == pytest.approx(37.5)
    pred.write_text("0-0\n")
    _assert_cli_error(_cli("aer", "--gold", str(gold), "--pred", str(pred)),
                      f"{gold} has 2 lines but {pred} has 1")


def test_cli_bucc(tmp_path):
    gold, pred = tmp_path / "gold.tsv", tmp_path / "pred.tsv"
    gold.write_text("a\tx\nb\ty\n")
    pred.write_text("a\tx\nb\tz\nc\tw\n")
    # correct 1: P = 1/3, R = 1/2, F1 = 2/5
    r = _cli("bucc", "--gold", str(gold), "--pred", str(pred))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["precision"] == pytest.approx(100 / 3) and out["f1"] == pytest.approx(40.0)
    pred.write_text("a\tx\nb z\n")
    _assert_cli_error(_cli("bucc", "--gold", str(gold), "--pred", str(pred)),
                      f"{pred} line 2")


def test_cli_usage_errors_are_one_line_and_help_works():
    _assert_cli_error(_cli("squad", "--gold", "g.json"), "--pred")
    _assert_cli_error(_cli("f1"), "invalid choice")
    r = _cli("--help")
    assert r.returncode == 0 and "seqeval" in r.stdout and "bucc" in r.stdout
