"""Device mesh from named axes and the logical-axis rule table.

Layers annotate parameters with logical names (`embed`, `mlp`, `heads`, `kv`, `vocab`, ...) and
activations with `activation_*` names; the rule table below maps each logical name to mesh axes
(`data`, `fsdp`, `tensor`). The mesh is built from named axis sizes only — never from a TPU
topology — so the same gin file runs on CPU, GPU and TPU (t5x#410 broke GPU by doing otherwise).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
Rules = tuple[tuple[str, Any], ...]


def standard_logical_axis_rules(overrides: Sequence[tuple[str, Any]] = ()) -> Rules:
    """Logical name -> mesh axes. `overrides` entries replace the rule of the same name.

    These are the encoder's names; objectives add rules for names of their own (the XLCo
    queue) through `Objective.logical_axis_rules`, merged by
    `xlm_jax.train.declarations.merge_rules`.

    Parameters: the model dimension `embed` is sharded over `fsdp` (ZeRO-3 style), and the
    "wide" dimensions (`mlp`, `heads`, `vocab`) over `tensor` (Megatron style).
    Activations: the batch over `data` and `fsdp`, hidden features replicated, heads/mlp/vocab
    features over `tensor`.
    """
    rules: dict[str, Any] = {
        # parameters
        "embed": "fsdp",
        # The heads' d x d projections are replicated over `tensor`: they are small (d^2) and
        # their output is needed whole (LayerNorm). On `tensor` they are also correct now that
        # the heads constrain that output (tests/train/trainer_test.py checks both layouts).
        "embed_proj": None,
        "mlp": "tensor",
        "heads": "tensor",
        "kv": None,
        "vocab": "tensor",
        "abspos": None,
        "token_type": None,
        "languages": None,
        "relpos_buckets": None,
        "scalar": None,
        # The leading layer axis of the stacked parameters (`ModelConfig.scan_layers`). Never
        # sharded: each scan iteration reads one layer's slice, and with that axis split over
        # devices every iteration would first gather its slice from the one device holding it
        # (a pipeline would shard it; a scan does not). The per-layer dimensions below it keep
        # their own rules, so a stacked model is sharded as the per-layer one is.
        "layers": None,
        # activations
        "activation_batch": ("data", "fsdp"),
        "activation_length": None,
        "activation_embed": None,
        "activation_heads": "tensor",
        "activation_kv": None,
        "activation_mlp": "tensor",
        "activation_vocab": "tensor",
    }
    for name, axes in overrides:
        rules[name] = axes
    return tuple(rules.items())


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the named mesh axes; one size may be -1 (= all remaining devices)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def resolve(self, num_devices: int) -> dict[str, int]:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        free = [k for k, v in sizes.items() if v == -1]
        if len(free) > 1:
            raise ValueError(f"mesh {sizes}: at most one axis may be -1")
        for k, v in sizes.items():
            if v == 0 or v < -1:
                raise ValueError(f"mesh axis {k}={v}: sizes must be positive or -1")
        fixed = math.prod(v for v in sizes.values() if v != -1)
        if free:
            if num_devices % fixed:
                raise ValueError(f"mesh {sizes}: {num_devices} devices are not divisible by "
                                 f"the fixed axes' product {fixed}")
            sizes[free[0]] = num_devices // fixed
        if math.prod(sizes.values()) != num_devices:
            raise ValueError(f"mesh {sizes} needs {math.prod(sizes.values())} devices, "
                             f"but {num_devices} are available")
        return sizes


def make_mesh(mesh: MeshConfig | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes (data, fsdp, tensor) over `devices` (default: all devices)."""
    if mesh is None:
        mesh = MeshConfig()
    elif isinstance(mesh, Mapping):
        unknown = sorted(set(mesh) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"unknown mesh axes {unknown}; valid: {', '.join(MESH_AXES)}")
        mesh = MeshConfig(**mesh)
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh.resolve(len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    # Processes' devices stay contiguous along the leading (data) axis, so each host feeds
    # whole data-parallel shards.
    grid = np.array(devices, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES)


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """The context in which the model's logical activation constraints take effect: the mesh
    set with `jax.set_mesh` (flax looks it up through `jax.sharding.get_abstract_mesh()`; the
    legacy `with mesh:` leaves every `nn.with_logical_constraint` a silent no-op) and `rules`."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree of `nn.Partitioned` boxes (e.g. from `jax.eval_shape(init)`)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(boxed_tree: Any, shardings: Any) -> None:
    """Raises a one-line ValueError for the first array dimension that its mesh axes do not
    divide evenly (jax refuses such shardings deep inside jit), naming the parameter, its
    logical axis and the fix."""
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    leaves = jax.tree_util.tree_flatten_with_path(boxed_tree, is_leaf=is_box)[0]
    named = jax.tree_util.tree_leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(leaves) != len(named):
        raise ValueError(f"{len(leaves)} state leaves but {len(named)} shardings")
    for (path, leaf), sharding in zip(leaves, named):
        names = tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else ()
        shape = nn.meta.unbox(leaf)
        for dim, (size, axes) in enumerate(zip(shape.shape, sharding.spec)):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            split = math.prod(sharding.mesh.shape[a] for a in axes)
            if size % split:
                name = names[dim] if dim < len(names) else None
                hint = ("set the model's pad_vocab_to_multiple_of (e.g. 128)" if name == "vocab"
                        else f"change the logical axis rule for {name!r} or the mesh")
                raise ValueError(
                    f"train state{jax.tree_util.keystr(path)}: dimension {dim} (logical axis "
                    f"{name!r}) has size {size}, which mesh axes {axes} of total size {split} "
                    f"do not divide; {hint}")


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batches are split along their leading axis over `data` x `fsdp`, replicated over tensor."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
