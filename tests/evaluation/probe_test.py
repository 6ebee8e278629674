"""The zero-shot transfer probe (`xlm_jax.evaluation.probe`): its logistic regression against
an independent Newton-method reference in numpy, its accuracies on synthetic embeddings whose
answer is known, and the demo transfer task's files with the one-line input errors."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from xlm_jax.data.xtreme_readers import PairExample
from xlm_jax.evaluation import probe

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_DATA = os.path.join(REPO_ROOT, "tasks", "demo_data")


# ----------------------------------------------------------------------------- the head

def _newton(x, y, num_classes, l2, iters=25):
    """The minimiser of mean softmax cross-entropy + l2/2 |W|^2 (bias free) by Newton's method
    in float64, on features standardised here (mean 0, standard deviation 1)."""
    x = (x - x.mean(0)) / x.std(0)
    n, f = x.shape
    ones = np.hstack([x, np.ones((n, 1))])
    targets = np.eye(num_classes)[y]
    theta = np.zeros((f + 1, num_classes))  # rows: features then the bias
    penalty = np.zeros((f + 1, num_classes))
    penalty[:f] = l2
    for _ in range(iters):
        z = ones @ theta
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = ones.T @ (p - targets) / n + penalty * theta
        hess = np.zeros(((f + 1) * num_classes,) * 2)
        for i in range(n):
            s = np.diag(p[i]) - np.outer(p[i], p[i])
            hess += np.kron(np.outer(ones[i], ones[i]), s) / n
        hess += np.diag(penalty.ravel()) + 1e-12 * np.eye(len(hess))
        theta -= np.linalg.lstsq(hess, grad.ravel(), rcond=None)[0].reshape(theta.shape)
    z = ones @ theta
    p = np.exp(z - z.max(1, keepdims=True))
    loss = (-np.log(p / p.sum(1, keepdims=True))[np.arange(n), y].mean()
            + 0.5 * l2 * np.sum(theta[:f] ** 2))
    return theta, loss, p / p.sum(1, keepdims=True)


@pytest.mark.parametrize("num_classes", [2, 3])
def test_the_head_is_the_regularised_optimum_of_a_newton_reference(num_classes):
    rng = np.random.default_rng(num_classes)
    x = rng.normal(size=(120, 6)) * rng.uniform(0.1, 5.0, size=6) + rng.normal(size=6)
    y = np.argmax(x[:, :num_classes] + rng.normal(size=(120, num_classes)), axis=1)
    l2 = 0.05
    head = probe.fit(x.astype(np.float32), y, num_classes, l2=l2, steps=100)
    theta, loss, p_ref = _newton(x, y, num_classes, l2)
    logits = head.logits(x.astype(np.float32))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(p, p_ref, atol=2e-4)
    xs = (x - x.mean(0)) / x.std(0)
    mine = float(probe.regularised_loss(head.w, head.b, xs.astype(np.float32), y, l2))
    assert mine == pytest.approx(loss, abs=1e-5)
    # The weights are unique (strictly convex in W; the bias only up to a shared shift).
    np.testing.assert_allclose(head.w, theta[:-1] - theta[:-1].mean(1, keepdims=True), atol=2e-3)
    # Regularisation matters: a weaker l2 gives another optimum.
    assert not np.allclose(_newton(x, y, num_classes, l2 / 10)[2], p_ref, atol=2e-4)


def test_fit_refuses_no_regularisation():
    with pytest.raises(ValueError, match="l2=0 must be > 0"):
        probe.fit(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]), 2, l2=0)


# ----------------------------------------------------------------------------- the probe

@dataclasses.dataclass
class _FakeEncoder:
    """Vectors looked up by sentence; counts the sentences it was asked to embed."""

    vectors: dict
    calls: list = dataclasses.field(default_factory=list)

    @property
    def config(self):
        return type("Config", (), {"num_languages": 0, "num_layers": 1,
                                   "hidden_size": len(next(iter(self.vectors.values())))})()

    def embed_layers(self, sentences, layers, pool="mean", max_length=None, batch_size=64,
                     lang=None, layer_norm="none"):
        self.calls.extend(sentences)
        return np.stack([self.vectors[s] for s in sentences])[None].repeat(len(layers), 0)


def _pairs(lang, side, concepts):
    """English `en:i` against `side:i` (label 1) and against `side:j` of the next concept
    (label 0)."""
    out = []
    for k, i in enumerate(concepts):
        j = concepts[(k + 1) % len(concepts)]
        out += [PairExample(f"en:{i}", f"{side}:{i}", "1", lang),
                PairExample(f"en:{i}", f"{side}:{j}", "0", lang)]
    return out


def test_probe_scores_transfer_on_embeddings_with_a_known_answer():
    """'near' renders each concept next to its English vector, 'far' at an unrelated one: an
    English-trained head transfers to the first (about 100%) and not to the second, whose
    pairs all look like near misses (50%); en is the training language's own test."""
    rng = np.random.default_rng(0)
    dim, n = 16, 60
    english = rng.normal(size=(n, dim)).astype(np.float32)
    vectors = {f"en:{i}": english[i] for i in range(n)}
    vectors.update({f"near:{i}": english[i] + 0.1 * rng.normal(size=dim).astype(np.float32)
                    for i in range(n)})
    vectors.update({f"far:{i}": rng.normal(size=dim).astype(np.float32) for i in range(n)})
    train, test = list(range(40)), list(range(40, 60))
    data = probe.ProbeData(("0", "1"), "en", _pairs("en", "en", train),
                           {"en": _pairs("en", "en", test), "near": _pairs("near", "near", test),
                            "far": _pairs("far", "far", test)})
    encoder = _FakeEncoder(vectors)
    result = probe.evaluate(encoder, data, layer=0)
    assert result.train_accuracy == 1.0
    assert result.accuracy["en"] == 1.0
    assert result.accuracy["near"] >= 0.95
    assert result.accuracy["far"] == pytest.approx(0.5, abs=0.1)
    assert result.average == pytest.approx((result.accuracy["near"] + result.accuracy["far"]) / 2)
    assert result.gap == pytest.approx(1.0 - result.average)
    # The score still ranks 'near' pairs (AUC ~1) but not 'far' ones (~0.5, chance).
    assert result.auc["near"] >= 0.95 and result.auc["far"] == pytest.approx(0.5, abs=0.2)
    assert result.auc_average == pytest.approx((result.auc["near"] + result.auc["far"]) / 2)
    scalars = result.scalars()
    assert set(scalars) == {"acc_en", "acc_near", "acc_far", "avg", "avg_se", "gap", "auc_avg",
                            "train_acc"}
    assert scalars["avg"] == pytest.approx(100 * result.average)
    # the binomial standard error of the mean of the two zero-shot accuracies
    n = {lang: len(exs) for lang, exs in data.test.items()}
    near, far = result.accuracy["near"], result.accuracy["far"]
    assert scalars["avg_se"] == pytest.approx(
        100 * np.sqrt(near * (1 - near) / n["near"] + far * (1 - far) / n["far"]) / 2)
    # Every distinct sentence is embedded once.
    assert sorted(encoder.calls) == sorted(set(encoder.calls))


