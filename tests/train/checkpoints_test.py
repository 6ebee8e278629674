"""Tests for xlm_jax.train.checkpoints with real orbax checkpoints on disk."""
from __future__ import annotations

import os

# tests/conftest.py sets these too; repeated here so the file also runs on its own.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from xlm_jax.train import checkpoints  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@flax.struct.dataclass
class _State:
    """A TrainState look-alike: step, params, optax state."""

    step: Any
    params: Any
    opt_state: Any


def _state(seed=0, query_shape=(8, 4)):
    rng = np.random.default_rng(seed)
    params = {
        "embeddings": {"word_embeddings": {"embedding": jnp.asarray(rng.normal(size=(16, 8)),
                                                                    jnp.float32)}},
        "layers_0": {"attention": {"query": {
            "kernel": jnp.asarray(rng.normal(size=query_shape), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}},
    }
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    opt_state = tx.init(params)
    # Non-trivial moments so a restore of zeros would be caught.
    opt_state = jax.tree_util.tree_map(lambda x: x + 0.5 if x.dtype == jnp.float32 else x,
                                       opt_state)
    return _State(step=jnp.asarray(seed + 1, jnp.int32), params=params, opt_state=opt_state)


def _abstract(state, sharding_fn):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_fn(x)), state)


def _single(_):
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_with_extra(tmp_path):
    state = _state()
    extra = {"data": {"cc100": {"epoch": 2, "offset": 12345}}, "seed": 7}
    with checkpoints.Checkpointer(str(tmp_path), checkpoints.CheckpointConfig(
            save_every_steps=10, keep=3, async_save=True)) as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(10, state, extra)
        ckpt.wait()
        assert os.path.isdir(tmp_path / "checkpoints" / "10")
        restored, got_extra = ckpt.restore(None, _abstract(state, _single))
    assert isinstance(restored, _State)
    _assert_trees_equal(restored, state)
    assert got_extra == extra
    # A different state restores different values (the comparison above can fail).
    with pytest.raises(AssertionError):
        _assert_trees_equal(restored, _state(seed=1))


def test_should_save_keep_n_and_latest_step(tmp_path):
    ckpt = checkpoints.Checkpointer(str(tmp_path), checkpoints.CheckpointConfig(
        save_every_steps=2, keep=2, async_save=False))
    assert [s for s in range(7) if ckpt.should_save(s)] == [2, 4, 6]
    saved = [s for s in range(1, 8) if ckpt.save(s, _state(s), {"step": s})]
    assert saved == [2, 4, 6]
    assert ckpt.save(7, _state(7), {"step": 7}, force=True)  # the final save of a run
    assert not ckpt.save(7, _state(7), {"step": 7}, force=True)  # already on disk
    ckpt.wait()
    assert ckpt.latest_step() == 7
    assert ckpt.all_steps() == [6, 7]
    assert sorted(p for p in os.listdir(tmp_path / "checkpoints") if p.isdigit()) == ["6", "7"]
    state6, extra6 = ckpt.restore(6, _abstract(_state(6), _single))
    _assert_trees_equal(state6, _state(6))
    assert extra6 == {"step": 6}
    with pytest.raises(FileNotFoundError, match=r"has no step 2; available steps: \[6, 7\]"):
        ckpt.restore(2, _abstract(_state(2), _single))
    ckpt.close()
    # A new Checkpointer (a restarted job) sees the same latest step.
    assert checkpoints.Checkpointer(str(tmp_path)).latest_step() == 7


def test_restore_onto_a_different_mesh(tmp_path):
    assert jax.device_count() == 8, "needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
    state = jax.device_put(_state(3), jax.devices()[0])  # saved from a single device
    ckpt = checkpoints.Checkpointer(str(tmp_path), checkpoints.CheckpointConfig(async_save=True))
    ckpt.save(5, state, {"k": 1}, force=True)
    ckpt.wait()

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))

    def sharding(x):
        if x.ndim == 2:
            return NamedSharding(mesh, P("data", "tensor"))
        if x.ndim == 1 and x.shape[0] % 2 == 0:
            return NamedSharding(mesh, P("tensor"))
        return NamedSharding(mesh, P())

    abstract = _abstract(state, sharding)
    restored, extra = ckpt.restore(5, abstract)
    ckpt.close()
    _assert_trees_equal(restored, state)
    assert extra == {"k": 1}
    kernel = restored.params["layers_0"]["attention"]["query"]["kernel"]
    assert kernel.sharding == NamedSharding(mesh, P("data", "tensor"))
    assert len(kernel.addressable_shards) == 8
    assert kernel.addressable_shards[0].data.shape == (2, 2)
    mu = restored.opt_state[1][0].mu["embeddings"]["word_embeddings"]["embedding"]
    assert mu.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "tensor")), 2)
    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(abstract)):
        assert got.sharding == want.sharding


