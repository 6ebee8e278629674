"""Synthetic batches: same layout as the real converters, deterministic, TensorFlow-free.

An independent row checker (written from the feature contract) is applied to synthetic
batches AND to real converted batches from temp corpora, so both must follow one format.
"""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from xlm_jax.data import synthetic
from xlm_jax.data.features import example_kind, feature_names

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KINDS = ("mono", "pair", "split_pair", "mixup_pair")
PREFIXES = {"mono": [""], "pair": [""], "split_pair": ["x_", "y_"],
            "mixup_pair": ["query_", "key_"]}
PAIR_ROWS = ("pair", "mixup_pair")  # rows of `<s> a </s></s> b </s>` pairs


def check_rows(batch, prefix, vocab_size, pair_format, eos_inside=False):
    """Asserts the contract on every row; returns the number of packed examples seen."""
    ids, pos = batch[prefix + "input_ids"], batch[prefix + "positions"]
    seg = batch[prefix + "segment_ids"]
    side, lang = batch[prefix + "pair_side"], batch[prefix + "lang_ids"]
    examples = 0
    for r in range(ids.shape[0]):
        real = seg[r] > 0
        n = int(real.sum())
        assert real[:n].all() and not real[n:].any(), "padding must be at the end"
        assert (ids[r, n:] == 1).all() and not pos[r, n:].any() and not side[r, n:].any()
        assert not lang[r, n:].any()
        for s in range(1, int(seg[r].max()) + 1):
            where = np.nonzero(seg[r] == s)[0]
            assert (np.diff(where) == 1).all(), "a packed example is contiguous"
            x, p, sd, lg = ids[r, where], pos[r, where], side[r, where], lang[r, where]
            assert p.tolist() == list(range(len(where))), "positions restart at 0"
            assert x[0] == 0 and x[-1] == 2, "<s> ... </s>"
            assert (lg > 0).all()
            if pair_format:
                # <s> a </s></s> b </s>: exactly one '</s></s>' junction, sides 1 then 2
                junction = [i for i in range(1, len(x) - 1) if x[i] == 2 and x[i + 1] == 2]
                assert len(junction) == 1, x
                j = junction[0]
                assert (sd[: j + 1] == 1).all() and (sd[j + 1:] == 2).all()
                assert len(set(lg[: j + 1])) == 1 and len(set(lg[j + 1:])) == 1
                inner = np.concatenate([x[1:j], x[j + 2:-1]])
            else:
                assert (sd == 1).all() and len(set(lg)) == 1
                inner = x[1:-1]
            ok = (inner >= 4) & (inner < vocab_size - 1)
            if eos_inside:  # monolingual segments keep the </s> between documents
                ok |= inner == 2
            assert ok.all(), inner
            examples += 1
    return examples


@pytest.mark.parametrize("kind", KINDS)
def test_synthetic_layout(kind):
    batch = synthetic.synthetic_batch(16, 64, 1000, kind, seed=3, pad_fraction=0.2,
                                      num_languages=5)
    assert sorted(batch) == sorted(feature_names(kind))
    assert all(v.shape == (16, 64) and v.dtype == np.int32 for v in batch.values())
    for prefix in PREFIXES[kind]:
        n = check_rows(batch, prefix, 1000, pair_format=kind in PAIR_ROWS)
        assert n >= 16
        assert batch[prefix + "lang_ids"].max() <= 5
    if kind == "pair":  # packed: several pairs per row
        assert (batch["segment_ids"].max(axis=1) > 1).any()


def test_old_kind_names_are_aliases_of_the_same_records():
    """`veco` and `mixup` (the names before) give exactly the batches of split_pair and
    mixup_pair: they resolve to the same records."""
    for old, new in (("veco", "split_pair"), ("mixup", "mixup_pair")):
        assert example_kind(old) is example_kind(new)
        a = synthetic.synthetic_batch(4, 16, 100, old, seed=5)
        b = synthetic.synthetic_batch(4, 16, 100, new, seed=5)
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_unknown_kind_is_a_one_line_error_naming_the_valid_kinds():
    with pytest.raises(ValueError) as e:
        synthetic.synthetic_batch(4, 16, 100, "bilingual")
    assert str(e.value) == (
        "synthetic_batch: unknown example kind 'bilingual': expected one of mono, pair, "
        "split_pair, mixup_pair (old names: veco = split_pair, mixup = mixup_pair)")


