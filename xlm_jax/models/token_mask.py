"""An attention mask described by per-token ids, for kernels that never build ``[B, T, T]``.

Every mask of the library is a function of small per-token features (``models/masks.py``):
packing segments (``seg_q[i] == seg_k[j]``, id 0 = padding), a causal order
(``pos_k[j] <= pos_q[i]``) and a side rule (``allowed[side_q[i], side_k[j]]``, plus the
token itself with ``include_self``: ERNIE-M's CAMLM/BTMLM). A :class:`TokenMask` carries those
features instead of the ``[B, 1, Tq, Tk]`` array: the fused attention kernels evaluate
:meth:`TokenMask.tile` per (query block, key block) tile, so the step holds no
attention-sized mask, and the XLA path calls :meth:`TokenMask.materialise`, which is the
``masks`` builders' array exactly (tested entry by entry).

It is a pytree (arrays as leaves; the side table and ``include_self`` static), so it passes
through jit, ``nn.scan`` and ``shard_map`` like an array.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlm_jax.models import masks as masks_lib

Table = tuple[tuple[bool, ...], ...]
NAMES: tuple[str, ...] = ("seg", "pos", "side")  # the features a TokenMask may carry


def _table(allowed: Any) -> Table:
    return tuple(tuple(bool(x) for x in row) for row in np.asarray(allowed))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenMask:
    """Visibility ``seg & causal & side-rule`` from per-token int32 ``[B, T]`` features.

    seg_q/seg_k: segment ids (0 = padding) or None (no segment condition); pos_q/pos_k:
    positions for a causal order or None; side_q/side_k: sides for the ``allowed`` table or
    None. ``include_self`` lets a non-padding token (side != 0) see its own index.
    """

    seg_q: jax.Array | None
    seg_k: jax.Array | None
    pos_q: jax.Array | None = None
    pos_k: jax.Array | None = None
    side_q: jax.Array | None = None
    side_k: jax.Array | None = None
    allowed: Table | None = dataclasses.field(default=None, metadata=dict(static=True))
    include_self: bool = dataclasses.field(default=False, metadata=dict(static=True))

    # ------------------------------------------------------------------ builders

    @classmethod
    def padding(cls, valid_q: Any, valid_k: Any | None = None) -> TokenMask:
        """``masks.padding_mask``: valid queries see valid keys."""
        valid_k = valid_q if valid_k is None else valid_k
        return cls(jnp.asarray(valid_q).astype(jnp.int32), jnp.asarray(valid_k).astype(jnp.int32))

    @classmethod
    def segments(cls, seg_q: Any, seg_k: Any | None = None) -> TokenMask:
        """``masks.segment_mask``: packing, attend within the same non-zero segment."""
        seg_k = seg_q if seg_k is None else seg_k
        return cls(jnp.asarray(seg_q).astype(jnp.int32), jnp.asarray(seg_k).astype(jnp.int32))

    def causal(self, positions_q: Any, positions_k: Any | None = None) -> TokenMask:
        """This mask AND ``masks.causal_mask`` of the positions."""
        positions_k = positions_q if positions_k is None else positions_k
        return dataclasses.replace(self, pos_q=jnp.asarray(positions_q).astype(jnp.int32),
                                   pos_k=jnp.asarray(positions_k).astype(jnp.int32))

    def side_rule(self, side: Any, allowed: Any, include_self: bool) -> TokenMask:
        """This mask AND ``masks.side_rule_mask(side, side, allowed, include_self)``."""
        side = jnp.asarray(side).astype(jnp.int32)
        return dataclasses.replace(self, side_q=side, side_k=side, allowed=_table(allowed),
                                   include_self=include_self)

    @classmethod
    def from_features(cls, features: Mapping[str, Any], kind: str = "bidirectional"
                      ) -> TokenMask:
        """The description of ``masks.mask_from_features(features, kind)``."""
        if kind not in masks_lib.MASK_KINDS:
            raise ValueError(f"masks: unknown mask kind {kind!r}; valid kinds are "
                             f"{list(masks_lib.MASK_KINDS)}")
        if "segment_ids" in features:
            base = cls.segments(features["segment_ids"])
        elif "valid" in features:
            base = cls.padding(features["valid"])
        elif kind in ("camlm", "btmlm_stage1"):
            base = cls(None, None)
        else:
            raise ValueError(f"masks: mask kind {kind!r} needs feature 'segment_ids' or "
                             f"'valid'; got keys {sorted(features)}")
        if kind == "bidirectional":
            return base
        if kind == "causal":
            ref = base.seg_q
            positions = features.get("positions")
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(ref.shape[1])[None, :], ref.shape)
            return base.causal(positions)
        if "pair_side" not in features:
            raise ValueError(f"masks: mask kind {kind!r} needs feature 'pair_side'; got keys "
                             f"{sorted(features)}")
        table = masks_lib.CAMLM_ALLOWED if kind == "camlm" else masks_lib.BTMLM_STAGE1_ALLOWED
        return base.side_rule(features["pair_side"], table, include_self=True)

    # ------------------------------------------------------------------ views

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The ``[B, 1, Tq, Tk]`` shape of the mask it describes."""
        q = next(x for x in (self.seg_q, self.pos_q, self.side_q) if x is not None)
        k = next(x for x in (self.seg_k, self.pos_k, self.side_k) if x is not None)
        return (q.shape[0], 1, q.shape[1], k.shape[1])

    @property
    def ndim(self) -> int:
        return 4

    @property
    def dtype(self) -> Any:
        return jnp.dtype(jnp.bool_)

    def features(self) -> dict[str, jax.Array]:
        """The present per-token arrays by name (``seg_q``, ``pos_k``, ...)."""
        names = ("seg_q", "seg_k", "pos_q", "pos_k", "side_q", "side_k")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def names(self) -> tuple[str, ...]:
        """The features present, in a fixed order: of "seg", "pos", "side"."""
        return tuple(n for n in NAMES if getattr(self, f"{n}_q") is not None)

    def rule(self) -> TokenMask:
        """This mask without its arrays: the static part (the side table, include_self) a
        kernel keeps as a compile-time setting and hands to `tile` with a tile's features."""
        return self.with_features({n: None for n in self.features()})

    def with_features(self, feats: Mapping[str, jax.Array]) -> TokenMask:
        """The same rule over other arrays (e.g. one device's shard or padded copies)."""
        return dataclasses.replace(self, **feats)

    def materialise(self) -> jax.Array:
        """The bool ``[B, 1, Tq, Tk]`` array, built by the ``masks`` builders."""
        parts = []
        if self.seg_q is not None:
            parts.append(masks_lib.segment_mask(self.seg_q, self.seg_k))
        if self.pos_q is not None:
            parts.append(masks_lib.causal_mask(self.pos_q, self.pos_k))
        if self.side_q is not None:
            parts.append(masks_lib.side_rule_mask(self.side_q, self.side_k,
                                                  np.asarray(self.allowed, bool),
                                                  self.include_self))
        if not parts:
            b, _, tq, tk = self.shape
            return jnp.ones((b, 1, tq, tk), jnp.bool_)
        return masks_lib.combine(*parts)

    def tile(self, q: Mapping[str, jax.Array], k: Mapping[str, jax.Array],
             q_index: jax.Array, k_index: jax.Array) -> jax.Array:
        """Visibility of one tile: `q` holds the query features as ``[bq, 1]`` columns
        (``seg``, ``pos``, ``side`` keys: the features present, `names()`), `k` the key
        features as ``[1, bk]`` rows, `q_index`/`k_index` the tile's global indices in the
        same shapes. The features come from the arguments, so a `rule()` serves any tile.
        Elementwise int32 compares only, so Triton and Mosaic kernels evaluate it as XLA
        does."""
        ok = None

        def both(x: jax.Array) -> jax.Array:
            return x if ok is None else ok & x

        if "seg" in q:
            # equal ids and a non-zero key id (then the query's is non-zero too): one test
            # fewer a score than testing both ids
            ok = both((q["seg"] == k["seg"]) & (k["seg"] != 0))
        if "pos" in q:
            ok = both(k["pos"] <= q["pos"])
        if "side" in q:
            rule = None
            for a, row in enumerate(self.allowed):
                for b, allowed in enumerate(row):
                    if allowed:
                        hit = (q["side"] == a) & (k["side"] == b)
                        rule = hit if rule is None else rule | hit
            if self.include_self:
                own = (q_index == k_index) & (q["side"] != 0)
                rule = own if rule is None else rule | own
            if rule is None:
                rule = (q["side"] < 0) & (k["side"] < 0)  # an all-False table: nothing
            ok = both(rule)
        if ok is None:
            ok = (q_index >= 0) & (k_index >= 0)
        return ok