def test_shape_mismatch_names_parameter_and_both_shapes(tmp_path):
    ckpt = checkpoints.Checkpointer(str(tmp_path), checkpoints.CheckpointConfig(async_save=False))
    ckpt.save(1, _state(query_shape=(8, 2, 4)), {}, force=True)
    model = _abstract(_state(query_shape=(8, 4, 2)), _single)
    with pytest.raises(ValueError) as e:
        ckpt.restore(1, model)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"checkpoint {tmp_path}/checkpoints step 1: parameter "
                          "'params/layers_0/attention/query/kernel' has shape (8, 2, 4) but the "
                          "model expects (8, 4, 2)")
    # The Adam moments mu/nu of the kernel differ too and are named after it.
    assert msg.count("has shape (8, 2, 4) but the model expects (8, 4, 2)") == 3
    assert "'opt_state/1/0/mu/layers_0/attention/query/kernel'" in msg


def test_long_problem_lists_are_truncated():
    saved = {f"p{i}": jax.ShapeDtypeStruct((i + 1,), jnp.float32) for i in range(6)}
    model = {f"p{i}": jax.ShapeDtypeStruct((i + 2,), jnp.float32) for i in range(6)}
    with pytest.raises(ValueError, match=r"'p2' has shape \(3,\) but the model expects \(4,\); "
                                         r"and 3 more problem\(s\)$"):
        checkpoints.check_compatible(saved, model, directory="d", step=1)


def test_missing_and_unexpected_keys_are_named():
    saved = {"params": {"a": jax.ShapeDtypeStruct((2,), jnp.float32),
                        "old": jax.ShapeDtypeStruct((3,), jnp.float32)}}
    model = {"params": {"a": jax.ShapeDtypeStruct((2,), jnp.float32),
                        "new": jax.ShapeDtypeStruct((4, 4), jnp.float32)}}
    with pytest.raises(ValueError) as e:
        checkpoints.check_compatible(saved, model, directory="/ckpt", step=9)
    assert str(e.value) == (
        "checkpoint /ckpt step 9: parameter 'params/new' (4, 4) is missing from the checkpoint; "
        "parameter 'params/old' (3,) is in the checkpoint but not in the model")
    checkpoints.check_compatible(model, model)  # identical trees pass


def test_abstract_leaf_without_sharding_is_named(tmp_path):
    ckpt = checkpoints.Checkpointer(str(tmp_path), checkpoints.CheckpointConfig(async_save=False))
    ckpt.save(1, _state(), {}, force=True)
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state())
    with pytest.raises(ValueError, match=r"abstract_state leaf 'step' \(\) has no sharding"):
        ckpt.restore(1, abstract)
    with pytest.raises(ValueError, match=r"step 2: extra is not JSON-serialisable"):
        ckpt.save(2, _state(), {"rng": object()}, force=True)
    ckpt.close()


def test_empty_dir_restore_error(tmp_path):
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=rf"no checkpoint to restore in {tmp_path}"):
        ckpt.restore(None, _abstract(_state(), _single))


def test_config_validation():
    with pytest.raises(ValueError, match=r"CheckpointConfig.keep=0 is invalid"):
        checkpoints.CheckpointConfig(keep=0)
    with pytest.raises(ValueError, match=r"CheckpointConfig.save_every_steps=-5 is invalid"):
        checkpoints.CheckpointConfig(save_every_steps=-5)


def test_model_dir_under_a_regular_file(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with pytest.raises(OSError) as e:
        checkpoints.Checkpointer(str(blocker / "run"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (f"checkpoints: cannot write to '{blocker}/run/checkpoints' "
                   f"(Not a directory: '{blocker}/run')")


def test_unwritable_model_dir():
    """A chmod 0555 parent. Root ignores permission bits, so then run the check as 'nobody'."""
    base = tempfile.mkdtemp(prefix="ckpt_perm_")
    try:
        os.chmod(base, 0o755)
        locked = os.path.join(base, "locked")
        os.mkdir(locked, 0o555)
        os.chmod(locked, 0o555)
        model_dir = os.path.join(locked, "run")
        want = f"checkpoints: cannot write to '{model_dir}/checkpoints' (Permission denied"
        if os.geteuid() != 0:
            with pytest.raises(OSError) as e:
                checkpoints.Checkpointer(model_dir)
            assert str(e.value).startswith(want)
            return
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot drop privileges")
        code = ("from xlm_jax.train import checkpoints\n"
                "try:\n"
                f"    checkpoints.Checkpointer({model_dir!r})\n"
                "except OSError as e:\n"
                "    print(e)\n")
        env = dict(os.environ, PYTHONPATH=REPO_ROOT, HOME=base, PYTHONDONTWRITEBYTECODE="1")
        res = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
             "-c", code], capture_output=True, text=True, env=env, timeout=180, cwd=base)
        if "Permission denied" in res.stderr and "xlm_jax" not in res.stderr:
            pytest.skip(f"'nobody' cannot run the interpreter here: {res.stderr.strip()[-200:]}")
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.strip().startswith(want), (res.stdout, res.stderr[-2000:])
        assert not os.path.exists(os.path.join(locked, "run"))
    finally:
        os.chmod(os.path.join(base, "locked"), 0o755)
        shutil.rmtree(base, ignore_errors=True)
