"""BUCC mining: the margin against a loop over its formula, mining and the best-F1 threshold on
embeddings with a known answer, the reading of real-format files and their errors, and the CLI
end to end on a tiny random model against the library functions."""
import json
import os

import numpy as np
import pytest

from retrieval_test import (ENGLISH, encoder, lang_model, model_dir, spm_dir,  # noqa: F401
                            spm_path)
from xlm_jax.evaluation import bucc, retrieval
from xlm_jax.evaluation.metrics import bucc_scores


# ----------------------------------------------------------------------------- margin

def _margin_loop(x, y, k):
    """Independent reference: the ratio margin written out from its formula, one pair at a time."""
    def cos(u, v):
        return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))

    out = np.zeros((len(x), len(y)))
    for i in range(len(x)):
        for j in range(len(y)):
            kx, ky = min(k, len(y)), min(k, len(x))
            nn_x = sorted((cos(x[i], z) for z in y), reverse=True)[:kx]
            nn_y = sorted((cos(y[j], z) for z in x), reverse=True)[:ky]
            out[i, j] = cos(x[i], y[j]) / (sum(nn_x) / (2 * kx) + sum(nn_y) / (2 * ky))
    return out


@pytest.mark.parametrize("k", [1, 4, 50])
def test_margin_scores_match_the_formula(k):
    rng = np.random.default_rng(k)
    x, y = rng.normal(size=(7, 5)) + 1.0, rng.normal(size=(9, 5)) + 1.0
    np.testing.assert_allclose(bucc.margin_scores(x, y, k), _margin_loop(x, y, k), rtol=1e-12)
    # Not the plain cosine: the margin rescales each pair by its neighbourhoods.
    cos = bucc._unit_rows(x) @ bucc._unit_rows(y).T
    assert not np.allclose(bucc.margin_scores(x, y, k), cos)


# ----------------------------------------------------------------------------- mining

