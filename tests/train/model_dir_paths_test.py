"""The model directory on a non-local filesystem: a training run on gs:// against a GCS
emulator on localhost, and the bad paths (unknown schemes, a filesystem package that is not
installed) that must fail in one line before anything is written.

The emulator and how each library reaches it: tests/testlib/gcs_emulator.py. Nothing here
is mocked.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from testlib import gcs_emulator
from testlib.gcs_emulator import gcs, google_auth_logging  # noqa: F401  (fixtures)
from testlib.tiny_run import TINY_MODEL, mlm_objectives, train_tiny
from testlib.xla_flags import xla_flags
from xlm_jax import model_dir as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPM = os.path.join(ROOT, "tasks", "demo_data", "spm.model")
BUCKET = gcs_emulator.BUCKET
_http, _objects = gcs_emulator.http, gcs_emulator.objects


def _tensorboard_losses(logdir: str, tmp_path) -> tuple[dict[int, float], int]:
    """({step: loss} of the event files in `logdir` (gs://), their count): the files are copied
    through the path layer and read by TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing import event_accumulator

    files = sorted(p for p in md.resolve(logdir).iterdir() if "tfevents" in p.name)
    local = tmp_path / "events"
    local.mkdir(exist_ok=True)
    for f in files:
        (local / f.name).write_bytes(f.read_bytes())
    acc = event_accumulator.EventAccumulator(str(local), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("loss")}, len(files)


def _jsonl_losses(model_dir: str) -> dict[int, float]:
    rows = [json.loads(line) for line in md.read_text(f"{model_dir}/{md.METRICS_FILE}")
            .splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_training_run_writes_reads_and_resumes_its_model_dir_on_gcs(gcs, tmp_path):
    import jax
    import orbax.checkpoint as ocp

    from xlm_jax.encoder import load_encoder

    model_dir = f"gs://{BUCKET}/runs/tiny"
    objectives = mlm_objectives(pair=False)
    first = train_tiny(model_dir, 2, save_every=2, objectives=objectives, spm_model=SPM)
    assert len(first.losses) == 2

    # The small files, read back through the same path layer.
    assert md.read_config(model_dir).hidden_size == TINY_MODEL["hidden_size"]
    assert md.read_json(f"{model_dir}/{md.RUN_INFO}")["process_count"] == 1
    assert md.resolve(f"{model_dir}/{md.OPERATIVE_CONFIG}").exists()
    with open(SPM, "rb") as f:
        assert md.resolve(md.find_spm(model_dir)).read_bytes() == f.read()
    assert _jsonl_losses(model_dir) == dict(zip([1, 2], first.losses))
    assert md.checkpoint_steps(model_dir) == [2]
    names = _objects(gcs, "runs/tiny/")
    assert f"runs/tiny/{md.CONFIG_NAME}" in names
    assert any(n.startswith("runs/tiny/checkpoints/2/state/") for n in names)

    # A second call resumes from the step-2 checkpoint on GCS and appends to the logs.
    out = io.StringIO()
    second = train_tiny(model_dir, 4, save_every=2, objectives=objectives, spm_model=SPM,
                        out=out)
    assert f"resumed from {model_dir} step 2" in out.getvalue()
    assert len(second.losses) == 2
    losses = _jsonl_losses(model_dir)
    assert losses == dict(zip([1, 2, 3, 4], first.losses + second.losses))  # run 1 kept
    tb, event_files = _tensorboard_losses(f"{model_dir}/train", tmp_path)
    assert event_files == 2 and sorted(tb) == [1, 2, 3, 4]
    np.testing.assert_allclose([tb[s] for s in range(1, 5)], [losses[s] for s in range(1, 5)],
                               rtol=1e-6)
    assert md.checkpoint_steps(model_dir) == [2, 4]

    # The encoder, loaded from the bucket, is the last checkpoint's encoder.
    enc = load_encoder(model_dir)
    assert enc.path == model_dir
    with ocp.StandardCheckpointer() as ckptr:
        saved = ckptr.restore(md.trainer_state_dir(model_dir, 4))["params"]["encoder"]
    got, want = ({jax.tree_util.keystr(p): np.asarray(v)
                  for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
                 for tree in (enc.params, saved))
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, name)
    hidden = enc.hidden_states(np.array([[0, 5, 6, 7, 2]]))
    assert hidden.shape == (TINY_MODEL["num_layers"] + 1, 1, 5, TINY_MODEL["hidden_size"])
    assert np.isfinite(hidden).all()
    assert not os.path.exists("gs:")  # nothing went to a local directory named like the URI


def test_metrics_log_on_gcs_is_visible_while_written_and_appended_on_restart(gcs):
    from xlm_jax.train import writers

    model_dir = f"gs://{BUCKET}/runs/metrics"
    w = writers.MetricsWriter(model_dir, out=io.StringIO())
    w.write_scalars(1, {"loss": 2.0})  # the first flush uploads at once
    assert _jsonl_losses(model_dir) == {1: 2.0}
    w.write_scalars(2, {"loss": 1.5})  # within REMOTE_FLUSH_SECONDS: uploaded at close
    w.close()
    assert _jsonl_losses(model_dir) == {1: 2.0, 2: 1.5}
    with writers.MetricsWriter(model_dir, out=io.StringIO()) as again:  # a resumed run
        again.write_scalars(3, {"loss": 1.0})
    assert _jsonl_losses(model_dir) == {1: 2.0, 2: 1.5, 3: 1.0}


def test_unfinished_gcs_checkpoint_is_not_a_step(gcs):
    """Orbax writes a gs:// step in place and its commit_success.txt last: a step without it
    (a save cut short) is not loadable and must not be listed."""
    model_dir = f"gs://{BUCKET}/runs/partial"
    md.write_text(f"{model_dir}/checkpoints/7/{md.STATE_ITEM}/_METADATA", "{}")
    assert md.checkpoint_steps(model_dir) == []
    md.write_text(f"{model_dir}/checkpoints/7/commit_success.txt", "done")
    assert md.checkpoint_steps(model_dir) == [7]


def _own_message(error: BaseException) -> str:
    """The error's own message, which must be one line: gin appends "\\n  In call to
    configurable 'train' (...)" to whatever passes through `loop.train`."""
    own = str(error).split("\n  In call to configurable")[0]
    assert "\n" not in own, own
    return own


def test_missing_bucket_fails_before_anything_is_written(gcs):
    with pytest.raises(OSError) as e:
        train_tiny("gs://no-such-bucket/run", 2, objectives=mlm_objectives(pair=False))
    msg = _own_message(e.value)
    # the trainer probes model_dir itself (its checkpoints/ appears at the first save)
    assert msg.startswith("model_dir: cannot write to 'gs://no-such-bucket/run' (")
    assert "does the bucket exist" in msg
    assert [b["name"] for b in _http("GET", f"{gcs}/storage/v1/b")["items"]] == [BUCKET]


def test_filesystem_package_not_installed(gcs, monkeypatch):
    """gs:// without gcsfs (on a machine without TensorFlow, epath's only other way there):
    one line naming the package, raised before anything is written, so an existing run's
    files are untouched."""
    model_dir = f"gs://{BUCKET}/runs/blocked"
    md.write_text(f"{model_dir}/{md.METRICS_FILE}", '{"step": 1, "split": "train", "loss": 3}\n')
    before = _objects(gcs, "runs/blocked/")
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # what an uninstalled package looks like
    with pytest.raises(md.FilesystemNotInstalled) as e:
        train_tiny(model_dir, 2, objectives=mlm_objectives(pair=False))
    assert isinstance(e.value, ImportError) and isinstance(e.value, ValueError)
    assert _own_message(e.value) == (f"{model_dir!r}: gs:// paths need the package gcsfs, "
                                     "which is not installed; pip install gcsfs")
    assert _objects(gcs, "runs/blocked/") == before


def test_cli_names_the_missing_package_in_one_line(tmp_path):
    """What a user sees: `python -m xlm_jax.train --model_dir=gs://...` without gcsfs."""
    code = ("import sys; sys.modules['gcsfs'] = None; from xlm_jax.train.cli import main; "
            "sys.exit(main(sys.argv))")
    env = dict(os.environ, EPATH_USE_TF="false", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=xla_flags(1))
    r = subprocess.run([sys.executable, "-c", code, "--gin_file=demo/synthetic.gin",
                        "--model_dir=gs://bucket/run"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: FilesystemNotInstalled: 'gs://bucket/run': gs:// paths need the package gcsfs, "
        "which is not installed; pip install gcsfs"), r.stderr[-3000:]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("path, says", [
    ("s3://bucket/run", "'s3://bucket/run': unsupported filesystem s3://; a model directory "
                        "is a local path or gs://BUCKET/PATH (orbax writes checkpoints only there)"),
    ("memory://run", "'memory://run': unsupported filesystem memory://"),
    ("gs:/bucket/run", "'gs:/bucket/run' is not a URI: expected gs://BUCKET/PATH"),
    ("gs:///run", "'gs:///run' names no bucket: expected gs://BUCKET/PATH"),
])
def test_unsupported_paths_fail_in_one_line_before_anything_is_written(path, says, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # epath would take an unknown scheme for a relative path
    with pytest.raises(ValueError) as e:
        train_tiny(path, 2, objectives=mlm_objectives(pair=False))
    assert _own_message(e.value).startswith(says)
    assert os.listdir(tmp_path) == []


def test_local_paths_are_made_absolute_and_uris_kept():
    assert os.fspath(md.resolve("rel/run")) == os.path.join(os.getcwd(), "rel", "run")
    assert os.fspath(md.resolve("gs://b/run/")) == "gs://b/run"
    assert md.is_remote("gs://b/run") and not md.is_remote("/tmp/run")
