"""XLM-E in the objective league: the generator starts from the base, not from scratch.

The league continues every recipe from one base masked LM (`python -m xlm_jax.league`). The
trainer's `init_from` loads the *encoder* (XLM-E's discriminator) and leaves the objectives'
own modules at their initialisation; `objectives/xlme.py` has no `adapt_pretrained`, so its
generator would start random. The paper trains generator and discriminator together from
scratch (XLM-E §4.1); continuing a trained discriminator with a random generator would pair a
masked LM that uses context with a generator whose samples are random words, replacements
the discriminator tells apart without reading the other side of a pair (docs/NOTES.md, "XLM-E":
that is what kept the demo's TRTD from aligning anything).

Our choice, therefore: the generator is a truncated copy of the base. Every generator
parameter that the base encoder has at the same path and shape is copied from it: the first
`generator_layers` layers, the embedding block's own tables (position, token type, LayerNorm;
the token table is shared anyway), the final LayerNorm and the MLM head. What the base lacks
keeps its initialisation (the gated relative bias when the base has absolute positions only).
A narrower generator shares no shapes and starts from scratch, as in the paper.

`generator_from_encoder` wraps the library's `ReplacedTokenDetection` (one instance per stream;
MRTD and TRTD share the module, so both copy the same values); the gin files
`league/xlme.gin` and `league/xlme_no_trtd.gin` use it as the objectives' factory.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gin
import jax
import numpy as np

ENCODER = "encoder"
OBJECTIVES = "objectives"


@gin.configurable
def generator_from_encoder(model: Any, name: str, rtd: Callable[..., Any] = gin.REQUIRED
                           ) -> Any:
    """`rtd(model=model, name=name)` (an `xlme.ReplacedTokenDetection` factory) whose
    `adapt_pretrained` copies the loaded encoder into the generator (`copy_into_generator`)."""
    objective = rtd(model=model, name=name)

    def adapt_pretrained(params: Any) -> Any:
        return copy_into_generator(params, objective.generator_module)

    objective.adapt_pretrained = adapt_pretrained  # the trainer calls it after init_from
    return objective


def copy_into_generator(params: Any, module: str = "generator") -> Any:
    """`params` (the train state's `{"encoder", "objectives"}` tree) with every parameter of
    `objectives[module]` that the encoder has at the same path replaced by the encoder's: equal
    shapes are copied whole, a stacked layer array (`layers/...`, leading layer axis) gives
    its first layers to a shallower generator stack; other shapes keep the generator's."""
    encoder = {jax.tree_util.keystr(p): v for p, v in
               jax.tree_util.tree_flatten_with_path(params[ENCODER])[0]}

    def pick(path: Any, value: Any) -> Any:
        new = encoder.get(jax.tree_util.keystr(path))
        if new is None:
            return value
        if tuple(new.shape) == tuple(value.shape):
            return new
        stacked = str(getattr(path[0], "key", "")) == "layers"
        if (stacked and new.ndim == value.ndim and new.shape[1:] == value.shape[1:]
                and new.shape[0] > value.shape[0]):
            return np.asarray(new)[:value.shape[0]]
        return value

    objectives = dict(params[OBJECTIVES])
    objectives[module] = jax.tree_util.tree_map_with_path(pick, objectives[module])
    return {**params, OBJECTIVES: objectives}
