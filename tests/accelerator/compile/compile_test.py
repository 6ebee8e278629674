"""`xlm_jax.accelerator.compile`: the trainer's step compiled for TPU topologies on this CPU host.

The test environment is the `tpu` one (constraints/tpu.txt): libtpu is installed, so
`jax.experimental.topologies` gives compile-only TPU devices and XLA:TPU really compiles (its
Mosaic passes on the fused attention kernels, its memory scheduling, its HBM check). One
reduced run file per objective family (the run file's own objectives and settings at the
`tiny` width, one layer, pallas attention, 8 x 128) compiles for v5e:2x2; the memory report
is held against the step's own shapes: XLA's `argument` bytes must equal the state, batch and
rng shards the tool computed from the shardings, padded to the executable's TPU tiles. A
deliberately oversized batch must not fit (exit 1, one line with the shortfall and the first
knob). GPU compilation needs the CUDA plugin, which `make test` does not install: those
tests run where it is installed (`make test-slow` installs it).
"""
from __future__ import annotations

import importlib.util
import os

import gin
import pytest

from xlm_jax.accelerator import compile as tool
from xlm_jax.accelerator.compile import __main__ as cli
from xlm_jax.accelerator.compile import targets

TPU = targets.parse_target("v5e:2x2")
# (run file, extra bindings that keep a one-layer model valid). `make test` compiles MMLM's
# (XLA:TPU takes 8-25 s for it on the 2-core machine); the other four families take 15-80 s
# each there and are `slow` (`make test-slow`; issue 56 moved them): their steps are lowered
# for TPU with the same Pallas kernels in `make test` (tests/accelerator/lower_test.py), and
# `make compile-runs` compiles every run file at its own size.
_SLOW = pytest.mark.slow
FAMILIES = [
    pytest.param("runs/xlmr_base_mmlm.gin", [], id="runs/xlmr_base_mmlm.gin"),
    pytest.param("runs/xlme_base.gin", ["GENERATOR_LAYERS = 1"], id="runs/xlme_base.gin",
                 marks=_SLOW),
    pytest.param("runs/infoxlm_base.gin", ["XLCO_LAYER = 1"], id="runs/infoxlm_base.gin",
                 marks=_SLOW),
    pytest.param("runs/ernie_m_base.gin", [], id="runs/ernie_m_base.gin", marks=_SLOW),
    pytest.param("runs/veco_small.gin", [], id="runs/veco_small.gin", marks=_SLOW),
]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="libtpu is not installed (the tpu environment has it)")


@pytest.fixture(autouse=True)
def _environment(gin_isolated):
    """The tool's environment for the test (libtpu quiet; jax itself stays on the CPU), and the
    process's environment and gin state as they were after it: `prepare_environment` is the
    CLI's set-up of its own process, and each test here makes it again."""
    saved = dict(os.environ)
    targets.prepare_environment(TPU)
    # only what the tool's set-up changed is undone: a module the test imports first may set
    # variables of its own at import (TensorFlow, libtpu), which stay as every import leaves them
    changed = {k for k in set(saved) | set(os.environ) if saved.get(k) != os.environ.get(k)}
    yield
    gin.clear_config()
    for name in changed:
        if name in saved:
            os.environ[name] = saved[name]
        else:
            os.environ.pop(name, None)


def _compile(run_file: str, bindings: list[str], target=TPU, **kw):
    return tool.compile_run([run_file], bindings, target, None, kw.pop("batch_size", 8),
                            kw.pop("seq_len", 128), size="tiny", depth=1,
                            attention_backend="pallas", collectives=False, **kw)


