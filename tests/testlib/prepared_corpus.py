"""A small corpus of the demo's text, a task module registering it, and its preparation with
`python -m xlm_jax.data.prepared.prepare` on Beam's DirectRunner (2 workers), for the prepared-data
tests.

The corpus mixes the layouts `prepare` splits differently: German monolingual text as plain
text (cut into byte ranges at document boundaries), French as the shipped `.xz` (one unit),
en-de as the shipped line-aligned `.xz` pair (one unit) and en-fr as a plain TSV (cut into
byte ranges at lines). `prep_tasks.py` registers four tasks of every kind over them."""
from __future__ import annotations

import contextlib
import lzma
import os
import shutil
import subprocess
import sys

from tests.testlib import temp_modules
from tests.testlib.cli_run import ROOT, env

DEMO = os.path.join(ROOT, "tasks", "demo_data")
SPM = os.path.join(DEMO, "spm.model")
MODULE = "prep_tasks"
PATTERN = "pd_*"
LENGTH = 64

TASK_MODULE = '''\
import os

from xlm_jax.data import registry
from xlm_jax.data.vocab import get_vocabulary

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = get_vocabulary({spm!r})
MONO, PARALLEL = os.path.join(HERE, "mono"), os.path.join(HERE, "parallel")
REGISTRATIONS = {{
    "pd_mono": registry.register_monolingual("pd_mono", MONO, ["de", "fr"], VOCAB,
                                             sequence_length={length}, shuffle_buffer_size=16),
    "pd_veco": registry.register_monolingual("pd_veco", MONO, ["de"], VOCAB, kind="split_pair",
                                             sequence_length={length}, shuffle_buffer_size=16),
    "pd_pairs": registry.register_parallel("pd_pairs", PARALLEL, ["en-de", "en-fr"], VOCAB,
                                           sequence_length={length}, shuffle_buffer_size=16),
    "pd_mixup": registry.register_parallel("pd_mixup", PARALLEL, ["en-de", "en-fr"], VOCAB,
                                           kind="mixup_pair", sequence_length={length},
                                           shuffle_buffer_size=16),
}}
'''


def _text(path: str) -> str:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return f.read()


def write(root: str) -> str:
    """The corpus and `root/prep_tasks.py`; returns `root`."""
    mono, parallel = os.path.join(root, "mono"), os.path.join(root, "parallel")
    os.makedirs(mono)
    os.makedirs(parallel)
    with open(os.path.join(mono, "de.txt"), "w", encoding="utf-8") as f:
        f.write(_text(os.path.join(DEMO, "mono", "de.txt.xz")))
    shutil.copy(os.path.join(DEMO, "mono", "fr.txt.xz"), mono)
    for lang in ("en", "de"):
        shutil.copy(os.path.join(DEMO, "parallel", f"en-de.{lang}.xz"), parallel)
    en, fr = (_text(os.path.join(DEMO, "parallel", f"en-fr.{x}.xz")).splitlines()
              for x in ("en", "fr"))
    with open(os.path.join(parallel, "en-fr.tsv"), "w", encoding="utf-8") as f:
        f.write("".join(f"{a}\t{b}\n" for a, b in zip(en, fr)))
    with open(os.path.join(root, f"{MODULE}.py"), "w", encoding="utf-8") as f:
        f.write(TASK_MODULE.format(spm=SPM, length=LENGTH))
    return root


def prepare(root: str, output_dir: str, *extra: str, split_bytes: int = 8192,
            pattern: str = PATTERN, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m xlm_jax.data.prepared.prepare` over the tasks of `root/prep_tasks.py`, in `root`,
    on the DirectRunner in its multi-processing mode (the command's default) with one worker
    process: each worker process imports Beam and TensorFlow (~4 s of CPU; the suite started
    40 of them), and the tests of two workers at once (prepare_kill_test, prepare_lock_test,
    the documented command of adding_a_corpus_test, one per core) start their own."""
    return subprocess.run(
        [sys.executable, "-m", "xlm_jax.data.prepared.prepare", "--module", MODULE, "--tasks", pattern,
         "--output_dir", output_dir, "--split_bytes", str(split_bytes),
         "--direct_num_workers=1", *extra],
        cwd=root, env=env(PYTHONPATH=os.pathsep.join([root, ROOT])), capture_output=True,
        text=True, timeout=timeout)


def prepare_here(root: str, output_dir: str, pattern: str = PATTERN,
                 split_bytes: int = 8192) -> None:
    """The same preparation in this process, its units run one after the other instead of on
    Beam (`prepare.prepare`'s `run_units`): for tests whose subject is reading prepared data."""
    import importlib  # pylint: disable=g-import-not-at-top
    import io  # pylint: disable=g-import-not-at-top

    from xlm_jax.data.prepared import prepare as prepare_lib  # pylint: disable=g-import-not-at-top
    from xlm_jax.data.prepared import choice  # pylint: disable=g-import-not-at-top
    from xlm_jax.data.prepared.prepare_worker import run_unit  # pylint: disable=g-import-not-at-top

    with on_path(root):
        with choice.preparing():
            importlib.reload(importlib.import_module(MODULE))
        prepare_lib.prepare([pattern], output_dir, split_bytes, out=io.StringIO(),
                            run_units=lambda items, _: [run_unit(i) for i in items])


def on_path(root: str) -> contextlib.AbstractContextManager[None]:
    """`root` (where `write` put `prep_tasks.py`) first on sys.path for the block; after it,
    sys.path as before and the `prep_tasks` imported from `root` forgotten
    (`temp_modules.importable`). Inside, a tasks module registers its tasks when first
    imported, and a reload finds it on sys.path again; the next block imports its own
    `prep_tasks` over its own corpus."""
    return temp_modules.importable(root)


def tree(directory: str) -> dict[str, bytes]:
    """Every file under `directory` by relative path, with its bytes; not the lock file of
    `prepare` (`xlm_jax.data.prepared.prepare_lock`: who ran last, no data)."""
    from xlm_jax.data.prepared.prepare_lock import LOCK  # pylint: disable=g-import-not-at-top

    out = {}
    for dirpath, _, names in os.walk(directory):
        for name in names:
            if name == LOCK:
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out
