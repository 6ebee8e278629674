"""Running `python -m xlm_jax.train` as users do (subprocesses) and reading what it wrote."""
import json
import os
import subprocess
import sys

import numpy as np

from tests.testlib.xla_flags import FAST_COMPILE, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env(devices=1, **extra):
    """This environment on the CPU platform with `devices` host devices."""
    env = dict(os.environ)
    env.update({"XLA_FLAGS": xla_flags(devices), "XLA_FLAGS_EXTRA": FAST_COMPILE,
                "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}, **extra)
    return env


def run(args, devices=1, timeout=300, **extra):
    """`python -m xlm_jax.train ARGS` from the repository root on `devices` CPU devices."""
    return subprocess.run([sys.executable, "-m", "xlm_jax.train", *args], cwd=ROOT,
                          env=env(devices, **extra), capture_output=True, text=True,
                          timeout=timeout)


def losses(model_dir):
    """{step: loss} of the train rows of metrics.jsonl."""
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}


def params(model_dir):
    """The encoder parameters of the latest checkpoint, by path."""
    from xlm_jax.convert import hf

    import jax
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(hf.load_xlm_jax(model_dir)[1])[0]}


def state(model_dir):
    """Every array of the final train state (encoder, objective modules, optimizer, objective
    state), by path."""
    import jax
    import orbax.checkpoint as ocp

    from xlm_jax import model_dir as md

    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(md.trainer_state_dir(model_dir))
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(state)[0]}


