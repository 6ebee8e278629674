"""`python -m xlm_jax.finetune --gin_file=finetune/TASK.gin --init_from=CKPT --model_dir=DIR
[--gin.NAME=VALUE ...]`: fine-tune with several seeds, select on dev, score every test
language, write results.json and results.md into DIR (see xlm_jax/finetune/run.py)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from xlm_jax import cli_help
from xlm_jax.train import cli


def _parser() -> argparse.ArgumentParser:
    p = cli.gin_parser("python -m xlm_jax.finetune", __doc__, "run.finetune.train_steps = 100")
    p.add_argument("--init_from", required=True,
                   help="the pre-trained model: an xlm_jax model_dir or an HF XLM-R directory")
    p.add_argument("--model_dir", required=True, help="where runs and results go")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = cli.parse_flags(_parser(), argv)
    if isinstance(args, int):
        return args
    from xlm_jax.finetune import run

    outcome = []

    def go() -> int:
        with cli_help.tensorflow_quietly():  # TF only if a gin file imports a task module
            cli.parse_gin(args)
        outcome.append(run.finetune(args.model_dir, init_from=args.init_from))
        return 0

    if cli.run_reporting(go, args):
        return 1
    results = outcome[0]
    gap = results["transfer_gap"]
    print(f"done: {results['metric']} average {results['average']:.1f}"
          + ("" if gap is None else f", transfer gap {gap:.1f}")
          + f"; {args.model_dir}/{run.RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
