"""A CPU machine starts quietly: the CLIs that use the input pipeline write nothing on stderr
of their own (no TensorFlow import lines, no failed cuInit, no per-task "did not fully read
the dataset being cached" warnings when training stops mid-epoch), while XLM_JAX_DEBUG=1
keeps every line, which shows the noise is there to hide (`cli_help.quiet_tensorflow`)."""
import os
import subprocess
import sys

from tests.testlib.cli_run import ROOT
from tests.testlib.xla_flags import FAST_COMPILE

# The demo run file at 2 steps of a 1-layer model on one real seqio task per objective (each
# cached in memory by seqio and not read to its end: what printed the cache warnings).
TRAIN = ["xlm_jax.train", "--gin_file=demo/mmlm_tlm.gin", "--gin.TRAIN_STEPS=2",
         "--gin.MONO_TASK='demo_mono_de'", "--gin.PAIR_TASK='demo_parallel_en_de'",
         "--gin.optim.OptimizerConfig.warmup_steps=1",
         "--gin.loop.model_config.overrides={'vocab_size': 8002, 'num_layers': 1, "
         "'hidden_size': 32, 'mlp_dim': 64, 'num_heads': 2}"]
INSPECT = ["xlm_jax.data.inspect", "--task", "demo_mono_en", "--n", "1"]


def _user_env(**extra):
    """The environment of a user who set nothing: no TF_CPP_MIN_LOG_LEVEL, no JAX_PLATFORMS,
    no device count; only the suite's fast-compile XLA flags, which print nothing."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_PLATFORMS", "XLM_JAX_DEBUG", "XLA_FLAGS")}
    env["XLA_FLAGS"] = FAST_COMPILE
    env.update(extra)
    return env


def _run(args, tmp_path, **extra):
    return subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=_user_env(**extra),
                          capture_output=True, text=True, timeout=300)


def test_train_and_inspect_write_nothing_on_stderr(tmp_path):
    model_dir = str(tmp_path / "run")
    train = _run([*TRAIN, f"--model_dir={model_dir}"], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert train.stderr == "", train.stderr[-3000:]
    assert f"done: 2 steps in {model_dir}" in train.stdout
    inspect = _run(INSPECT, tmp_path)
    assert inspect.returncode == 0, inspect.stderr[-3000:]
    assert inspect.stderr == "", inspect.stderr[-3000:]
    assert "demo_mono_en" in inspect.stdout


def test_debug_keeps_the_noise(tmp_path):
    """The same inspect with XLM_JAX_DEBUG=1: TensorFlow's own start-up lines come through
    (absl's banner precedes its first log line), so the quiet run above hid real output."""
    loud = _run(INSPECT, tmp_path, XLM_JAX_DEBUG="1")
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert "absl::InitializeLog" in loud.stderr, loud.stderr[-3000:]


def test_jax_is_kept_on_the_cpu_only_where_it_would_end_there(monkeypatch):
    """With libtpu installed (the suite's environment) and no TPU chip, importing xlm_jax sets
    JAX_PLATFORMS=cpu (libtpu's failed start would print five lines on every CLI's stderr);
    a JAX_PLATFORMS or JAX_FORCE_TPU_INIT the user set wins."""
    import importlib.util

    import xlm_jax
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.delenv("JAX_FORCE_TPU_INIT", raising=False)
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    assert xlm_jax._cpu_without_accelerators() == has_libtpu
    assert os.environ.get("JAX_PLATFORMS") == ("cpu" if has_libtpu else None)
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert not xlm_jax._cpu_without_accelerators() and os.environ["JAX_PLATFORMS"] == "tpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setenv("JAX_FORCE_TPU_INIT", "1")
    assert not xlm_jax._cpu_without_accelerators() and "JAX_PLATFORMS" not in os.environ
