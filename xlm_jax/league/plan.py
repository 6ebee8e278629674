"""What the objective league trains: its settings, its recipes and their cost in FLOPs.

`python -m xlm_jax.league` (xlm_jax/league/runner.py) trains one base masked LM and continues every
recipe from it for the same training FLOPs. This module holds what the CLI and the per-paper
demos (`python -m xlm_jax.demo`) share:

- `LeagueConfig`: every setting that is not a flag (gin-configurable: `--gin_file`,
  `--gin.LeagueConfig.NAME=VALUE`).
- `RECIPES`: the recipe names; recipe R is `gin_configs/league/R.gin`.
- `recipe_cost`: a recipe's FLOPs per step by the trainer's own accounting
  (`xlm_jax.train.step_flops.mixture_flops_per_token`, which counts XLM-E's generator, ERNIE-M's
  CAMLM passes and BTMLM's decoding pass, VECO's four passes, XLCo's key encoder). It is the one
  place that calls into trainer internals (`_trainer_cost`), so it is easy to adapt if they move.
- `fraction_of_steps`: a gin-callable step count as a fraction of TRAIN_STEPS (warm-ups that
  scale with the budget).

Imports nothing heavy at module level: the recipe gin files import it in every training
subprocess.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any
import gin

# The league's recipes, in the order of the table (control first). Recipe R is the gin file
# league/R.gin, a trainer configuration continued from the base with `init_from`.
RECIPES: tuple[str, ...] = ("mmlm", "xlm", "infoxlm", "xlme", "xlme_no_trtd", "ernie_m",
                            "veco")
CONTROL = "mmlm"
RECIPE_TITLES: dict[str, str] = {
    "mmlm": "MMLM continued (control)",
    "xlm": "XLM: MMLM + TLM",
    "infoxlm": "InfoXLM: MMLM + TLM + XLCo",
    "xlme": "XLM-E: MRTD + TRTD",
    "xlme_no_trtd": "XLM-E without TRTD",
    "ernie_m": "ERNIE-M: MMLM + TLM + CAMLM + BTMLM",
    "veco": "VECO: IS-MLM + CS-MLM (+ TLM)",
}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LeagueConfig:
    """The league's settings other than its flags. Defaults are the 2-CPU-core league
    (docs/league.md); `gin_configs/league/gpu_1h.gin` and `league/tiny.gin` rebind them.

    Bindings are gin strings handed to the training subprocesses: `shared_bindings` to the
    base and every cell (the macros of league/common.gin: model size, batch, length, learning
    rates), `base_bindings` to the base only, `recipe_bindings[R]` to recipe R's cells only.
    """

    base_gin: tuple[str, ...] = ("league/base.gin",)
    shared_bindings: tuple[str, ...] = ()
    base_bindings: tuple[str, ...] = ()
    recipe_bindings: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # Held-out split (Tatoeba layout) of retrieval and the masked-LM check; None = all its
    # languages.
    tatoeba_dir: str = "tasks/demo_data/tatoeba"
    languages: tuple[str, ...] | None = None
    # The transfer task: gin files and bindings of `python -m xlm_jax.finetune`; () = skip.
    transfer_gin: tuple[str, ...] = ("finetune/demo_pawsx.gin",)
    transfer_bindings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # gin hands lists; keep tuples (the record compares them) and check recipe names.
        for name in ("base_gin", "shared_bindings", "base_bindings", "transfer_gin",
                     "transfer_bindings"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.languages is not None:
            object.__setattr__(self, "languages", tuple(self.languages))
        unknown = [r for r in self.recipe_bindings if r not in RECIPES]
        if unknown:
            raise ValueError(f"LeagueConfig.recipe_bindings: unknown recipe {unknown[0]!r} "
                             f"(recipes: {', '.join(RECIPES)})")
        object.__setattr__(self, "recipe_bindings",
                           {r: tuple(b) for r, b in self.recipe_bindings.items()})

    def recipe_gin(self, recipe: str) -> tuple[str, ...]:
        """The gin files of recipe `recipe`'s cells."""
        return (f"league/{recipe}.gin",)

    def bindings_for(self, recipe: str) -> tuple[str, ...]:
        """Shared bindings, then the recipe's own."""
        return (*self.shared_bindings, *tuple(self.recipe_bindings.get(recipe, ())))

    def base_bindings_all(self) -> tuple[str, ...]:
        return (*self.shared_bindings, *self.base_bindings)


def league_config() -> LeagueConfig:
    """The `LeagueConfig` with the parsed gin bindings applied (the class is gin-configurable:
    calling it applies them)."""
    return LeagueConfig()


