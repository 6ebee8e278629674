"""`pip install .` (a wheel, not an editable install) works from any directory.

The repository is built into a wheel and installed with `pip install --target`; every command
then runs in a directory outside the repository with only that target on PYTHONPATH, so the
gin files, the `tasks` package and the demo corpus can only come from the wheel. Also: pip
refuses the wheel on Python 3.10, naming the Python it needs, and `python -m
xlm_jax.accelerator.bench` runs without torch (the comparison skipped with a note).
"""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.testlib.xla_flags import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What `pip install .` reads from a checkout (setup.py lists the packages and their data).
SOURCES = ("setup.py", "MANIFEST.in", "README.md", "pyproject.toml", "setup.cfg", "xlm_jax",
           "tasks", "gin_configs")
# Written beside the data or the code at run time; never part of a release.
NOT_SHIPPED = ("__pycache__", "*.pyc", "*.egg-info", "xlm_jax_stats.json", ".xlm_jax_stats_*")
SLOW = pytest.mark.skipif(not os.environ.get("XLM_JAX_SLOW_TESTS"),
                          reason="trains from the installed wheel (~1 min on 2 CPU cores); "
                                 "set XLM_JAX_SLOW_TESTS=1")


def _pip(*args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=300, env=env, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, site dir, a working directory outside the repository)."""
    tmp = tmp_path_factory.mktemp("packaging")
    assert not str(tmp).startswith(ROOT + os.sep)
    # Built from a copy: pip builds a local directory in place (build/, *.egg-info), which
    # would race with other test workers and users of the checkout.
    src = tmp / "src"
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
        elif os.path.isfile(path):
            os.makedirs(src, exist_ok=True)
            shutil.copy(path, src / name)
    # The venv's setuptools, no index: works offline, and builds what `pip install .` would.
    r = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
             "-w", str(tmp / "dist"), str(src))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("xlm_jax-*.whl")
    site = tmp / "site"
    r = _pip("install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return str(wheel), str(site), str(cwd)


def _run(installed, args, timeout=120, devices=1):
    """`python ARGS` from outside the repository, importing only from the installed site."""
    _, site, cwd = installed
    env = dict(os.environ, PYTHONPATH=site, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=xla_flags(devices),
               XDG_CACHE_HOME=os.path.join(os.path.dirname(site), "cache"))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _repo_files(top: str) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name != "xlm_jax_stats.json" and not name.endswith(".pyc"):
                out.add(os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/"))
    return out


def test_wheel_carries_every_gin_file_and_the_demo_corpus(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    gin_files = _repo_files("gin_configs")
    assert len(gin_files) > 30
    missing = sorted(f for f in gin_files if f"xlm_jax/{f}" not in names)
    assert not missing, f"gin files not in the wheel: {missing[:5]}"
    data = _repo_files("tasks/demo_data")
    assert {"tasks/demo_data/spm.model", "tasks/demo_data/mono/en.txt.xz"} <= data
    assert any(f.startswith("tasks/demo_data/tatoeba/") for f in data)
    # the folder tasks/ installs as the package xlm_jax_tasks (setup.py)
    in_wheel = {"xlm_jax_tasks/" + f[len("tasks/"):] for f in data | _repo_files("tasks")}
    missing = sorted(in_wheel - names)
    assert not missing, f"tasks files not in the wheel: {missing[:5]}"
    # the GPU cards' descriptions `python -m xlm_jax.accelerator.compile --target h100:...` reads
    specs = {f for f in _repo_files("xlm_jax/accelerator/compile/gpu_specs")
             if f.endswith(".txtpb")}
    assert {"xlm_jax/accelerator/compile/gpu_specs/h100.txtpb"} <= specs
    assert not sorted(specs - names), sorted(specs - names)


def test_train_help_from_outside_the_repository(installed):
    _, site, _ = installed
    r = _run(installed, ["-c", "import xlm_jax_tasks, xlm_jax; print(xlm_jax.__file__); "
                               "print(xlm_jax_tasks.__file__)"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert [os.path.dirname(os.path.dirname(p)) for p in r.stdout.split()] == [site, site]
    for flag in ("--help", "--helpfull"):
        r = _run(installed, ["-m", "xlm_jax.train", flag])
        assert r.returncode == 0, (flag, r.stdout[-2000:] + r.stderr[-3000:])
        assert "--gin_file" in r.stdout and "--model_dir" in r.stdout, (flag, r.stdout)


# Parses a demo run file and registers the demo tasks, as a run does before it builds anything.
RESOLVE = """
import gin
from xlm_jax.train import gin_utils
print(*gin_utils.parse(['demo/mmlm_tlm.gin'], []))
print(gin.query_parameter('xlm_jax.train.loop.train.spm_model'))
import xlm_jax_tasks.demo
print(xlm_jax_tasks.demo.SPM_PATH, len(xlm_jax_tasks.demo.LANGUAGES), len(xlm_jax_tasks.demo.PAIRS))
"""


def test_gin_files_and_demo_data_resolve_to_the_installed_wheel(installed):
    """The run file, its includes and the data it names (`spm_model =
    'tasks/demo_data/spm.model'`, relative to the package root) come from the wheel."""
    _, site, _ = installed
    r = _run(installed, ["-c", RESOLVE])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    gin_file, spm, (spm_of_tasks, n_mono, n_pairs) = (
        [line.split() for line in r.stdout.strip().splitlines()][-3:])
    assert gin_file == [os.path.join(site, "xlm_jax", "gin_configs", "demo", "mmlm_tlm.gin")]
    assert spm == [os.path.join(site, "xlm_jax_tasks", "demo_data", "spm.model")]
    assert spm_of_tasks == os.path.join(site, "xlm_jax_tasks", "demo_data", "spm.model")
    assert int(n_mono) > 70 and int(n_pairs) > 70  # the whole corpus was installed


@SLOW
@pytest.mark.slow
def test_two_step_demo_run_from_the_installed_wheel(installed, tmp_path):
    """Must show: `python -m xlm_jax.train --gin_file=demo/mmlm_tlm.gin --gin.TRAIN_STEPS=2`
    from outside the repository, with its 50 warmup steps (a warning, not an error). One
    task of each mixture keeps it short: the pipeline of all 153 demo tasks takes a minute."""
    _, site, _ = installed
    model_dir = tmp_path / "model"
    r = _run(installed, ["-m", "xlm_jax.train", "--gin_file=demo/mmlm_tlm.gin",
                         f"--model_dir={model_dir}", "--gin.TRAIN_STEPS=2",
                         "--gin.MONO_TASK='demo_mono_en'", "--gin.PAIR_TASK='demo_parallel_en_de'",
                         "--gin.SEQ_LEN=32", "--gin.BATCH_SIZE=4", "--gin.MAX_PREDICTIONS=5"],
             timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"done: 2 steps in {model_dir}" in r.stdout
    assert "warmup_steps=50 > total_steps=2" in r.stderr
    operative = (model_dir / "operative_config.gin").read_text()
    spm = os.path.join(site, "xlm_jax_tasks", "demo_data", "spm.model")
    bound = re.search(r"loop\.train\.spm_model = \\?\s*'([^']*)'", operative)  # may wrap
    assert bound and bound[1] == spm, operative
    assert (model_dir / "spm.model").read_bytes() == open(spm, "rb").read()


def test_pip_refuses_python_310_naming_the_python_it_needs(installed, tmp_path):
    wheel, _, _ = installed
    common = ("install", "--dry-run", "--no-deps", "--no-index", "--only-binary=:all:")
    r = _pip(*common, "--python-version", "3.10", "--target", str(tmp_path / "t310"), wheel)
    assert r.returncode != 0
    assert "requires a different Python: 3.10.0 not in '>=3.11'" in r.stderr, r.stderr
    r = _pip(*common, "--python-version", "3.11", "--target", str(tmp_path / "t311"), wheel)
    assert r.returncode == 0, r.stderr  # the refusal is about the Python, not the wheel


# The benchmark on a jax-only host: torch, transformers and TensorFlow look uninstalled.
NO_TORCH = """
import runpy, sys
for name in ('torch', 'transformers', 'tensorflow', 'seqio', 'tensorflow_datasets'):
    sys.modules[name] = None  # import fails, importlib.util.find_spec says "not installed"
sys.argv[0] = 'xlm_jax.accelerator.bench'
runpy.run_module('xlm_jax.accelerator.bench', run_name='__main__', alter_sys=True)
"""


@SLOW
@pytest.mark.slow
def test_bench_without_torch_skips_the_comparison_with_a_note(installed):
    """A shipped run file, found in the wheel, benchmarked on a host without torch."""
    r = _run(installed, ["-c", NO_TORCH, "--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "1",
                         "--batch_size", "2", "--seq_len", "8",
                         "--gin.loop.model_config.size='tiny'"], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()  # the step, its compile, then the torch row
    assert lines[-3].startswith("xlm_jax  : step"), r.stdout
    assert lines[-2].startswith("compile  : "), r.stdout
    assert lines[-1] == ("torch/HF : skipped (torch and transformers not installed); "
                         "--no_torch silences this"), r.stdout