def test_roc_auc_counts_ordered_pairs_and_half_the_ties():
    scores = np.array([0.9, 0.4, 0.4, 0.1, 0.8])
    labels = np.array([1, 1, 0, 0, 0])
    # positives 0.9 and 0.4 against negatives 0.4, 0.1, 0.8: 3 + (0.5 + 1) = 4.5 of 6
    assert probe.roc_auc(scores, labels) == pytest.approx(4.5 / 6)
    assert np.isnan(probe.roc_auc(scores, np.zeros(5)))


def test_pair_features_are_u_v_absdiff_product():
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 4.0]])
    np.testing.assert_array_equal(probe.pair_features(u, v), [[1, -2, 3, 4, 2, 6, 3, -8]])


# ----------------------------------------------------------------------------- the data

def test_reads_the_demo_transfer_task():
    data = probe.read_probe_data(DEMO_DATA)
    assert data.labels == ("0", "1") and data.train_language == "en"
    assert len(data.train) == 456 and {ex.lang for ex in data.train} == {"en"}
    assert len(data.test) == 31 and "en" in data.test and "de" in data.test
    small = probe.read_probe_data(DEMO_DATA, languages=["en", "de"], max_train=10, max_test=4)
    assert len(small.train) == 10 and {k: len(v) for k, v in small.test.items()} == {
        "en": 4, "de": 4}


def test_bad_probe_data_is_one_line_naming_it(tmp_path):
    def one_line(match, **kw):
        with pytest.raises(ValueError, match=match) as e:
            probe.read_probe_data(**kw)
        assert "\n" not in str(e.value)

    one_line(f"data_dir='{tmp_path / 'nowhere'}': not a directory",
             data_dir=str(tmp_path / "nowhere"))
    one_line("no pawsx directory", data_dir=str(tmp_path))
    one_line("task='udpos' is not a sentence-pair task", data_dir=DEMO_DATA, task="udpos")
    one_line("no pawsx test file for language 'xx'", data_dir=DEMO_DATA, languages=["de", "xx"])
    one_line("no test language besides the training language 'en'", data_dir=DEMO_DATA,
             languages=["en"])
    folder = tmp_path / "data" / "pawsx"
    folder.mkdir(parents=True)
    (folder / "train-en.tsv").write_text("a\tb\t1\nc\td\t0\n")
    (folder / "test-de.tsv").write_text("a\tb\nc\td\n")  # XTREME's test files: no labels
    one_line("test-de.tsv: no labels", data_dir=str(tmp_path / "data"))
