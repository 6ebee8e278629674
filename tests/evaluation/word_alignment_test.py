"""Word alignment by optimal transport: Sinkhorn against a plain-domain reference and the exact
assignment, link extraction on hand-made matrices, the word pooling against a manual mean of
`Encoder.hidden_states`, and the CLI end to end on a tiny random model."""
import itertools
import re

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


# ----------------------------------------------------------------------------- xlmalign method

def _kernel_loop(s, iters):
    """Independent reference: columns then rows divided by their sums, entry by entry."""
    s = [list(map(float, row)) for row in s]
    n, m = len(s), len(s[0])
    pi = xi = s
    for _ in range(iters):
        col = [sum(pi[i][j] for i in range(n)) for j in range(m)]
        xi = [[pi[i][j] / col[j] for j in range(m)] for i in range(n)]
        pi = [[xi[i][j] / sum(xi[i]) for j in range(m)] for i in range(n)]
    return np.array(pi), np.array(xi)


def test_kernel_sinkhorn_by_hand_and_against_a_loop():
    s = np.array([[1.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    pi, xi = wa.kernel_sinkhorn(s)  # 2 iterations, columns first
    # Worked by hand: xi1 = [[1/4, 1/2, 1/2], [3/4, 1/2, 1/2]], pi1 = [[1/5, 2/5, 2/5],
    # [3/7, 2/7, 2/7]]; column sums 22/35, 24/35, 24/35 give xi2 (row sums 49/33, 50/33),
    # then its rows give pi2.
    np.testing.assert_allclose(xi, [[7 / 22, 7 / 12, 7 / 12], [15 / 22, 5 / 12, 5 / 12]])
    np.testing.assert_allclose(pi, [[3 / 14, 11 / 28, 11 / 28], [9 / 20, 11 / 40, 11 / 40]])
    np.testing.assert_allclose(pi.sum(axis=1), 1.0)
    rows_first = s / s.sum(axis=1, keepdims=True)
    rows_first = rows_first / rows_first.sum(axis=0, keepdims=True)
    assert not np.allclose(wa.kernel_sinkhorn(s, 1)[1], rows_first)  # the order matters
    # Entries <= 0 stay in the kernel (the released `fill_` on a copy changes nothing).
    pi1, xi1 = wa.kernel_sinkhorn(np.array([[1.0, -1.0], [2.0, 3.0]]), num_iters=1)
    np.testing.assert_allclose(xi1, [[1 / 3, -1 / 2], [2 / 3, 3 / 2]])
    np.testing.assert_allclose(pi1, [[-2.0, 3.0], [4 / 13, 9 / 13]])
    assert all(np.array_equal(m, s) for m in wa.kernel_sinkhorn(s, 0))
    rng = np.random.default_rng(7)
    r = rng.uniform(0.1, 5.0, size=(4, 7))
    for iters in (1, 2, 5):
        for got, want in zip(wa.kernel_sinkhorn(r, iters), _kernel_loop(r, iters)):
            np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(ValueError, match="non-empty"):
        wa.kernel_sinkhorn(np.ones((0, 3)))


def test_mutual_links_take_rows_and_columns_from_their_own_matrices():
    rows = np.array([[0.1, 0.9], [0.8, 0.2]])  # rows pick columns 1, 0; columns rows 1, 0
    cols = np.array([[0.9, 0.9], [0.1, 0.1]])  # rows pick columns 0, 0 (ties); columns rows 0, 0
    assert wa.mutual_links(rows, cols) == [(0, 1)]
    assert wa.mutual_links(rows, rows) == [(0, 1), (1, 0)]
    assert wa.mutual_links(cols, rows) == [(1, 0)]


def test_subword_links_lift_to_distinct_word_links():
    # Source: word 0 in two pieces, word 1 in one; target: two one-piece words. Both pieces of
    # word 0 link to target word 0 -> a single word link.
    src_of, tgt_of = [0, 0, 1], [0, 1]
    assert wa.lift_links([(0, 0), (1, 0), (2, 1)], src_of, tgt_of) == [(0, 0), (1, 1)]
    assert wa.lift_links([], src_of, tgt_of) == []
    # Through the whole method: a similarity where pieces 0 and 1 both prefer target piece 0.
    sim = np.array([[5.0, 1.0, 1.0, 1.0],
                    [1.0, 5.0, 1.0, 1.0],
                    [1.0, 1.0, 1.0, 5.0]])
    assert wa.mutual_links(*wa.kernel_sinkhorn(sim)) == [(0, 0), (1, 1), (2, 3)]
    assert wa.xlmalign_align(sim, [0, 0, 1], [0, 0, 1, 1]) == [(0, 0), (1, 1)]


def test_joint_pieces_are_the_released_layout(spm_path):  # noqa: F811
    import sentencepiece as spm

    from xlm_jax.data.vocab import XLMRTokenizer

    sp = spm.SentencePieceProcessor(model_file=spm_path)
    src, tgt = ["unbelievably", "good"], ["a", "wonderful", "dog"]

    def fairseq_ids(word):  # piece strings -> fairseq ids: SentencePiece id + 1
        return [sp.piece_to_id(p) + 1 for p in sp.encode(word, out_type=str)]

    s_ids, t_ids = [fairseq_ids(w) for w in src], [fairseq_ids(w) for w in tgt]
    assert max(map(len, s_ids)) > 1  # a word in several pieces
    want = [0] + sum(s_ids, []) + [2] + sum(t_ids, []) + [2]  # <s> src </s> tgt </s>
    ids, src_of, tgt_of = wa.joint_pieces(XLMRTokenizer(spm_path), src, tgt)
    assert ids == want
    assert src_of == [w for w, p in enumerate(s_ids) for _ in p]
    assert tgt_of == [w for w, p in enumerate(t_ids) for _ in p]


def _hand_similarity(enc, src, tgt, layer, lang_ids=None):
    """Independent path: one unpadded joint row through `hidden_states`, then dot products."""
    tok = enc.tokenizer
    s_ids = [i for w in src for i in tok.encode(w)]
    t_ids = [i for w in tgt for i in tok.encode(w)]
    ids = np.array([[tok.bos_id] + s_ids + [tok.eos_id] + t_ids + [tok.eos_id]], np.int32)
    h = enc.hidden_states(ids, lang_ids=lang_ids)[layer, 0].astype(np.float64)
    ns = len(s_ids)
    return h[1:1 + ns] @ h[ns + 2:ns + 2 + len(t_ids)].T, ns, len(t_ids)


def test_joint_similarities_against_hidden_states(encoder, lang_model):  # noqa: F811
    from xlm_jax.data.features import language_index
    from xlm_jax.encoder import Encoder, default_language_list

    pairs = [(s.split(), t.split()) for s, t in zip(ENGLISH[:3], reversed(ENGLISH[3:6]))]
    got = wa.joint_similarities(encoder, pairs, layer=1, batch_size=2)
    for (sim, src_of, tgt_of), (src, tgt) in zip(got, pairs):
        want, ns, nt = _hand_similarity(encoder, src, tgt, 1)
        assert sim.shape == (ns, nt) == (len(src_of), len(tgt_of))
        np.testing.assert_allclose(sim, want, rtol=1e-4, atol=1e-5)
    cfg, params, spm = lang_model
    enc = Encoder(cfg, params, spm)
    src, tgt = pairs[0]
    (sim, _, _), = wa.joint_similarities(enc, [(src, tgt)], 1, src_lang="de", tgt_lang="fr")
    de, fr = (language_index(x, default_language_list()) for x in ("de", "fr"))
    ns = sum(len(enc.tokenizer.encode(w)) for w in src)
    nt = sum(len(enc.tokenizer.encode(w)) for w in tgt)
    lang = np.array([[de] * (ns + 2) + [fr] * (nt + 1)])  # <s> src </s> | tgt </s>
    np.testing.assert_allclose(sim, _hand_similarity(enc, src, tgt, 1, lang)[0], rtol=1e-4,
                               atol=1e-5)
    all_de = _hand_similarity(enc, src, tgt, 1, np.full(lang.shape, de))[0]
    assert not np.allclose(sim, all_de, rtol=1e-4, atol=1e-5)


PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")


def test_cli_xlmalign_end_to_end(model_dir, encoder, tmp_path, capsys):  # noqa: F811
    src_lines = ENGLISH[:5]
    tgt_lines = [" ".join(reversed(s.split())) for s in ENGLISH[:5]]
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("\n".join(src_lines) + "\n")
    tgt.write_text("\n".join(tgt_lines) + "\n")
    out = tmp_path / "out.pharaoh"
    base = ["--checkpoint", model_dir, "--src", str(src), "--tgt", str(tgt), "--layer", "2",
            "--out", str(out), "--method", "xlmalign"]
    assert wa.main(base) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and "5 sentence pairs" in capsys.readouterr().out
    for line, s, t in zip(lines, src_lines, tgt_lines):
        assert PHARAOH.match(line), line
        links = [tuple(map(int, x.split("-"))) for x in line.split()]
        assert links and all(0 <= i < len(s.split()) and 0 <= j < len(t.split())
                             for i, j in links)
        # Independently: hand-built joint row, numpy loop normalisation, mutual, lifted.
        sim, _, _ = _hand_similarity(encoder, s.split(), t.split(), 2)
        pi, xi = _kernel_loop(sim, 2)
        s_of = [w for w, x in enumerate(s.split()) for _ in encoder.tokenizer.encode(x)]
        t_of = [w for w, x in enumerate(t.split()) for _ in encoder.tokenizer.encode(x)]
        want = {(s_of[i], t_of[j]) for i, j in enumerate(pi.argmax(axis=1))
                if xi[:, j].argmax() == i}
        assert links == sorted(want)
    assert "error: --eps applies to --method sinkhorn only" == _error(capsys, base + ["--eps",
                                                                                     "0.1"])
    assert "--extraction" in _error(capsys, base + ["--extraction", "mutual"])
    src.write_text("\n".join(src_lines[:2] + [" ".join(["word"] * 30)]) + "\n")
    tgt.write_text("\n".join(tgt_lines[:3]) + "\n")  # 31 + 1 + 9 + ... tokens > 40
    err = _error(capsys, base)
    assert err.startswith(f"error: {src}:3 + {tgt}:3: ") and "more than max_length 40" in err


def test_cli_xlmalign_identical_sentences_give_the_diagonal(spm_path, spm_dir, tmp_path,
                                                            capsys):  # noqa: F811
    """With no position embeddings a token and its copy in `<s> x </s> x </s>` get the same
    states at every layer (attention is permutation-equivariant). The last layer's post-LN
    states (scale 1) then have equal norms, so a token's largest dot product is with its copy
    (if no piece repeats in the sentence), and a constant LN bias b adds D*b^2 >= D to every
    dot product, keeping the kernel non-negative, as XLM-R's states keep theirs."""
    import copy

    from xlm_jax.convert import hf
    from xlm_jax.data.vocab import XLMRTokenizer
    from retrieval_test import _tiny_model

    cfg, params = _tiny_model(spm_path)
    params = copy.deepcopy(params)
    params["embeddings"]["position_embeddings"]["embedding"][:] = 0.0
    last = params[f"layers_{cfg.num_layers - 1}"]["mlp_norm"]
    assert np.all(last["scale"] == 1.0)
    last["bias"][:] = 1.0
    model = tmp_path / "m"
    hf.save_xlm_jax(str(model), cfg, params, spm_from=spm_dir)
    tok = XLMRTokenizer(spm_path)
    sents = [s for s in ENGLISH
             if len({i for w in s.split() for i in tok.encode(w)})
             == sum(len(tok.encode(w)) for w in s.split())]
    assert len(sents) >= 3 and any(len(tok.encode(w)) > 1 for s in sents for w in s.split())
    f = tmp_path / "s.txt"
    f.write_text("\n".join(sents) + "\n")
    out = tmp_path / "o.pharaoh"
    assert wa.main(["--checkpoint", str(model), "--src", str(f), "--tgt", str(f), "--layer",
                    str(cfg.num_layers), "--out", str(out), "--method", "xlmalign"]) == 0
    want = [" ".join(f"{i}-{i}" for i in range(len(s.split()))) for s in sents]
    assert out.read_text().splitlines() == want
