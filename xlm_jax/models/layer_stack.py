"""The scanned encoder stack (`ModelConfig.scan_layers`) and its parameter layout.

Why: a loop over N `EncoderLayer`s traces, and XLA compiles, N copies of the layer; one
`flax.linen.scan` over a single layer compiles it once, so compile time (and the compiled
program) no longer grows with depth. The price is a second parameter layout:

- per layer (`scan_layers=False`, the default): `layers_0/...`, ..., `layers_{N-1}/...`,
  the names the HF converter, the reassembly, the optimiser's layer-wise decay and every
  checkpoint written so far use;
- stacked (`scan_layers=True`): one subtree `layers/...` whose every leaf has a leading layer
  axis of size N (logical axis name `layers`, `STACK_AXIS`), row i being layer i's parameter.

`stack_layers`/`unstack_layers` convert a model's parameter dict (or any tree mirroring it,
such as Adam's moments) between the two, exactly (no arithmetic), and `to_layout` converts
to the layout a config wants whatever the input is, so every reader of parameters (HF export,
`reassemble`, the translation objective, `init_from`) accepts both. Per-layer relative position
tables (`rel_pos_i`, `share_relative_table=False`) stay per layer in both layouts: they are
computed before the stack and enter the scan as a scanned input.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

Array = jax.Array
Params = dict[str, Any]

STACK = "layers"  # the stacked subtree's name (and its leading axis' logical name)
STACK_AXIS = "layers"
_LAYER_RE = re.compile(r"^layers_(\d+)$")
LAYOUTS = {False: "per-layer (scan_layers=False: layers_0 ... layers_{N-1})",
           True: "stacked (scan_layers=True: one 'layers' subtree with a leading layer axis)"}


def _layer_keys(params: Mapping[str, Any]) -> list[str]:
    """`layers_i` keys of `params`, by i; ValueError unless they are layers_0..layers_{N-1}."""
    found = sorted((int(m.group(1)), k) for k in params if (m := _LAYER_RE.match(str(k))))
    ids = [i for i, _ in found]
    if ids != list(range(len(ids))):
        raise ValueError(f"per-layer parameters {[k for _, k in found]} are not "
                         f"layers_0 ... layers_{len(ids) - 1}: cannot stack them")
    return [k for _, k in found]


def is_stacked(params: Mapping[str, Any]) -> bool | None:
    """True for the stacked layout, False for the per-layer one, None when `params` has no
    encoder layers at all (e.g. a head's parameters)."""
    return names_layout(params)


def _is_box(x: Any) -> bool:
    return isinstance(x, meta.AxisMetadata)


def _stack_leaves(*leaves: Any) -> Any:
    """One stacked leaf from N layers' leaves: numpy in -> numpy out, else jax; an
    `nn.Partitioned` box gains the `layers` axis name in front."""
    if _is_box(leaves[0]):
        inner = _stack_leaves(*(leaf.unbox() for leaf in leaves))
        return leaves[0].replace_boxed(inner).add_axis(0, {nn.PARTITION_NAME: STACK_AXIS})
    if all(isinstance(leaf, np.ndarray) for leaf in leaves):
        return np.stack(leaves)
    return jnp.stack(leaves)


def _slice_leaf(leaf: Any, i: int) -> Any:
    if _is_box(leaf):
        return leaf.replace_boxed(_slice_leaf(leaf.unbox(), i)).remove_axis(
            0, {nn.PARTITION_NAME: STACK_AXIS})
    return leaf[i]


def _own_devices(tree: Any) -> contextlib.AbstractContextManager:
    """The context a conversion runs in: no mesh for concrete arrays (stacking and slicing
    keep them on their own devices; under the mesh the trainer sets while it loads parameters,
    jax refuses arrays committed to another device, such as a loaded checkpoint's), the
    caller's for traced ones (inside `jit`, where the mesh cannot be changed)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return contextlib.nullcontext()
    return jax.set_mesh(None)


def stack_layers(params: Mapping[str, Any]) -> Params:
    """Per-layer -> stacked: `layers_0..layers_{N-1}` become one `layers` subtree whose leaves
    are the N layers' leaves stacked on a new leading axis; every other key is kept as is.

    Works on a model's parameter dict and on any tree of the same keys (optimizer moments,
    `nn.Partitioned`-boxed trees, numpy or jax leaves). Only the top level is looked at: pass
    the encoder's dict, not a train state's `{encoder, objectives}`. A tree that is already
    stacked (or has no layers) is returned as a plain dict copy."""
    if STACK in params:
        if any(_LAYER_RE.match(str(k)) for k in params):
            raise ValueError(f"parameters hold both '{STACK}' and layers_i subtrees: "
                             "neither layout")
        return dict(params)
    keys = _layer_keys(params)
    if not keys:
        return dict(params)
    layers = [params[k] for k in keys]
    structure = jax.tree_util.tree_structure(layers[0], is_leaf=_is_box)
    for k, layer in zip(keys, layers):
        if jax.tree_util.tree_structure(layer, is_leaf=_is_box) != structure:
            raise ValueError(f"{k} has other parameters than {keys[0]}: layers of different "
                             "structure cannot be stacked")
    with _own_devices(layers):
        stacked = jax.tree_util.tree_map(_stack_leaves, *layers, is_leaf=_is_box)
    out = {k: v for k, v in params.items() if k not in keys}
    out[STACK] = stacked
    return out


def num_stacked_layers(params: Mapping[str, Any]) -> int:
    """N, the leading axis of the stacked subtree (ValueError when the leaves disagree)."""
    sizes = {int(np.shape(leaf.unbox() if _is_box(leaf) else leaf)[0]) for leaf in
             jax.tree_util.tree_leaves(params[STACK], is_leaf=_is_box)}
    if len(sizes) != 1:
        raise ValueError(f"the stacked '{STACK}' leaves have different leading sizes "
                         f"{sorted(sizes)}: not one stack of layers")
    return sizes.pop()


def unstack_layers(params: Mapping[str, Any]) -> Params:
    """Stacked -> per-layer, the inverse of `stack_layers`: row i of every leaf of `layers`
    becomes `layers_i`. A per-layer tree (or one without layers) is returned as a plain dict
    copy."""
    if STACK not in params:
        return dict(params)
    n = num_stacked_layers(params)
    out = {k: v for k, v in params.items() if k != STACK}
    with _own_devices(params[STACK]):
        for i in range(n):
            out[f"layers_{i}"] = jax.tree_util.tree_map(lambda leaf: _slice_leaf(leaf, i),
                                                        params[STACK], is_leaf=_is_box)
    return out


def to_layout(params: Mapping[str, Any], scan_layers: bool) -> Params:
    """`params` in the layout `ModelConfig.scan_layers=scan_layers` uses, converted only when
    it is in the other one (detected from the keys)."""
    return stack_layers(params) if scan_layers else unstack_layers(params)


def layout_error(saved: bool, wanted: bool, where: str, fix: str) -> ValueError:
    """The one-line error for a tree in one layout given to something that needs the other."""
    return ValueError(f"{where} stores the encoder layers {LAYOUTS[saved]} but the model "
                      f"uses {LAYOUTS[wanted]}; {fix}")


def names_layout(names: Any) -> bool | None:
    """The layout of a set of '/'-joined parameter paths (e.g. a checkpoint's
    `params/encoder/layers/mlp/...`): True stacked (a `layers` component), False per layer
    (`layers_i` components), None neither."""
    parts = {p for name in names for p in str(name).split("/")}
    if STACK in parts:
        return True
    if any(_LAYER_RE.match(p) for p in parts):
        return False
    return None


def run_stack(layer: nn.Module, x: Array, *, num_layers: int, mask: Array | None,
              tables: Any, tables_per_layer: bool, deterministic: bool,
              encoder_states: Array | None = None, cross_mask: Array | None = None,
              row_ids: Array | None = None, cache: Any = None, cache_index: Array | None = None,
              keep_outputs: bool = False) -> tuple[Array, Any]:
    """Applies `layer` (one `EncoderLayer`, remat-wrapped or not, created by the caller) as
    `num_layers` layers with one `nn.scan`: parameters stacked on axis 0 (`layers` axis),
    'params' and 'dropout' rngs split per layer (so initial values and dropout bits differ
    from the per-layer loop's; with converted parameters and no dropout the function is the
    same).

    `tables`: the relative bias (an array [B, H, Tq, Tk], or any pytree of arrays the layer
    takes as its `relative_table`), one shared by every layer (`tables_per_layer=False`), or
    the layers' stacked on a leading axis and scanned. `cache`: one `LayerCache` whose leaves
    have a leading layer axis (scanned in, the updated one scanned out).
    Returns (the last layer's output, the per-layer outputs [N, ...] when `keep_outputs`, or the
    updated stacked cache when `cache` is given, else None).
    """

    def body(mdl: nn.Module, carry: Array, table: Any, layer_cache: Any,
             mask: Array | None, encoder_states: Array | None, cross_mask: Array | None,
             row_ids: Array | None, cache_index: Array | None) -> tuple[Array, Any]:
        if layer_cache is None:
            y = mdl(carry, mask, table, deterministic, encoder_states, cross_mask,
                    row_ids=row_ids)
            return y, (y if keep_outputs else None)
        return mdl(carry, mask, table, deterministic, encoder_states, cross_mask, layer_cache,
                   cache_index)

    scan: Callable[..., tuple[Array, Any]] = nn.scan(
        body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
        in_axes=(0 if tables_per_layer else nn.broadcast, 0, nn.broadcast, nn.broadcast,
                 nn.broadcast, nn.broadcast, nn.broadcast),
        length=num_layers, metadata_params={nn.PARTITION_NAME: STACK_AXIS})
    return scan(layer, x, tables, cache, mask, encoder_states, cross_mask, row_ids, cache_index)
