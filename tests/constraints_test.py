"""The pinned environments (constraints/): each committed resolution is consistent (`pip check`
from the committed metadata, offline), still matches setup.py, holds constraints/base.txt, and
the suite runs in the tpu one; the check fails on a dropped, a conflicting and a stale pin."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import runpy
from unittest import mock

import pytest
import setuptools
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("constraint_pins",
                                               os.path.join(ROOT, "constraints", "pins.py"))
pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pins)


@pytest.fixture(scope="module")
def metadata():
    return pins.load_metadata()


@pytest.mark.parametrize("target", list(pins.TARGETS))
def test_each_resolution_is_consistent(target, metadata):
    assert pins.check_target(target, metadata) == []


def _setup_requires() -> dict[tuple[str, ...], list[str]]:
    """setup.py's requirements as pip reads them: the core, then each extra's with its marker."""
    with mock.patch.object(setuptools, "setup") as setup:
        runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="__main__")
    kw = setup.call_args.kwargs
    return kw["install_requires"], kw["extras_require"]


@pytest.mark.parametrize("target", list(pins.TARGETS))
def test_metadata_matches_setup_py(target, metadata):
    """setup.py changed without `make pins`: the committed resolution is not of this setup.py."""
    core, extras = _setup_requires()
    got = {str(Requirement(r)) for r in metadata["targets"][target]["requires"]}
    want = {str(Requirement(r)) for r in core}
    for extra, reqs in extras.items():
        want |= {str(Requirement(f'{r}; extra == "{extra}"')) for r in reqs}
    assert got == want, "setup.py's requirements changed: run `make pins`"
    assert metadata["targets"][target]["extras"] == list(pins.TARGETS[target])


def test_base_pins_and_caps_are_held(metadata):
    base = pins.read_pins(os.path.join(ROOT, "constraints", "base.txt"))
    wanted = {"cpu": ["jax", "jaxlib", "torch"], "tpu": ["jax", "jaxlib", "libtpu", "torch"],
              "cuda12": ["jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"]}
    for target, names in wanted.items():
        got = pins.read_pins(pins.pin_path(target))
        assert {n: got.get(n) for n in names} == {n: base[n] for n in names}, target
        # setup.py's data extra: sentencepiece 0.2.3 refuses Beam's protobuf at import
        assert tuple(int(x) for x in got["sentencepiece"].split(".")) < (0, 2, 3)
    assert "torch" not in pins.read_pins(pins.pin_path("cuda12"))
    assert not any(n.startswith("nvidia-") for n in pins.read_pins(pins.pin_path("tpu")))


def test_the_check_fails_on_a_dropped_a_conflicting_and_a_stale_pin(metadata):
    tpu = pins.read_pins(pins.pin_path("tpu"))
    dropped = {n: v for n, v in tpu.items() if n != "jaxlib"}
    assert any(p.startswith("jax==") and p.endswith("and jaxlib has no pin")
               for p in pins.check_target("tpu", metadata, dropped))
    conflicting = dict(tpu, jaxlib="0.9.0")
    assert any("and the pin is jaxlib==0.9.0" in p
               for p in pins.check_target("tpu", metadata, conflicting))
    stale = dict(tpu, pyflakes="3.2.0")
    assert pins.check_target("tpu", metadata, stale) == [
        "pyflakes==3.2.0 is pinned, and nothing requires it"]
    # the cuda12 resolution without its plugin: jax[cuda12] is not met
    cuda = pins.read_pins(pins.pin_path("cuda12"))
    cuda.pop("jax-cuda12-plugin")
    assert any("jax-cuda12-plugin has no pin" in p
               for p in pins.check_target("cuda12", metadata, cuda))


def test_the_suite_runs_in_the_tpu_environment():
    """`make test` installs with constraints/tpu.txt (libtpu: compile-only TPU devices); an
    environment with libtpu installed has every tpu pin it has installed at the pinned version
    (a stale .venv, not reinstalled after a pin moved, fails here)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("not the tpu environment (no libtpu): not installed by `make test`")
    wrong = {}
    for name, version in pins.read_pins(pins.pin_path("tpu")).items():
        try:
            have = importlib.metadata.version(name).split("+", 1)[0]
        except importlib.metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if have != version:
            wrong[name] = (version, have)
    assert wrong == {}, "installed versions differ from constraints/tpu.txt: `make install`"


def test_makefile_installs_with_the_pins():
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    stamp = next(line for line in text.splitlines() if line.startswith("$(VENV)/.installed:"))
    assert "PINS   := constraints/tpu.txt" in text
    assert "$(PINS)" in stamp and "setup.py" in stamp  # a moved pin reinstalls
    assert '-c $(PINS) -e ".[data,test,gcs,tpu]"' in text and "$(PIP) check" in text
    assert "constraints/generate.py" in text  # `make pins`
