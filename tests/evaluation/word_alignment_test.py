"""Word alignment by optimal transport: Sinkhorn against a plain-domain reference and the exact
assignment, link extraction on hand-made matrices, the word pooling against a manual mean of
`Encoder.hidden_states`, and the CLI end to end on a tiny random model."""
import itertools

import numpy as np
import pytest

from retrieval_test import (ENGLISH, encoder, lang_model, model_dir, spm_dir,  # noqa: F401
                            spm_path)
from xlm_jax.evaluation import word_alignment as wa


# ----------------------------------------------------------------------------- Sinkhorn

def _plain_sinkhorn(cost, a, b, eps, iters=5000):
    """Independent reference: the textbook scaling iterations u = a / Kv, v = b / K^T u."""
    k = np.exp(-cost / eps)
    u, v = np.ones(len(a)), np.ones(len(b))
    for _ in range(iters):
        u = a / (k @ v)
        v = b / (k.T @ u)
    return u[:, None] * k * v[None, :]


def test_sinkhorn_marginals_and_plain_domain_reference():
    rng = np.random.default_rng(0)
    cost = rng.uniform(0, 2, size=(4, 6))
    a = rng.uniform(0.5, 1.5, size=4)
    a /= a.sum()
    b = rng.uniform(0.5, 1.5, size=6)
    b /= b.sum()
    plan = wa.sinkhorn(cost, a, b, eps=0.3, num_iters=1000)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-6)
    np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-6)
    np.testing.assert_allclose(plan, _plain_sinkhorn(cost, a, b, 0.3), rtol=1e-6, atol=1e-9)
    # Default marginals are uniform.
    uniform = wa.sinkhorn(cost, eps=0.3, num_iters=1000)
    np.testing.assert_allclose(uniform.sum(axis=1), np.full(4, 1 / 4), atol=1e-6)
    np.testing.assert_allclose(uniform.sum(axis=0), np.full(6, 1 / 6), atol=1e-6)
    # Log domain: where exp(-cost/eps) underflows to 0 in float64, the plan stays finite.
    far = cost + 1.0
    assert not np.exp(-far / 1e-3).any()
    tiny = wa.sinkhorn(far, eps=1e-3, num_iters=100)
    assert np.isfinite(tiny).all()
    np.testing.assert_allclose(tiny.sum(axis=0), np.full(6, 1 / 6), atol=1e-6)
    with pytest.raises(ValueError, match="different masses"):
        wa.sinkhorn(cost, a, 2 * b)


def _best_permutation(cost):
    n = len(cost)
    perms = sorted(itertools.permutations(range(n)),
                   key=lambda p: sum(cost[i, p[i]] for i in range(n)))
    best, second = perms[0], perms[1]
    gap = sum(cost[i, second[i]] - cost[i, best[i]] for i in range(n))
    return best, gap


@pytest.mark.parametrize("n", [3, 5])
def test_plan_tends_to_the_exact_assignment_as_eps_shrinks(n):
    rng = np.random.default_rng(n)
    cost = rng.uniform(0.5, 2, size=(n, n))
    planted = rng.permutation(n)
    cost[np.arange(n), planted] = rng.uniform(0, 0.3, size=n)  # cheap, but checked below
    best, gap = _best_permutation(cost)
    assert gap > 0.5  # a unique optimum, found by brute force over all n! permutations
    exact = np.zeros((n, n))
    exact[np.arange(n), best] = 1.0 / n
    errors = []
    for eps in (0.3, 0.1, 0.03, 0.01):
        plan = wa.sinkhorn(cost, eps=eps, num_iters=10000, tol=1e-13)
        np.testing.assert_allclose(plan.sum(axis=1), 1.0 / n, atol=1e-5)
        errors.append(np.abs(plan - exact).max())
    assert errors == sorted(errors, reverse=True) and errors[0] > 1e-2
    assert errors[-1] < 1e-9
    assert wa.extract_links(plan) == sorted((i, best[i]) for i in range(n))