@pytest.mark.parametrize("run_file,bindings", FAMILIES)
def test_reduced_step_compiles_for_tpu_and_its_arguments_match_its_shapes(run_file, bindings):
    r = _compile(run_file, bindings)
    assert r["fits"] and not r.get("error"), r
    assert r["device_kind"] == "TPU v5 lite" and r["devices"] == 4
    # the run file's own mesh (data parallel over every device) on the target's devices
    assert r["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert r["mesh_source"] == "the run file's loop.train.mesh"
    mem = r["memory_per_device_bytes"]
    assert mem["argument"] == r["argument_bytes_from_shapes"]
    # the state alone, unpadded, is a lower bound of the (tile-padded) arguments
    assert r["state_per_device_bytes"]["total"] <= mem["argument"]
    assert mem["alias"] > 0  # the donated state is aliased to the new state
    assert mem["total"] == (mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
                            + mem["generated_code"])
    # the fused attention is in the compiled step: Mosaic TPU kernel calls; MMLM's one layer
    # has one forward kernel and the two backward ones (dq; dk and dv)
    assert r["custom_calls"].get("tpu_custom_call", 0) > 0, r["custom_calls"]
    if run_file == "runs/xlmr_base_mmlm.gin":
        assert r["custom_calls"] == {"tpu_custom_call": 3}
    assert r["device_memory_bytes"] == int(15.75 * 2**30)  # v5e's HBM as XLA:TPU states it
    assert r["flops_per_device"]["xla"] > 0 and r["flops_per_device"]["ours"] > 0


def test_a_run_file_mesh_that_cannot_split_the_batch_gives_way_to_the_tools_choice():
    # 8 devices, batch 4: the run file's data=-1 would need 8 batch shards
    mesh, source = tool._run_file_mesh(_mesh_config(), 8, {"mmlm": _Shape(4)}, heads=4)
    assert mesh == {"data": 1, "fsdp": 4, "tensor": 2}
    assert source.startswith("chosen by the tool") and "do not divide" in source
    assert tool.default_mesh(8, [16, 8], heads=12) == {"data": 1, "fsdp": 8, "tensor": 1}
    with pytest.raises(targets.TargetError, match="give --mesh"):
        tool.default_mesh(8, [4], heads=3)


def test_an_oversized_batch_does_not_fit_and_names_the_shortfall(capsys):
    code = cli.main(["--gin_file=runs/xlmr_base_mmlm.gin", "--target", "v5e:2x2", "--size",
                     "tiny", "--depth", "1", "--batch_size", "65536", "--seq_len", "256",
                     "--no_collectives"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1, err
    assert "does not fit" in err[0] and "GiB available" in err[0] and "over)" in err[0]
    assert "first knob: rematerialise every layer (--remat full" in err[0]


@pytest.mark.parametrize("argv,expected", [
    (["--target", "v9z:2x2"], "--target 'v9z:2x2': unknown chip 'v9z'"),
    (["--target", "v5e"], "--target 'v5e': expected CHIP:TOPOLOGY"),
    (["--target", "v5e:2x2", "--mesh", "data=3"], "--mesh 'data=3': 3 devices do not divide "
     "the 4 of v5e:2x2"),
    (["--target", "v5e:2x2", "--mesh", "data=4", "--batch_size", "6"],
     "4 batch shards do not divide objective mmlm's batch of 6"),
    (["--target", "v5e:2x2", "--mesh", "tensor=4", "--size", "tiny", "--depth", "1",
      "--width_is_not_a_flag"], "unrecognized arguments: --width_is_not_a_flag"),
    (["--target", "v5e:3x3"], "--target 'v5e:3x3': the tpu runtime cannot build this "
     "topology"),
    (["--target", "v5e:2x2", "--remat", "some"], "--remat 'some': expected one of"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    with pytest.raises(SystemExit) if "not_a_flag" in argv[-1] else _no_raise() as caught:
        code = cli.main(["--gin_file=runs/xlmr_base_mmlm.gin", "--size", "tiny", "--depth", "1",
                         *argv])
    code = caught.value.code if caught else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and expected in err[0], err


def test_tensor_axis_that_does_not_divide_the_heads_is_refused(capsys):
    code = cli.main(["--gin_file=runs/xlmr_base_mmlm.gin", "--target", "v5p:2x2x2", "--mesh",
                     "data=1,tensor=8", "--size", "tiny", "--depth", "1", "--batch_size", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--mesh tensor=8 does not divide the model's 4 heads" in err[0]


@pytest.mark.skipif(targets.cuda_plugin_installed(),
                    reason="the CUDA plugin is installed here")
def test_a_gpu_target_without_the_cuda_plugin_names_what_to_install(capsys):
    code = cli.main(["--gin_file=runs/xlmr_base_mmlm.gin", "--target", "h100:1x1x4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "the CUDA plugin is not installed: `pip install jax-cuda12-plugin==" in err[0]


def _mesh_config():
    from xlm_jax.train import partitioning

    return partitioning.MeshConfig()


class _Shape:
    def __init__(self, batch_size):
        self.batch_size = batch_size


class _no_raise:
    """A context manager standing in for pytest.raises where nothing is raised."""

    value = None

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_pod_memory_with_a_target_is_a_view_of_the_compiled_report(tmp_path, capfd):
    from xlm_jax.accelerator import pod_memory

    out = tmp_path / "r.json"
    code = pod_memory.main(["--gin_file=runs/xlmr_base_mmlm.gin", "--target", "v5e:2x2",
                            "--size", "tiny", "--batch_size", "8", "--seq_len", "128",
                            "--gin.loop.model_config.overrides={'num_layers': 1}",
                            "--json", str(out)])
    text = capfd.readouterr().out  # the compile tool runs in a process of its own
    assert code == 0
    assert "on v5e:2x2 (4 x TPU v5 lite)" in text and "compiles and fits" in text
    r = __import__("json").loads(out.read_text())
    assert r["memory_per_device_bytes"]["argument"] == r["argument_bytes_from_shapes"]


def test_the_gated_bias_kernels_compile_for_tpu_with_each_tiles_bucket_span():
    """XLM-E's gated-bias TPU kernels loop over a tile's own buckets only, from two vector
    reductions used as the loop's bounds (`fused_attention_tpu_kernels._bucket_span`): XLA:TPU
    compiles them (Mosaic's passes run in a compile-only compile) at the run files' T = 512
    with 128 x 128 tiles, forward and backward, with dropout. Their values are checked
    interpreted on the CPU (tests/models/fused_attention_tpu_test.py)."""
    import jax
    import jax.numpy as jnp

    from xlm_jax.models import position
    from xlm_jax.models.fused_attention_tpu import flash_attention_tpu

    device = targets.devices(TPU)[0]
    b, t, h, dh, buckets = 1, 512, 2, 64, 32
    on = jax.sharding.SingleDeviceSharding(device)
    s = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=on)

    def loss(q, k, v, table, factor, pos):
        relative = position.RelativeBias(table, pos, pos, factor, buckets, 128)
        out = flash_attention_tpu(q, k, v, relative=relative, dropout_rate=0.1,
                                  dropout_rng=jax.random.PRNGKey(0))
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    compiled = grad.trace(s(b, t, h, dh), s(b, t, h, dh), s(b, t, h, dh),
                          s(buckets, h, dt=jnp.float32), s(b, h, t, dt=jnp.float32),
                          s(b, t, dt=jnp.int32)).lower(lowering_platforms=("tpu",)).compile()
    text = compiled.as_text()
    assert text.count("tpu_custom_call") == 3, text[:2000]  # forward, dk/dv, dq
