"""`python -m xlm_jax.accelerator.pod_memory` on a tiny model over 8 fake devices: an FSDP step
gathers parameters but never a whole activation (and a wrong activation rule is caught), the state
bytes per device it reports are the shardings' and shrink 8x with 8 fsdp shards, and a mesh
that does not match --devices is a one-line error."""
import json
import math
import os
import subprocess
import sys

import gin
import jax
import pytest

from tests.testlib import gin_state
from tests.testlib.xla_flags import FAST_COMPILE
from xlm_jax.accelerator import pod_memory
from xlm_jax.train import gin_utils

# gin to each test itself: the operative config its calls record is put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The CLI as on a jax-only host: tensorflow/seqio look uninstalled.
NO_TF = """
import sys
for name in ('tensorflow', 'seqio', 'tensorflow_datasets'):
    sys.modules[name] = None
from xlm_jax.accelerator.pod_memory import main
sys.exit(main(sys.argv[1:]))
"""
B, S, H, M = 16, 24, 128, 512  # global batch x seq; hidden and mlp widths of the model below
TINY = ["--gin_file=runs/xlmr_base_mmlm.gin", "--size=tiny", "--batch_size=16", "--seq_len=24",
        "--gin.loop.model_config.overrides={'num_layers': 2}",
        "--gin.loop.model_config.dtype='float32'"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    # the CLI replaces the device count and keeps the other flags (the fast compilation)
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE}
    return subprocess.run([sys.executable, "-c", NO_TF, *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def tiny_gin():
    """The tiny configuration parsed in this process (8 devices from tests/conftest.py), for
    the module's tests; gin's state put back after them (tests/testlib/gin_state.py)."""
    with gin_state.isolated():
        gin.clear_config()
        gin_utils.parse(["runs/xlmr_base_mmlm.gin"], [
            *gin_utils.SYNTHETIC_RUN_MACROS, "loop.model_config.size = 'tiny'",
            "loop.model_config.overrides = {'num_layers': 2}",
            "loop.model_config.dtype = 'float32'"])
        yield
        gin.clear_config()


def _whole(hlo: str, ops=None) -> list:
    return pod_memory.whole_activations(hlo, [(B, S)], [H, M], ops)


@pytest.fixture(scope="module")
def fsdp8(tmp_path_factory):
    """The CLI's JSON report and compiled HLO for the tiny model on mesh fsdp=8."""
    out = tmp_path_factory.mktemp("fsdp8")
    r = _cli(*TINY, "--devices=8", "--mesh=fsdp=8", f"--hlo={out / 'step.hlo'}",
             f"--json={out / 'report.json'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| all-gather |" in r.stdout and "**total**" in r.stdout, r.stdout
    return json.loads((out / "report.json").read_text()), (out / "step.hlo").read_text()


def test_fsdp_step_gathers_parameters_not_activations(tmp_path, tiny_gin, fsdp8):
    params = pod_memory.build({"fsdp": 8}, B, S).parts.abstract.params
    # No parameter has an activation's size: a parameter's all-gather cannot pass for one.
    sizes = {math.prod(p.shape) for p in jax.tree_util.tree_leaves(params)}
    assert not {B * S * H, B * S * M} & sizes
    report, hlo = fsdp8
    assert report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert report["collectives"]["all-gather"]["count"] > 0  # the parameters' gathers
    assert not _whole(hlo, ["all-gather"])
    assert not _whole(hlo)  # no whole activation anywhere
    assert report["activation_all_gathers"] == 0
    # The check can fail: activations replicated over the batch are gathered whole.
    bad = tmp_path / "bad.hlo"
    r = _cli(*TINY, "--devices=8", "--mesh=fsdp=8", f"--hlo={bad}",
             "--gin.loop.train.axis_rule_overrides=[('activation_batch', None)]")
    assert r.returncode == 0, r.stderr[-3000:]
    gathered = _whole(bad.read_text(), ["all-gather"])
    assert gathered, "a replicated activation_batch should all-gather whole activations"
    assert "whole activation (global batch x seq x hidden|mlp): 0" not in r.stdout


def _independent_state_bytes(built) -> int:
    """Sum over params and optimiser state of leaf bytes / the product of its spec's axes."""
    total = 0
    for part in ("params", "opt_state"):
        leaves = jax.tree_util.tree_leaves(getattr(built.parts.abstract, part))
        specs = jax.tree_util.tree_leaves(getattr(built.parts.shardings, part))
        for leaf, sharding in zip(leaves, specs, strict=True):
            shards = 1
            for axes in sharding.spec:
                for axis in (() if axes is None else (axes,) if isinstance(axes, str) else axes):
                    shards *= built.mesh.shape[axis]
            total += math.prod(leaf.shape) * leaf.dtype.itemsize // shards
    return total


def test_state_bytes_per_device_match_the_shardings_and_shrink_with_fsdp(tiny_gin, fsdp8):
    reported = {}
    for fsdp in (1, 8):
        built = pod_memory.build({"data": 8 // fsdp, "fsdp": fsdp}, B, S)
        got = pod_memory.per_device_state_bytes(built.parts.abstract, built.parts.shardings)
        reported[fsdp] = got["params"] + got["opt_state"]
        assert reported[fsdp] == _independent_state_bytes(built)
    # ~8x: only the few leaves without an `embed` axis (biases of mlp width) stay replicated
    assert 7.0 < reported[1] / reported[8] <= 8.0, reported
    report, _ = fsdp8  # what the CLI reported for fsdp=8, next to XLA's own figures
    state, mem = report["state_per_device"], report["memory_per_device"]
    assert state["params"] + state["opt_state"] == reported[8]
    # XLA's per-device argument bytes are the state's, the rng key's and this device's shard
    # of the batch features the step reads (jit drops unused inputs); the donated state is
    # aliased to the output.
    batch_bytes = sum(math.prod(v.sharding.shard_shape(v.shape)) * v.dtype.itemsize
                      for v in jax.tree_util.tree_leaves(built.args[1]))
    assert state["total"] + 8 < mem["argument"] <= state["total"] + 8 + batch_bytes
    assert mem["alias"] == state["total"]


def test_mesh_that_does_not_match_the_devices_is_a_one_line_error():
    r = _cli(*TINY, "--devices=256", "--mesh=data=16,fsdp=8")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "mesh {'data': 16, 'fsdp': 8, 'tensor': 1} needs 128 devices, but 256" in lines[0]