@gin.configurable
def fraction_of_steps(total: int, fraction: float, multiple: int = 1, minimum: int = 0) -> int:
    """round(`fraction` x `total`) down to a multiple of `multiple`, at least `minimum`, at
    most `total`: a warm-up that scales with the budget (gin cannot multiply)."""
    steps = int(round(fraction * total)) // multiple * multiple
    return max(minimum, min(total, steps)) if total > 0 else 0


@gin.configurable
def model_overrides(num_layers: int, hidden_size: int, num_heads: int, mlp_dim: int,
                    dropout_rate: float, fields: Mapping[str, Any] = (),
                    extra: Mapping[str, Any] = ()) -> dict[str, Any]:
    """`loop.model_config.overrides` of the league's runs: the shared dimensions and dropout
    (macros of league/common.gin, one binding away for every run), the shared `fields`, and a
    recipe's `extra` structure (cross-attention, language table, relative positions). gin
    cannot merge dicts, hence a function."""
    return {**dict(fields), "num_layers": num_layers, "hidden_size": hidden_size,
            "num_heads": num_heads, "mlp_dim": mlp_dim, "dropout_rate": dropout_rate,
            "attention_dropout_rate": dropout_rate, **dict(extra)}


@gin.configurable
def prediction_slots(seq_len: int, rate: float) -> int:
    """Static MLM prediction slots per row for masking `rate` at length `seq_len`:
    floor(rate x seq_len) + 1, the demo files' rule (more slots than the rate selects is
    never a drop; the objectives refuse fewer). gin-callable, so the slots follow SEQ_LEN."""
    return int(rate * seq_len) + 1


@dataclasses.dataclass(frozen=True)
class RecipeCost:
    """A training configuration's cost: the trainer's FLOPs per token, the tokens (row
    positions, padding included, as the step computes them and as `flops_per_token` counts
    them) per step averaged over the mixture's cycle, and the cycle (VECO alternates 2)."""

    flops_per_token: float
    tokens_per_step: float
    cycle: int
    config_digest: str  # sha256 of gin's configuration text: equal settings, equal digest

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_token * self.tokens_per_step

    def steps_for(self, budget_flops: float) -> int:
        """Whole mixture cycles within `budget_flops` (0 when not even one fits)."""
        cycles = math.floor(budget_flops / (self.cycle * self.flops_per_step) * (1 + 1e-12))
        return max(0, cycles) * self.cycle

    def train_flops(self, steps: int) -> float:
        """FLOPs of `steps` steps (whole cycles: exact)."""
        return steps * self.flops_per_step


def recipe_cost(gin_files: Sequence[str], bindings: Sequence[str]) -> RecipeCost:
    """Parses the training configuration (nothing built but the objectives: no data, no
    parameters) and returns its cost. Clears gin's global configuration before and after (the
    caller reads its own configuration, `LeagueConfig`, first)."""
    from xlm_jax.train import gin_utils

    gin.clear_config()
    try:
        gin_utils.parse(list(gin_files), list(bindings), check_required=False)
        # the shipped paths gin_utils made absolute depend on the working directory: not hashed
        text = gin.config_str().replace(gin_utils.PACKAGE_ROOT + os.sep, "")
        digest = hashlib.sha256(text.encode()).hexdigest()
        fpt, tokens, cycle = _trainer_cost()
    finally:
        gin.clear_config()
    return RecipeCost(flops_per_token=fpt, tokens_per_step=tokens, cycle=cycle,
                      config_digest=digest)


def _trainer_cost() -> tuple[float, float, int]:
    """(FLOPs per token, row positions per step, cycle) of the parsed `loop.train`: the
    objectives built as `train.setup.build_objective` builds them (each factory called with
    the model, its name and the run arguments it declares; no language table, as the FLOPs
    do not depend on it), the mixture's shapes from `train.mixture`, the FLOPs from
    `train.step_flops.mixture_flops_per_token`. THE one function that reads trainer internals."""
    from xlm_jax.data.features import example_kind
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.train import step_flops as flops, mixture, setup

    kw = gin.get_bindings("loop.train")
    net = Transformer(kw["model"])
    shapes = mixture.resolve(kw["objectives"], kw["batch_size"], kw["seq_len"])
    objs = [setup.build_objective(net, name, spec, None, check_tasks=False)
            for name, spec in kw["objectives"].items()]
    ordered = [shapes[o.name] for o in objs]
    fpt = flops.mixture_flops_per_token(objs, kw["seq_len"], ordered)
    tokens = sum(s.batch_size * len(example_kind(o.kind).prefixes) * s.seq_len / s.every
                 for o, s in zip(objs, ordered))
    return float(fpt), float(tokens), mixture.cycle_length(shapes)