def _rotated(n=30, distractors=10, d=16, noise=0.05, seed=0):
    """xx vectors, English = the same plus noise, unrelated distractor rows on both sides, the
    whole space turned by a random orthogonal rotation (cosines unchanged); ids like BUCC's;
    gold = the noisy-copy pairs."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x = rng.normal(size=(n, d))
    y = x + noise * rng.normal(size=(n, d))
    x = np.vstack([x, rng.normal(size=(distractors, d))]) @ q
    y = np.vstack([y, rng.normal(size=(distractors, d))]) @ q
    perm = rng.permutation(len(y))  # the English file is not in gold order
    y = y[perm]
    src_ids = [f"de-{i:09d}" for i in range(len(x))]
    en_ids = [f"en-{j:09d}" for j in range(len(y))]
    where = {int(p): j for j, p in enumerate(perm)}
    gold = {(src_ids[i], en_ids[where[i]]) for i in range(n)}
    return x, y, src_ids, en_ids, gold


def test_mining_rotation_gives_f1_100_and_the_threshold_drops_distractors():
    x, y, src_ids, en_ids, gold = _rotated()
    pairs = bucc.mine_pairs(x, y, src_ids, en_ids)
    distractor_pairs = {p: s for p, s in pairs.items() if p not in gold}
    assert distractor_pairs  # max-strategy keeps distractors as candidates ...
    th = bucc.optimize_threshold(pairs, gold)
    assert max(distractor_pairs.values()) < th <= min(pairs[g] for g in gold)  # ... not above th
    assert bucc.predict(pairs, th) == gold
    s = bucc.score(pairs, gold, th)
    assert (s.precision, s.recall, s.f1) == (100.0, 100.0, 100.0)
    assert (s.num_gold, s.num_predicted, s.num_candidates) == (30, 30, len(pairs))
    # A given threshold below every score predicts every candidate.
    low = bucc.score(pairs, gold, -1e9)
    assert low.num_predicted == len(pairs)
    assert low.precision == pytest.approx(100 * 30 / len(pairs)) and low.recall == 100.0


def test_strategies():
    x, y, src_ids, en_ids, gold = _rotated(seed=1)
    fwd = bucc.mine(x, y, strategy="forward")
    bwd = bucc.mine(x, y, strategy="backward")
    inter = bucc.mine(x, y, strategy="intersect")
    best = bucc.mine(x, y, strategy="max")
    assert sorted(i for i, _, _ in fwd) == list(range(len(x)))  # one per xx sentence
    assert sorted(j for _, j, _ in bwd) == list(range(len(y)))  # one per English sentence
    assert set(inter) == set(fwd) & set(bwd)
    # max: every sentence used at most once, and every intersect pair survives.
    assert len({i for i, _, _ in best}) == len(best) == len({j for _, j, _ in best})
    assert set(inter) <= set(best) <= set(fwd) | set(bwd)
    scores = [s for _, _, s in best]
    assert scores == sorted(scores, reverse=True)
    # Forward candidates are rescored by margin among the k cosine-nearest only.
    margin = bucc.margin_scores(x, y)
    i, j, s = fwd[0]
    assert s == pytest.approx(margin[i, j])
    with pytest.raises(ValueError, match="strategy='all'"):
        bucc.mine(x, y, strategy="all")


def _mine_reference(x, y, k, strategy):
    """Mining on the whole [N, M] matrix in float64 (LASER's steps one by one): the margin of
    every pair (`margin_scores`, checked against its formula above), each row's k nearest by a
    stable sort of its cosines, the best margin among them, then the strategy."""
    ux, uy = bucc._unit_rows(x), bucc._unit_rows(y)
    sim, margin = ux @ uy.T, bucc.margin_scores(x, y, k)

    def best(sim, margin):
        near = np.argsort(-sim, axis=1, kind="stable")[:, :min(k, sim.shape[1])]
        scores = np.take_along_axis(margin, near, axis=1)
        pick = np.argmax(scores, axis=1)
        return near[np.arange(len(near)), pick], scores[np.arange(len(near)), pick]

    fb, fs = best(sim, margin)
    bb, bs = best(sim.T, margin.T)
    fwd = [(i, int(j), float(s)) for i, (j, s) in enumerate(zip(fb, fs))]
    bwd = [(int(i), j, float(s)) for j, (i, s) in enumerate(zip(bb, bs))]
    if strategy == "forward":
        return fwd
    if strategy == "backward":
        return bwd
    if strategy == "intersect":
        return [p for p in fwd if bb[p[1]] == p[0]]
    pairs, sx, sy = [], set(), set()
    for i, j, s in sorted(fwd + bwd, key=lambda p: -p[2]):
        if i not in sx and j not in sy:
            sx.add(i), sy.add(j), pairs.append((i, j, s))
    return pairs


@pytest.mark.parametrize("strategy", bucc.STRATEGIES)
@pytest.mark.parametrize("k,block", [(4, 6), (4, 4096), (1, 9), (60, 7)])
def test_mining_from_the_blocked_neighbours_equals_mining_on_the_whole_matrix(strategy, k, block):
    x, y, *_ = _rotated(n=40, distractors=15, d=12, noise=0.3, seed=2)
    # A shared offset, as sentence embeddings have (positive mean cosines): centred vectors
    # with k = all rows give margins over a mean cosine near 0, which float32 cannot resolve.
    x, y = x + 0.5, y + 0.5
    got = bucc.mine(x, y, k=k, strategy=strategy, block=block)
    want = sorted(_mine_reference(x, y, k, strategy), key=lambda p: -p[2])
    assert [(i, j) for i, j, _ in got] == [(i, j) for i, j, _ in want]
    np.testing.assert_allclose([s for *_, s in got], [s for *_, s in want], rtol=1e-5)


def test_max_strategy_resolves_a_conflict_by_score():
    # x0 and x1 both point at y0 (forward); y1 points at x1 (backward). max keeps the best
    # pair for y0 and gives x1 to y1 only if it was not used.
    x = np.array([[1.0, 0.0, 0.0], [0.9, 0.3, 0.0]])
    y = np.array([[1.0, 0.1, 0.0], [0.5, 0.9, 0.1]])
    best = bucc.mine(x, y, k=1, strategy="max")
    margin = bucc.margin_scores(x, y, 1)
    assert {(i, j) for i, j, _ in best} == {(0, 0), (1, 1)}
    assert [s for _, _, s in best] == pytest.approx(sorted([margin[0, 0], margin[1, 1]],
                                                           reverse=True))


def test_optimize_threshold_by_hand():
    gold = {("a", "1"), ("b", "2"), ("c", "3")}
    pairs = {("a", "1"): 1.30, ("b", "2"): 1.20, ("x", "9"): 1.10, ("c", "3"): 1.00,
             ("y", "8"): 0.90}
    # Prefix F1: 1/2, 4/5, 4/6, 6/7 (best: keep 4, cut between 1.00 and 0.90), 6/8.
    th = bucc.optimize_threshold(pairs, gold)
    assert th == pytest.approx(0.95)
    assert bucc.score(pairs, gold, th).f1 == pytest.approx(100 * 6 / 7)
    assert bucc.score(pairs, gold, th).f1 == pytest.approx(
        bucc_scores(gold, {p for p, s in pairs.items() if s >= th})["f1"])
    # A tie cannot be split: with (c,3) tied with (y,8) at 0.90, keeping four (F1 6/7 if c came
    # first) is no threshold; the cuts are 1/2, 4/5, 4/6 and all five 6/8: keep two.
    tied = {**pairs, ("c", "3"): 0.90}
    th = bucc.optimize_threshold(tied, gold)
    assert th == pytest.approx(1.15)
    assert bucc.score(tied, gold, th).f1 == pytest.approx(80.0)
    assert bucc.optimize_threshold({("x", "9"): 2.0}, gold) == 0.0  # nothing correct: LASER's 0


# ----------------------------------------------------------------------------- files

def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def _bucc_folder(root, langs=("de", "fr"), splits=("dev", "test")):
    """Real-format files: `de` translations are the English sentences themselves, `fr` the
    English words reversed; each side has two distractor sentences, the English file is
    shuffled, and gold lists the 5 translated pairs."""
    rng = np.random.default_rng(0)
    for s, split in enumerate(splits):
        eng = ENGLISH[s * 5:s * 5 + 7]
        for lang in langs:
            src = [e if lang == "de" else " ".join(reversed(e.split())) for e in eng[:5]]
            src += ["unrelated words here", "nothing to see"]
            src_ids = [f"{lang}-{split}-{i:04d}" for i in range(len(src))]
            order = rng.permutation(len(eng))
            en_ids = [f"en-{split}-{i:04d}" for i in range(len(eng))]
            _write(root / f"{lang}-en.{split}.{lang}", zip(src_ids, src))
            _write(root / f"{lang}-en.{split}.en", [(en_ids[i], eng[i]) for i in order])
            _write(root / f"{lang}-en.{split}.gold", [(src_ids[i], en_ids[i]) for i in range(5)])
    return root


def test_read_split_and_nested_layout(tmp_path):
    flat = _bucc_folder(tmp_path / "flat")
    assert bucc.find_languages(str(flat), "test") == ["de", "fr"]
    data = bucc.read_split(str(flat), "de", "test")
    assert data.src_ids[0] == "de-test-0000" and data.src[0] == ENGLISH[5]
    assert ("de-test-0004", "en-test-0004") in data.gold and len(data.gold) == 5
    nested = tmp_path / "nested" / "de-en"  # the BUCC tarball layout
    _bucc_folder(nested, langs=("de",), splits=("training",))
    assert bucc.find_languages(str(tmp_path / "nested"), "training") == ["de"]
    assert bucc.read_split(str(tmp_path / "nested"), "de", "training").gold == {
        (f"de-training-{i:04d}", f"en-training-{i:04d}") for i in range(5)}
    assert bucc._unify(["a", "b", "c"], ["x", "y", "x"]) == (["x", "y"], [None, "b"])


def test_language_model_embeds_each_side_in_its_language(lang_model, tmp_path):  # noqa: F811
    from xlm_jax.encoder import Encoder

    cfg, params, spm = lang_model
    enc = Encoder(cfg, params, spm)
    folder = _bucc_folder(tmp_path / "b", langs=("de",), splits=("test",))
    d = bucc.read_split(str(folder), "de", "test")
    got = bucc.split_pairs(enc, d, layer=1, max_length=32)
    x = retrieval.embed_layers(enc, d.src, [1], max_length=32, lang="de")[0]
    y = retrieval.embed_layers(enc, d.en, [1], max_length=32, lang="en")[0]
    assert got == pytest.approx(bucc.mine_pairs(x, y, d.src_ids, d.en_ids))
    y_as_de = retrieval.embed_layers(enc, d.en, [1], max_length=32, lang="de")[0]
    assert got != pytest.approx(bucc.mine_pairs(x, y_as_de, d.src_ids, d.en_ids))
    odd = _bucc_folder(tmp_path / "odd", langs=("aa",), splits=("test",))
    with pytest.raises(ValueError, match="language 'aa' is not in the language list"):
        bucc.evaluate(enc, str(odd), 1)


# ----------------------------------------------------------------------------- CLI

def _library_result(encoder, folder, lang):  # noqa: F811 (the encoder fixture's value)
    """The CLI's numbers recomputed from the library pieces: retrieval's embedding, mining,
    the dev-tuned threshold applied to test."""
    def pairs(split):
        d = bucc.read_split(str(folder), lang, split)
        x = retrieval.embed_layers(encoder, d.src, [1], max_length=32)[0]
        y = retrieval.embed_layers(encoder, d.en, [1], max_length=32)[0]
        return bucc.mine_pairs(x, y, d.src_ids, d.en_ids), d.gold
    th = bucc.optimize_threshold(*pairs("dev"))
    return bucc.score(*pairs("test"), th)


def test_cli_end_to_end(model_dir, encoder, tmp_path, capsys):  # noqa: F811
    folder = _bucc_folder(tmp_path / "bucc")
    out = tmp_path / "res" / "bucc.json"
    rc = bucc.main(["--checkpoint", model_dir, "--bucc_dir", str(folder), "--languages", "de,fr",
                    "--layer", "1", "--max_length", "32", "--threshold_from", "dev",
                    "--output_json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data) == {"layer", "split", "threshold_from", "k", "strategy", "average_f1",
                         "per_language", "checkpoint", "step", "predictions"}
    assert data["predictions"] is None
    assert (data["layer"], data["split"], data["threshold_from"]) == (1, "test", "dev")
    assert (data["k"], data["strategy"]) == (4, "max")
    assert set(data["per_language"]) == {"de", "fr"}
    for lang in ("de", "fr"):
        got, want = data["per_language"][lang], _library_result(encoder, folder, lang)
        assert set(got) == {"precision", "recall", "f1", "threshold", "num_gold",
                            "num_predicted", "num_candidates"}
        for key, value in want.to_json().items():
            assert got[key] == pytest.approx(value), (lang, key)
        assert 0.0 <= got["f1"] <= 100.0 and got["num_gold"] == 5
    assert data["average_f1"] == pytest.approx(
        (data["per_language"]["de"]["f1"] + data["per_language"]["fr"]["f1"]) / 2)
    printed = capsys.readouterr().out
    assert "precision" in printed and f"{data['per_language']['de']['f1']:.2f}" in printed
    # Blocks of 3 sentences a side (the files hold 7) mine the same pairs.
    small = tmp_path / "res" / "small_blocks.json"
    assert bucc.main(["--checkpoint", model_dir, "--bucc_dir", str(folder), "--languages",
                      "de,fr", "--layer", "1", "--max_length", "32", "--threshold_from", "dev",
                      "--block_size", "3", "--output_json", str(small)]) == 0
    blocked = json.loads(small.read_text())["per_language"]
    for lang in ("de", "fr"):
        for key, value in data["per_language"][lang].items():
            assert blocked[lang][key] == pytest.approx(value, rel=1e-5), (lang, key)
    capsys.readouterr()

    # A given threshold is scored as given.
    assert bucc.main(["--checkpoint", model_dir, "--bucc_dir", str(folder), "--languages", "de",
                      "--layer", "1", "--max_length", "32", "--threshold", "-100",
                      "--output_json", str(out)]) == 0
    de = json.loads(out.read_text())["per_language"]["de"]
    assert de["threshold"] == -100 and de["num_predicted"] == de["num_candidates"]
    assert json.loads(out.read_text())["threshold_from"] == "given"


def test_predictions_for_a_split_without_gold_as_xtreme_ships_its_test(model_dir, encoder,
                                                                      tmp_path, capsys):
    """XTREME's test folder has no gold files: mined with the dev threshold, the predicted
    pairs written as XTREME's `test-{xx}.tsv`, the table with counts and no scores. The same
    folder with its gold: the written file is what was scored."""
    folder = _bucc_folder(tmp_path / "bucc", langs=("de",))
    gold_file = folder / "de-en.test.gold"
    gold = {tuple(line.split("\t")) for line in gold_file.read_text().splitlines()}
    scored_json, scored_dir = tmp_path / "scored.json", tmp_path / "pred_gold"
    argv = ["--checkpoint", model_dir, "--bucc_dir", str(folder), "--layer", "1",
            "--max_length", "32", "--threshold_from", "dev"]
    assert bucc.main(argv + ["--predictions_dir", str(scored_dir),
                             "--output_json", str(scored_json)]) == 0
    scored = json.loads(scored_json.read_text())
    lines = (scored_dir / "test-de.tsv").read_text().splitlines()
    predicted = {tuple(line.split("\t")) for line in lines}
    assert 0 < len(lines) == len(predicted) == scored["per_language"]["de"]["num_predicted"]
    assert bucc_scores(gold, predicted)["f1"] == pytest.approx(scored["per_language"]["de"]["f1"])
    assert scored["predictions"] == {"de": str(scored_dir / "test-de.tsv")}
    capsys.readouterr()

    gold_file.unlink()  # now as XTREME ships it
    blind_dir = tmp_path / "pred_blind"
    assert bucc.main(argv + ["--predictions_dir", str(blind_dir)]) == 0  # no --output_json
    out = capsys.readouterr().out.splitlines()
    assert (blind_dir / "test-de.tsv").read_text() == (scored_dir / "test-de.tsv").read_text()
    threshold = scored["per_language"]["de"]["threshold"]
    assert out[1].split() == ["de", "-", "-", "-", f"{threshold:.4f}", str(len(lines))]
    assert out[-1] == (f"layer 1, split test (threshold from dev): no gold to score -> "
                       f"{blind_dir}")
    result = bucc.evaluate(encoder, str(folder), 1, split="test", threshold_from="dev",
                           max_length=32)
    de = result.per_language["de"]
    assert (de.precision, de.recall, de.f1, de.num_gold) == (None, None, None, None)
    assert result.average_f1 is None and de.num_predicted == len(lines)
    # Tuning on the split itself still needs its gold: one line naming the file.
    assert f"{gold_file}: gold file not found" in _error(capsys, argv[:-2])


def _error(capsys, argv) -> str:
    rc = bucc.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_cli_bad_inputs(model_dir, tmp_path, capsys):  # noqa: F811
    def run(folder, *extra):
        return _error(capsys, ["--checkpoint", model_dir, "--bucc_dir", str(folder), "--layer",
                               "1", "--max_length", "32", "--output_json",
                               str(tmp_path / "x.json"), *extra])

    def fresh(name):
        return _bucc_folder(tmp_path / name, langs=("de",), splits=("test",))

    f = fresh("malformed")
    (f / "de-en.test.de").write_text("de-1\tgood line\nde-2 no tab here\n")
    assert run(f) == f"error: {f / 'de-en.test.de'}:2: expected 'id<TAB>sentence', got " \
                     "'de-2 no tab here'"

    f = fresh("dup")
    (f / "de-en.test.en").write_text("en-1\tone\nen-2\ttwo\nen-1\tthree\n")
    err = run(f)
    assert f"{f / 'de-en.test.en'}:3: duplicate id 'en-1' (first on line 1)" in err

    f = fresh("gold")
    with open(f / "de-en.test.gold", "a") as g:
        g.write("de-test-0001\ten-nowhere\n")
    err = run(f)
    assert f"{f / 'de-en.test.gold'}:6: id 'en-nowhere' is not in {f / 'de-en.test.en'}" in err

    f = fresh("goldbad")
    (f / "de-en.test.gold").write_text("de-test-0001 en-test-0001\n")
    assert f"{f / 'de-en.test.gold'}:1: expected 'xx_id<TAB>en_id'" in run(f)

    f = fresh("lang")
    err = run(f, "--languages", "de,zh")
    assert "no 'test' files for language(s) zh (found: de;" in err

    f = fresh("nodev")
    err = run(f, "--threshold_from", "dev")
    assert f"{f / 'de-en.dev.de'}: BUCC sentence file not found" in err

    f = fresh("nogold")
    os.remove(f / "de-en.test.gold")
    assert f"{f / 'de-en.test.gold'}: gold file not found" in run(f)

    err = run(tmp_path / "missing")
    assert "not a directory" in err and "{xx}-en.{split}.{xx}" in err

    with pytest.raises(SystemExit) as exit_info:
        bucc.main(["--checkpoint", model_dir, "--bucc_dir", str(fresh("block")), "--layer", "1",
                   "--block_size", "0", "--output_json", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--block_size=0 must be >= 1 (--help lists "
                                                    "every flag)")