# ----------------------------------------------------------------------------- extraction

def test_extract_links_by_hand():
    m = np.array([[0.9, 0.1, 0.0],
                  [0.8, 0.7, 0.1],
                  [0.1, 0.2, 0.3]])
    # Rows pick columns 0, 0, 2; columns pick rows 0, 1, 2: mutual are (0,0) and (2,2).
    assert wa.extract_links(m, "mutual") == [(0, 0), (2, 2)]
    # One source word spread over two target words: threshold finds one-to-many links.
    p = np.array([[0.25, 0.25, 0.0, 0.0],
                  [0.0, 0.0, 0.25, 0.25]])
    assert wa.extract_links(p, "mutual") == [(0, 0), (1, 2)]
    assert wa.extract_links(p, "threshold", 0.5) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    q = np.array([[0.3, 0.2], [0.2, 0.3]])  # fractions 0.6 and 0.4 of each word's mass
    assert wa.extract_links(q, "threshold", 0.5) == [(0, 0), (1, 1)]
    assert wa.extract_links(q, "threshold", 0.4) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match="'itermax' is not one of mutual, threshold"):
        wa.extract_links(q, "itermax")


def test_align_recovers_a_permutation():
    rng = np.random.default_rng(3)
    src = rng.normal(size=(6, 8))
    perm = rng.permutation(6)
    tgt = src[perm] + 0.05 * rng.normal(size=(6, 8))  # target word j translates source perm[j]
    want = sorted((int(perm[j]), j) for j in range(6))
    assert wa.align(src, tgt) == want
    assert wa.to_pharaoh(want) == " ".join(f"{i}-{j}" for i, j in want)


# ----------------------------------------------------------------------------- word vectors

def test_word_vectors_are_means_of_hidden_state_rows(encoder):  # noqa: F811
    tok = encoder.tokenizer
    sents = [["a", "dog", "ran"], "she reads unbelievably wonderful books".split(),
             ENGLISH[0].split()]
    got_mean = wa.word_vectors(encoder, sents, layer=1, batch_size=2)
    got_first = wa.word_vectors(encoder, sents, layer=2, word_pool="first", batch_size=2)
    split_words = 0
    for k, words in enumerate(sents):
        pieces = [tok.encode(w) for w in words]
        split_words += sum(len(p) > 1 for p in pieces)
        ids = [tok.bos_id] + [i for p in pieces for i in p] + [tok.eos_id]
        hidden = encoder.hidden_states(np.array([ids], np.int32))  # one unpadded row
        start = 1  # skip <s>
        for w, p in enumerate(pieces):
            rows = slice(start, start + len(p))
            np.testing.assert_allclose(got_mean[k][w], hidden[1, 0, rows].mean(axis=0),
                                       rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got_first[k][w], hidden[2, 0, start],
                                       rtol=1e-4, atol=1e-5)
            start += len(p)
        assert start == len(ids) - 1  # every position but </s> belongs to a word
        assert got_mean[k].shape == (len(words), encoder.config.hidden_size)
    assert split_words > 0  # the mean is over several pieces somewhere


