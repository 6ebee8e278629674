"""Mixture sampling: observed language frequencies over 30k examples vs n^a / sum n^a.

Three temp corpora of very different sizes; the sizes n are recounted here independently
(plain file reading + the TF-free `XLMRTokenizer`), the rates come from the formula, and the
observed frequencies from the real seqio mixture (`inspect.mixture_frequencies`).
"""

import math
import random

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sentencepiece")

from xlm_jax.data import inspect as data_inspect  # noqa: E402
from xlm_jax.data import registry  # noqa: E402
from xlm_jax.data.vocab import XLMRTokenizer, get_vocabulary  # noqa: E402

DOCS = {"en": 300, "fr": 30, "sw": 3}  # documents per language: ~100x between largest/smallest
NUM_EXAMPLES = 30_000
# |z| bound per member; at 4.5 a correct sampler fails one member check in ~150k (the seeds
# are fixed, so a given run passes or fails every time). Measured |z| here: at most 2.55.
Z_MAX = 4.5


# seqio's registries put back after each test: the tests register tasks (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, train_xlmr_spm):
    root = tmp_path_factory.mktemp("sampling")
    rnd = random.Random(0)
    words = {lang: [f"{lang}{i}" for i in range(12)] for lang in DOCS}
    (root / "spm.txt").write_text(
        "\n".join(" ".join(rnd.choice(words[l]) for _ in range(6)) for l in DOCS
                  for _ in range(100)))
    train_xlmr_spm(root / "spm.txt", root / "spm", 50)
    tok = XLMRTokenizer(str(root / "spm.model"))
    sizes = {}
    for lang, n_docs in DOCS.items():
        docs = [[" ".join(rnd.choice(words[lang]) for _ in range(rnd.randint(3, 8)))
                 for _ in range(rnd.randint(1, 3))] for _ in range(n_docs)]
        (root / f"{lang}.txt").write_text("".join("\n".join(d) + "\n\n" for d in docs))
        # independent size: pieces of every line + one </s> per document
        sizes[lang] = sum(len(tok.encode(s)) for d in docs for s in d) + len(docs)
    return {"dir": str(root), "vocab": get_vocabulary(str(root / "spm.model")), "sizes": sizes}


@pytest.mark.parametrize("alpha", [0.3, 0.7, 1.0])
def test_observed_frequencies_match_smoothed_rates(corpus, alpha):
    name = f"samp_{str(alpha).replace('.', '')}"
    reg = registry.register_monolingual(name, corpus["dir"], list(DOCS), corpus["vocab"],
                                        alpha=alpha)
    assert {k: s.tokens for k, s in reg.stats.items()} == corpus["sizes"]
    total = sum(n ** alpha for n in corpus["sizes"].values())
    expected = {f"{name}_{lang}": n ** alpha / total for lang, n in corpus["sizes"].items()}
    rows = data_inspect.mixture_frequencies(name, NUM_EXAMPLES, sequence_length=8,
                                            seed=int(alpha * 10))
    assert sum(r.count for r in rows) == NUM_EXAMPLES
    assert sorted(r.task for r in rows) == sorted(expected)
    for r in rows:
        assert r.expected == pytest.approx(expected[r.task], abs=1e-12)
        # Each example picks its member independently: the count is Binomial(N, p). A count
        # more than Z_MAX standard deviations from N p fails. Every member's N p is >= 100
        # (asserted), so a member never sampled (z <= -10) or sampled at half or double its
        # rate (|z| >= 5) fails. (An absolute 0.02 bound passed both for the alpha=1 smallest
        # language, whose rate is ~0.01.)
        p = expected[r.task]
        assert NUM_EXAMPLES * p >= 100, (alpha, r)
        z = (r.count - NUM_EXAMPLES * p) / math.sqrt(NUM_EXAMPLES * p * (1 - p))
        assert abs(z) < Z_MAX, (alpha, r, z)
    if alpha == 1.0:  # the sizes really differ: the smallest language is rare without smoothing
        assert min(expected.values()) < 0.02 and max(expected.values()) > 0.85
