"""`python -m xlm_jax.league`: every objective from one base, at the same training FLOPs.

Each paper measures its objective on its own data and budget. The league trains one base masked
LM (MMLM, long enough that it uses context: its held-out masked-LM loss well below the unigram
entropy of the targets), then continues every recipe from it for the same number of training
FLOPs (the trainer's own count, `xlm_jax.train.step_flops`: XLM-E's generator and ERNIE-M's extra
passes pay their way), over seeds, and scores each on Tatoeba retrieval (best layer and the
per-layer curve) and on the demo transfer task (English-trained, zero-shot accuracy over the
other languages, 3 fine-tuning seeds).

    python -m xlm_jax.league --seeds 3 --out league_output

Outputs in --out: league.json, league.md (the table), league.png (score against training
FLOPs), league_settings.json (what the league is: base, budget, recipes, seeds), base/ (the
base's trainer model directory and scores) and cells/RECIPE/seed_K/ (each cell's). Killed at
any point, the same command resumes: each cell is a trainer model directory (which resumes
exactly) with its scores cached beside it, and every training or fine-tuning runs in a
subprocess that dies with the league. A --out that holds a league of other settings is refused.
Recipes: gin_configs/league/RECIPE.gin; settings other than the flags: --gin_file /
--gin.LeagueConfig.NAME=VALUE (xlm_jax/league/plan.py). docs/league.md has the defaults, the
budget, the results and the GPU preset (--gin_file=league/gpu_1h.gin).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from xlm_jax.league import plan
from xlm_jax.league.runner import (DEFAULT_BASE_STEPS, DEFAULT_BUDGET_TFLOP, DEFAULT_SEEDS,
                                   SHIPPED_BASE, base_scores, ensure_base, make_plan,
                                   parse_recipes, run_league, ship_base, tatoeba_dir)


def _parser() -> argparse.ArgumentParser:
    from xlm_jax.train import cli

    p = cli.gin_parser("python -m xlm_jax.league", __doc__,
                       "LeagueConfig.transfer_bindings = ['run.finetune.train_steps = 100']")
    p.add_argument("--recipes", default=",".join(plan.RECIPES),
                   help="comma-separated recipes (gin_configs/league/RECIPE.gin)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="training seeds per recipe (0 .. N-1)")
    p.add_argument("--base_steps", type=int, default=DEFAULT_BASE_STEPS,
                   help="training steps of the base MMLM (league/base.gin)")
    p.add_argument("--budget_tflop", type=float, default=DEFAULT_BUDGET_TFLOP,
                   help="training TFLOPs of every recipe's continuation (the trainer's count: "
                        "xlm_jax.train.step_flops)")
    p.add_argument("--out", default="league_output",
                   help="the league's directory (resumed when it holds this league)")
    p.add_argument("--ship_base", default=None, metavar="DIR",
                   help=f"train (or reuse) and score the base in --out, write it to DIR as the "
                        f"package ships it ({SHIPPED_BASE}) and stop: no recipe is run")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from xlm_jax.train import cli

    argv = list(sys.argv if argv is None else ["python -m xlm_jax.league", *argv])
    args = cli.parse_flags(_parser(), argv)
    if isinstance(args, int):
        return args
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = " ".join(["python -m xlm_jax.league", *argv[1:]])

    def run() -> int:
        cli.parse_gin(args, placeholders=())
        config = plan.league_config()
        recipes = parse_recipes(args.recipes)
        p = make_plan(config, recipes, args.seeds, args.base_steps, args.budget_tflop,
                      os.path.abspath(args.out))
        if args.ship_base:
            base_dir = os.path.join(p.out, "base")
            ensure_base(base_dir, p.config, p.settings.base)
            base_scores(base_dir, p.config)
            shipped = ship_base(base_dir, args.ship_base, tatoeba_dir(p.config))
            print(f"base shipped to {shipped}", flush=True)
            return 0
        run_league(p, command)
        return 0

    return cli.run_reporting(run, args)


if __name__ == "__main__":
    sys.exit(main())