def test_language_model_needs_and_uses_the_languages(lang_model, tmp_path):  # noqa: F811
    from xlm_jax.data.features import language_index
    from xlm_jax.encoder import Encoder, default_language_list

    cfg, params, spm = lang_model
    enc = Encoder(cfg, params, spm)
    words = ENGLISH[1].split()
    got = wa.word_vectors(enc, [words], layer=1, lang="de")[0]
    tok = enc.tokenizer
    pieces = [tok.encode(w) for w in words]
    ids = np.array([[tok.bos_id] + [i for p in pieces for i in p] + [tok.eos_id]])
    de = language_index("de", default_language_list())
    hidden = enc.hidden_states(ids, lang_ids=np.full(ids.shape, de))[1, 0]
    ends = np.cumsum([1] + [len(p) for p in pieces])  # word w is rows ends[w]..ends[w+1]-1
    want = np.stack([hidden[ends[w]:ends[w + 1]].mean(axis=0) for w in range(len(words))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, wa.word_vectors(enc, [words], layer=1, lang="fr")[0])
    src = tmp_path / "s.txt"
    src.write_text("a b\n")
    with pytest.raises(ValueError, match="has language embeddings: give --src_lang and "
                                         "--tgt_lang"):
        wa.align_files(enc, str(src), str(src), 1, src_lang="de")


# ----------------------------------------------------------------------------- CLI

def _error(capsys, argv) -> str:
    rc = wa.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_cli_end_to_end(model_dir, encoder, tmp_path, capsys):  # noqa: F811
    src_lines = ENGLISH[:5]
    tgt_lines = [" ".join(reversed(s.split())) for s in ENGLISH[:5]]
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("\n".join(src_lines) + "\n")
    tgt.write_text("\n".join(tgt_lines) + "\n")
    out = tmp_path / "o" / "out.pharaoh"
    assert wa.main(["--checkpoint", model_dir, "--src", str(src), "--tgt", str(tgt), "--layer",
                    "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 5
    sv = wa.word_vectors(encoder, [s.split() for s in src_lines], 2)
    tv = wa.word_vectors(encoder, [s.split() for s in tgt_lines], 2)
    for line, s, t, s_words, t_words in zip(lines, sv, tv, src_lines, tgt_lines):
        links = wa.align(s, t)
        assert line == wa.to_pharaoh(links) and links
        for i, j in links:
            assert 0 <= i < len(s_words.split()) and 0 <= j < len(t_words.split())
    assert "5 sentence pairs" in capsys.readouterr().out

    # --gold: the AER of the output against itself is 0, against no sure links ... 100.
    gold = tmp_path / "gold.txt"
    gold.write_text(out.read_text())
    assert wa.main(["--checkpoint", model_dir, "--src", str(src), "--tgt", str(tgt), "--layer",
                    "2", "--out", str(out), "--gold", str(gold)]) == 0
    assert "AER 0.00  precision 100.00  recall 100.00" in capsys.readouterr().out
    # A threshold rule with 0 keeps every link.
    assert wa.main(["--checkpoint", model_dir, "--src", str(src), "--tgt", str(tgt), "--layer",
                    "2", "--out", str(out), "--extraction", "threshold", "--threshold",
                    "0"]) == 0
    first = out.read_text().splitlines()[0].split()
    n, m = len(src_lines[0].split()), len(tgt_lines[0].split())
    assert len(first) == n * m


def test_cli_bad_inputs(model_dir, tmp_path, capsys):  # noqa: F811
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    base = ["--checkpoint", model_dir, "--src", str(src), "--tgt", str(tgt), "--layer", "1",
            "--out", str(tmp_path / "o.pharaoh")]
    src.write_text("a b\nc d\ne f\n")
    tgt.write_text("a b\nc d\n")
    assert _error(capsys, base) == (f"error: line counts differ: {src} has 3 lines, {tgt} "
                                    "has 2")
    tgt.write_text("a b\n   \ne f\n")
    assert _error(capsys, base) == (f"error: {tgt}:2: empty line (every line must hold a "
                                    "sentence)")
    tgt.write_text("a b\nc d\n" + " ".join(["word"] * 60) + "\n")
    err = _error(capsys, base)
    assert err.startswith(f"error: {tgt}:3: ") and "more than max_length 40" in err
    tgt.write_text("a b\nc d\ne f\n")
    assert "layer=7 out of range" in _error(capsys, base[:-4] + ["--layer", "7"] + base[-2:])
    assert f"{tmp_path / 'nope'}: sentence file not found" in _error(
        capsys, base[:5] + [str(tmp_path / "nope")] + base[6:])
