"""Determinism and exact resumption of `make_batch_iterator`.

1. Two FRESH python processes (different PYTHONHASHSEED) build the same pipelines and print
   a hash of their first 100 batches: the hashes must match, and another seed must differ.
2. In-process: an iterator started at step k yields exactly batches k, k+1, ... of an
   uninterrupted one (monolingual mixture, packed pair mixture, mixup task).
"""

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sentencepiece")

from tests.testlib import process_state  # noqa: E402
from xlm_jax.data.pipeline import make_batch_iterator  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

REGISTER = textwrap.dedent("""
    import sys
    from xlm_jax.data import registry

    def register(root):
        spm_path = root + "/spm.model"
        registry.register_monolingual("det_mono", root + "/mono", ["en", "fr", "sw"], spm_path,
                                      alpha=0.5)
        registry.register_parallel("det_par", root + "/par", ["en-fr", "en-sw"], spm_path)
        registry.register_parallel("det_mix", root + "/par", ["en-fr", "en-sw"], spm_path,
                                   kind="mixup_pair")
""")

HASH_SCRIPT = REGISTER + textwrap.dedent("""
    import hashlib
    from xlm_jax.data.pipeline import make_batch_iterator

    register(sys.argv[1])
    for name in ("det_mono", "det_par", "det_mix"):
        for seed, num_batches in ((0, 100), (1, 5)):
            h = hashlib.sha256()
            it = make_batch_iterator(name, 4, 32, seed=seed)
            for step in range(1, num_batches + 1):
                batch = next(it)
                for key in sorted(batch):
                    h.update(key.encode())
                    h.update(batch[key].tobytes())
                if step in (5, 100):  # hash of the first 5 and of the first 100 batches
                    print(f"HASH {name} {seed}x{step} {h.hexdigest()}")
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, train_xlmr_spm):
    root = tmp_path_factory.mktemp("det")
    rnd = random.Random(0)
    words = {l: [f"{l}{i}" for i in range(15)] for l in ("en", "fr", "sw")}

    def sent(lang):
        return " ".join(rnd.choice(words[lang]) for _ in range(rnd.randint(2, 9)))

    (root / "spm.txt").write_text("\n".join(sent(l) for l in words for _ in range(100)))
    train_xlmr_spm(root / "spm.txt", root / "spm", 60)
    (root / "mono").mkdir()
    for lang, n in (("en", 40), ("fr", 15), ("sw", 5)):
        (root / "mono" / f"{lang}.txt").write_text(
            "".join("\n".join(sent(lang) for _ in range(rnd.randint(1, 4))) + "\n\n"
                    for _ in range(n)))
    (root / "par").mkdir()
    for tgt, n in (("fr", 30), ("sw", 10)):
        pairs = [(sent("en"), sent(tgt)) for _ in range(n)]
        (root / "par" / f"en-{tgt}.en").write_text("".join(a + "\n" for a, _ in pairs))
        (root / "par" / f"en-{tgt}.{tgt}").write_text("".join(b + "\n" for _, b in pairs))
    (root / "hash_batches.py").write_text(HASH_SCRIPT)
    ns = {}
    exec(REGISTER, ns)  # pylint: disable=exec-used
    # the same registrations in this process, for the module's tests; gone after them
    with process_state.restored("seqio"):
        ns["register"](str(root))
        yield str(root)


def test_same_seed_same_batches_in_two_fresh_processes(corpus):
    procs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(corpus, "hash_batches.py"), corpus], cwd=REPO,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outputs.append(sorted(line for line in out.splitlines() if line.startswith("HASH")))
    assert len(outputs[0]) == 9
    assert outputs[0] == outputs[1]  # same first 100 batches in both processes
    hashes = {tuple(line.split()[1:3]): line.split()[3] for line in outputs[0]}
    for name in ("det_mono", "det_par", "det_mix"):  # another seed gives other batches
        assert hashes[(name, "0x5")] != hashes[(name, "1x5")], name


@pytest.mark.parametrize("name", ["det_mono", "det_par"])
def test_shared_traces_give_the_batches_of_per_task_traces(corpus, name, monkeypatch):
    """The start-up speed-ups must not change the stream: one traced tokenizer / pair function
    shared by all Tasks (`preprocessors._shared_fn`) and one eagerly built
    SentencePiece resource per vocabulary give exactly the batches of per-Task traces that
    build their own tokenizer (seqio's `tf_tokenizer`), as before these were introduced."""
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.data import preprocessors as prep  # pylint: disable=g-import-not-at-top
    from xlm_jax.data import registry  # pylint: disable=g-import-not-at-top

    def take(n):
        it = make_batch_iterator(name, 4, 32, seed=5)
        return [next(it) for _ in range(n)]

    shared = take(25)
    provider = registry.get_provider(name)
    vocab_cls = type(provider.output_features["input_ids"].vocabulary)
    monkeypatch.setattr(prep, "_shared_fn",
                        lambda fn, *params: lambda *args: fn(*args, *params))
    monkeypatch.setattr(vocab_cls, "tf_tokenizer", seqio.SentencePieceVocabulary.tf_tokenizer)
    per_task = take(25)
    for k, (a, b) in enumerate(zip(shared, per_task)):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name} {k} {key}")


@pytest.mark.parametrize("name", ["det_mono", "det_par", "det_mix"])
def test_restart_at_step_k_continues_exactly(corpus, name):
    full = make_batch_iterator(name, 4, 32, seed=3)
    reference = [next(full) for _ in range(30)]
    resumed = make_batch_iterator(name, 4, 32, seed=3, start_step=17)
    for k in range(17, 30):
        got = next(resumed)
        assert sorted(got) == sorted(reference[k])
        for key in got:
            np.testing.assert_array_equal(got[key], reference[k][key], err_msg=f"{name} {k} {key}")
    # and the stream really moves: batch 17 is not batch 16
    ids = next(k for k in reference[0] if k.endswith("input_ids"))
    assert not np.array_equal(reference[17][ids], reference[16][ids])
