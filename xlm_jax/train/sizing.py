"""`SIZE`, the one knob that makes any run file small, and the layer values that follow depth.

What: every run, demo and league file binds `loop.model_config.resize = %SIZE` (the
`models/*.gin` files and `league/common.gin` set `SIZE = None`: the file's own model), so
`--gin.SIZE="'tiny'"` gives any of them the encoder shape of a named size of
`models/config.py` (`resized`): its depth, width, heads and FFN, after the file's own
`overrides`. The file's other fields stay (vocabulary, position table, dropout, language
table, cross-attention, position type, dtype). The values that name a layer index or count
are written as "L of a D-layer model" (`'8/12'`: InfoXLM's universal layer 8 of base's 12,
paper Table 10) and resolved against the model's depth when the objective is built
(`layers_at_depth`): the paper's value at the paper's depth, the same fraction of any other
depth (`SIZE`, `python -m xlm_jax.accelerator.lower --depth`, a run file's `num_layers` override).

Why: "make it small" took a different knob per file (a repeated `overrides` dict for the demo
files, `NUM_LAYERS` for the league), and a layer index written as a number (XLCo's 8) does
not fit a model of 4 layers, so a small InfoXLM failed to build. An `int` stays a literal
layer (a user's `--gin.XLCO_LAYER=3` means layer 3 at any depth; out of range it is the
objective's one-line error), so a value is never rescaled behind the user's back.
"""
from __future__ import annotations

import fractions
import math
import re

from xlm_jax.models.config import SIZES, ModelConfig

# The fields of a named size that `SIZE` replaces: the encoder's shape. The vocabulary and the
# position table belong to the file's tokenizer and sequence length, and stay.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "mlp_dim")
# "up": ceil (XLCo's universal layer: the same fraction of the depth, rounded up, as
# league/infoxlm.gin's 3 of 4 for the paper's 8 of 12); "nearest": half up (XLM-E's generator:
# a third of the depth, rounded, as league/xlme.gin's 1 of 4). Our choices.
ROUNDINGS = ("up", "nearest")
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def resized(config: ModelConfig, size: str | None) -> ModelConfig:
    """`config` with the encoder shape (`SHAPE_FIELDS`) of the named size `size`
    (`models.config.SIZES`); `None` returns `config` unchanged (the file's own model)."""
    if size is None:
        return config
    if size not in SIZES:
        raise ValueError(f"SIZE={size!r}: unknown model size; valid sizes: {', '.join(SIZES)}")
    shape = {k: v for k, v in SIZES[size].items() if k in SHAPE_FIELDS}
    return config.replace(**shape)


def parse_spec(spec: str) -> tuple[int, int]:
    """`'L/D'` -> (L, D): layer (or layer count) L of a model D layers deep, 0 <= L <= D."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"layer value {spec!r}: expected an int (a literal layer), None or "
                         "'L/D' (L of a D-layer model, e.g. '8/12')")
    layers, depth = int(m.group(1)), int(m.group(2))
    if depth < 1 or layers > depth:
        raise ValueError(f"layer value {spec!r}: needs 0 <= L <= D and D >= 1")
    return layers, depth


def layers_at_depth(layers: int | str | None, model: ModelConfig,
                    rounding: str = "up") -> int | None:
    """A layer index or layer count for `model`'s depth. `layers`: an int (a literal value,
    returned as is), None (returned as is: the objective's own default, e.g. XLCo's last
    layer) or `'L/D'`, L of a D-layer model (what a paper states), which becomes
    L x depth / D rounded by `rounding` ("up" or "nearest"), at least 1 when L >= 1 and at
    most the depth: exactly L at depth D. gin-callable (`@scope/sizing.layers_at_depth()`
    with `model = @loop.model_config()`): gin cannot compute, hence a function."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"layers_at_depth: rounding={rounding!r} must be one of "
                         f"{', '.join(ROUNDINGS)}")
    if layers is None or (isinstance(layers, int) and not isinstance(layers, bool)):
        return layers
    wanted, of = parse_spec(layers)
    exact = fractions.Fraction(wanted * model.num_layers, of)
    scaled = math.ceil(exact) if rounding == "up" else math.floor(exact + fractions.Fraction(1, 2))
    return min(model.num_layers, max(scaled, 1 if wanted else 0))
