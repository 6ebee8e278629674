"""The blocked nearest-neighbour search against a stable sort of the whole similarity matrix
(numpy, float64): exact on ties, equal for every block size, and its bad inputs."""
import numpy as np
import pytest

from xlm_jax.evaluation import nearest


def _reference(ux, uy, k):
    """numpy: each row's k best by a stable sort of the whole matrix, both directions."""
    sims = ux.astype(np.float64) @ uy.astype(np.float64).T
    kx, ky = min(k, len(uy)), min(k, len(ux))
    fwd = np.argsort(-sims, axis=1, kind="stable")[:, :kx]
    bwd = np.argsort(-sims.T, axis=1, kind="stable")[:, :ky]
    return (np.take_along_axis(sims, fwd, 1), fwd), (np.take_along_axis(sims.T, bwd, 1), bwd)


def _tied(n, d=8, seed=0):
    """Rows with four entries of +-1 (norm 2): unit entries +-0.5, every cosine a multiple of
    1/4, exact in float32 whatever the order of the sums; many rows repeated (ties)."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((n, d))
    for r in rows:
        r[rng.choice(d, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    return np.vstack([rows, rows[: n // 2]])[rng.permutation(n + n // 2)]


@pytest.mark.parametrize("k", [1, 4, 200])
@pytest.mark.parametrize("block", [5, 16, 4096])
def test_ties_keep_the_lower_index_first_as_a_stable_sort(k, block):
    x, y = _tied(26, seed=1), _tied(34, seed=2)  # 39 and 51 rows, blocks that do not divide
    x_nn, y_nn = nearest.mutual_nearest(x, y, k, block)
    (fs, fi), (bs, bi) = _reference(nearest.unit_rows(x), nearest.unit_rows(y), k)
    assert x_nn.index.shape == (39, min(k, 51)) and y_nn.index.shape == (51, min(k, 39))
    np.testing.assert_array_equal(x_nn.index, fi)
    np.testing.assert_array_equal(y_nn.index, bi)
    np.testing.assert_array_equal(x_nn.sims, fs)  # multiples of 1/4: exact
    np.testing.assert_array_equal(y_nn.sims, bs)
    # the data holds ties at each row's best cosine, so the order among them was tested
    sims = nearest.unit_rows(x).astype(np.float64) @ nearest.unit_rows(y).astype(np.float64).T
    assert ((sims == sims.max(axis=1, keepdims=True)).sum(axis=1) > 1).sum() > 10


@pytest.mark.parametrize("block", [7, 64, 4096])
def test_random_vectors_match_the_whole_matrix_and_every_block_size_agrees(block):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(130, 24)) + 0.3, rng.normal(size=(97, 24)) + 0.3
    x_nn, y_nn = nearest.mutual_nearest(x, y, 4, block)
    (fs, fi), (bs, bi) = _reference(nearest.unit_rows(x), nearest.unit_rows(y), 4)
    np.testing.assert_array_equal(x_nn.index, fi)
    np.testing.assert_array_equal(y_nn.index, bi)
    np.testing.assert_allclose(x_nn.sims, fs, rtol=0, atol=2e-6)
    np.testing.assert_allclose(y_nn.sims, bs, rtol=0, atol=2e-6)
    assert x_nn.sims.dtype == np.float32 and x_nn.index.dtype == np.int32
    # Normalising is part of the search: scaled rows have the same neighbours.
    scaled = nearest.mutual_nearest(x * rng.uniform(0.1, 10, size=(130, 1)), y, 4, block)[0]
    np.testing.assert_array_equal(scaled.index, x_nn.index)


def test_rows_are_normalised_in_float64_chunk_by_chunk():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(11, 6)).astype(np.float32) * 100
    want = (x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1,
                                                  keepdims=True)).astype(np.float32)
    np.testing.assert_array_equal(nearest.unit_rows(x), want)
    np.testing.assert_array_equal(nearest.unit_rows(x, chunk=3), want)
    with pytest.raises(ValueError, match=r"^x: 2 row\(s\) hold NaN or infinity$"):
        nearest.unit_rows(np.where(np.arange(11)[:, None] % 5 == 4, np.inf, x), chunk=3)


def test_bad_inputs_are_one_line_errors():
    x, y = np.ones((3, 4)), np.ones((5, 4))
    cases = [
        (lambda: nearest.mutual_nearest(x, y, 0), "k=0 must be an integer >= 1"),
        (lambda: nearest.mutual_nearest(x, y, 2.5), "k=2.5"),
        (lambda: nearest.mutual_nearest(x, y, 2, block=0), "block=0 must be"),
        (lambda: nearest.mutual_nearest(x, np.ones((5, 3)), 2), "x has 4-dimensional rows, y 3"),
        (lambda: nearest.mutual_nearest(np.ones((0, 4)), y, 2), "x: need a non-empty [N, D]"),
        (lambda: nearest.mutual_nearest(x, np.ones(4), 2), "y: need a non-empty [N, D] array"),
        (lambda: nearest.mutual_nearest(x, np.where(np.eye(5, 4), np.nan, 1.0), 2),
         "y: 4 row(s) hold NaN or infinity"),
    ]
    for fn, words in cases:
        with pytest.raises(ValueError) as info:
            fn()
        assert words in str(info.value) and "\n" not in str(info.value), str(info.value)