def test_pad_fraction_and_full_rows():
    batch = synthetic.synthetic_batch(256, 128, 500, "mono", seed=0, pad_fraction=0.25)
    assert abs((batch["input_ids"] == 1).mean() - 0.25) < 0.03
    full = synthetic.synthetic_batch(8, 32, 500, "mono", seed=0, pad_fraction=0.0)
    assert (full["segment_ids"] == 1).all()


def test_deterministic_and_resumable():
    a = synthetic.synthetic_batch(4, 32, 100, "pair", seed=1)
    b = synthetic.synthetic_batch(4, 32, 100, "pair", seed=1)
    c = synthetic.synthetic_batch(4, 32, 100, "pair", seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    stream = synthetic.synthetic_batches(4, 32, 100, "split_pair", seed=9)
    first = [next(stream) for _ in range(6)]
    resumed = synthetic.synthetic_batches(4, 32, 100, "split_pair", seed=9, start_step=4)
    for k in (4, 5):
        got = next(resumed)
        assert all(np.array_equal(got[key], first[k][key]) for key in got)
    assert not np.array_equal(first[0]["x_input_ids"], first[1]["x_input_ids"])


def test_synthetic_features_and_pipeline_modules_do_not_import_tensorflow():
    code = ("import sys, xlm_jax.data.synthetic, xlm_jax.data.features, xlm_jax.data.pipeline; "
            "bad = [m for m in ('tensorflow', 'seqio', 'tensorflow_text') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_real_converted_batches_follow_the_same_contract(tmp_path, train_xlmr_spm,
                                                         seqio_isolated):
    """The checker above also accepts what the real pipelines produce (so synthetic == real
    in layout), for all four kinds."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("sentencepiece")
    from xlm_jax.data import registry  # pylint: disable=import-outside-toplevel
    from xlm_jax.data.pipeline import make_batch_iterator  # pylint: disable=import-outside-toplevel

    rnd = random.Random(0)
    words = {l: [f"{l}{i}" for i in range(10)] for l in ("en", "fr", "de")}

    def sent(lang):
        return " ".join(rnd.choice(words[lang]) for _ in range(rnd.randint(2, 8)))

    (tmp_path / "spm.txt").write_text("\n".join(sent(l) for l in words for _ in range(80)))
    spm_path = train_xlmr_spm(tmp_path / "spm.txt", tmp_path / "spm", 50)
    for lang in ("en", "fr"):
        (tmp_path / f"{lang}.txt").write_text(
            "".join("\n".join(sent(lang) for _ in range(3)) + "\n\n" for _ in range(10)))
    for tgt in ("fr", "de"):
        pairs = [(sent("en"), sent(tgt)) for _ in range(20)]
        (tmp_path / f"en-{tgt}.en").write_text("".join(a + "\n" for a, _ in pairs))
        (tmp_path / f"en-{tgt}.{tgt}").write_text("".join(b + "\n" for _, b in pairs))
    registry.register_monolingual("syn_mono", str(tmp_path), ["en", "fr"], spm_path)
    registry.register_monolingual("syn_split", str(tmp_path), ["en", "fr"], spm_path,
                                  kind="split_pair")
    registry.register_parallel("syn_pair", str(tmp_path), ["en-fr", "en-de"], spm_path)
    registry.register_parallel("syn_mixup", str(tmp_path), ["en-fr", "en-de"], spm_path,
                               kind="mixup_pair")
    vocab_size = registry.get_provider("syn_mono_en").output_features["input_ids"] \
        .vocabulary.vocab_size
    for kind, name in (("mono", "syn_mono"), ("split_pair", "syn_split"), ("pair", "syn_pair"),
                       ("mixup_pair", "syn_mixup")):
        batch = next(make_batch_iterator(name, 8, 48, seed=0))
        assert sorted(batch) == sorted(feature_names(kind))
        # the shapes and dtypes too: the trainer compiles its first step for these
        # (setup.batch_specs) before the real batch exists (train.compile_ahead)
        assert all(v.shape == (8, 48) and v.dtype == np.int32 for v in batch.values())
        for prefix in PREFIXES[kind]:
            check_rows(batch, prefix, vocab_size, pair_format=kind in PAIR_ROWS,
                       eos_inside=kind not in PAIR_ROWS)
        if kind == "pair":
            assert (batch["segment_ids"].max(axis=1) > 1).any()
