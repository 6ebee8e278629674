"""run_info.json records the JAX and device runtime versions (libtpu, the CUDA plugin: None
where absent), and a run writing into a model_dir whose run_info.json came from other versions
warns once, naming each moved distribution with both versions."""
from __future__ import annotations

import importlib.metadata
import json
import logging

from xlm_jax import model_dir as md
from xlm_jax.train import setup


def _installed(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == setup.logger.name and r.levelno == logging.WARNING]


def test_run_info_records_the_runtimes(tmp_path):
    setup.write_run_info(str(tmp_path), setup._run_info())
    versions = json.loads((tmp_path / md.RUN_INFO).read_text())["versions"]
    for name in setup.RUNTIME_DISTRIBUTIONS:
        assert versions[name] == _installed(name), name
    assert versions["jax-cuda12-plugin"] is None  # no GPU runtime in the test environment


def test_a_resumed_run_on_other_versions_warns_once(tmp_path, caplog):
    jax_now, jaxlib_now = _installed("jax"), _installed("jaxlib")
    old = {"versions": {"jax": "0.9.0", "jaxlib": "0.9.0", "libtpu": _installed("libtpu"),
                        "jax-cuda12-plugin": "0.9.0", "flax": "0.0.1"}, "python": "3.11.0"}
    (tmp_path / md.RUN_INFO).write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger=setup.logger.name):
        setup.write_run_info(str(tmp_path), setup._run_info())
    assert _warnings(caplog) == [
        "run_info.json was written with jax 0.9.0, jaxlib 0.9.0, jax-cuda12-plugin 0.9.0; "
        f"this process has jax {jax_now}, jaxlib {jaxlib_now}, jax-cuda12-plugin None: "
        "numerics may differ"]  # flax is not a runtime: not named
    # the file now holds this process's versions: the next resume is quiet
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=setup.logger.name):
        setup.write_run_info(str(tmp_path), setup._run_info())
    assert _warnings(caplog) == []


def test_old_files_without_runtime_entries_compare_what_they_have(tmp_path, caplog):
    """A run_info.json written before libtpu was recorded: only jax/jaxlib are compared; an
    unreadable file is nothing to compare with."""
    info = setup._run_info()
    old = {"versions": {"jax": info["versions"]["jax"], "jaxlib": info["versions"]["jaxlib"]}}
    assert setup.version_drift(old, info) is None
    (tmp_path / md.RUN_INFO).write_text("{torn")
    with caplog.at_level(logging.WARNING, logger=setup.logger.name):
        setup.write_run_info(str(tmp_path), info)
    assert _warnings(caplog) == []
    assert json.loads((tmp_path / md.RUN_INFO).read_text())["versions"] == info["versions"]
