"""An error inside the input pipeline ends the process at once, with one line naming the file
(issue 54): a prepared index entry that goes backwards used to print a TensorFlow traceback
and then hang `bench --pipeline` at exit until killed (tf.data's iterator waiting, at shutdown,
for map calls that wait for Python; `cli_help.exit_with`). Here the trainer and `bench
--pipeline` read a damaged copy of a real preparation, each in a process of its own; a hang
fails the test by its timeout."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from tests.testlib.cli_run import ROOT, env
from xlm_jax.data.prepared import shard_index

pytestmark = pytest.mark.usefixtures("seqio_isolated")

TIMEOUT = 150  # seconds; a process that hangs is killed here and the test fails


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """(corpus root, a preparation of every `pd_*` task whose German and French shards each
    have a second record that ends before it starts, the damaged index files)."""
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        pc.prepare_here(root, out)
    bad = os.path.join(root, "damaged")
    shutil.copytree(out, bad)
    paths = []
    for task in ("pd_mono_de", "pd_mono_fr"):
        member = os.path.join(bad, task, task[-2:])
        for name in sorted(os.listdir(member)):
            if name.endswith(".idx"):
                index = np.fromfile(os.path.join(member, name), "<i8")
                offsets = index[shard_index.HEADER_BYTES // 8:]  # after the header (a view)
                if len(offsets) > 2:
                    offsets[1] = offsets[2] + 8
                    index.tofile(os.path.join(member, name))
                    paths.append(os.path.join(member, name))
    assert paths
    return root, bad, paths


def _run(root, *args):
    return subprocess.run([sys.executable, "-m", *args], cwd=root, capture_output=True,
                          text=True, timeout=TIMEOUT,
                          env=env(PYTHONPATH=os.pathsep.join([root, ROOT])))


def _one_line(r, paths):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: PreparedError: "), lines
    assert any(lines[0].startswith(f"error: PreparedError: {p}: record 1 ends at byte ")
               for p in paths), lines
    assert "xlm_jax.data.prepared.verify" in lines[0]


def test_bench_pipeline_exits_with_one_line_naming_the_index(damaged):
    root, bad, paths = damaged
    r = _run(root, "xlm_jax.accelerator.bench", "--pipeline", "pd_mono_de", "--module",
             pc.MODULE, "--prepared", bad, "--batches", "200")
    _one_line(r, paths)


def test_the_trainer_exits_with_one_line_naming_the_index(damaged, tmp_path):
    root, bad, paths = damaged
    r = _run(root, "xlm_jax.train", "--gin_file=demo/mmlm_tlm.gin",
             f"--model_dir={tmp_path / 'run'}", "--gin.TRAIN_STEPS=60",
             "--gin.MONO_TASK='pd_mono'", "--gin.PAIR_TASK='pd_pairs'",
             f"--gin.loop.train.task_modules=['{pc.MODULE}']",
             f"--gin.loop.train.spm_model='{pc.SPM}'",
             f"--gin.loop.train.prepared_data='{bad}'")
    _one_line(r, paths)


def test_the_original_exception_is_read_out_of_tensorflows_error():
    """`cli_help.pipeline_error` on the error a real tf.data map raises for a Python
    exception: its type and message, not TensorFlow's; other errors are not unwrapped."""
    tf = pytest.importorskip("tensorflow")
    from xlm_jax import cli_help
    from xlm_jax.data.prepared.shard_files import PreparedError

    def read(i):
        if i == 3:
            raise PreparedError("/data/x.idx: record 3 ends at byte 8, before its start 12")
        return i

    ds = tf.data.Dataset.range(8).map(
        lambda i: tf.numpy_function(read, [i], tf.int64), num_parallel_calls=2).batch(4)
    with pytest.raises(tf.errors.OpError) as caught:
        list(ds.as_numpy_iterator())
    inner = cli_help.pipeline_error(caught.value)
    assert inner is not None and inner.kind == "PreparedError"
    assert cli_help.error_line(inner) == (
        "error: PreparedError: /data/x.idx: record 3 ends at byte 8, before its start 12")
    assert cli_help.pipeline_error(ValueError("PreparedError: not from TensorFlow")) is None
