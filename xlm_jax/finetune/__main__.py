"""`python -m xlm_jax.finetune --gin_file=finetune/TASK.gin --init_from=CKPT --model_dir=DIR
[--gin.NAME=VALUE ...]`: fine-tune with several seeds, select on dev, score every test
language, write results.json and results.md into DIR (see xlm_jax/finetune/run.py)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m xlm_jax.finetune", description=__doc__, allow_abbrev=False,
        epilog="--gin.NAME=VALUE is short for --gin_bindings='NAME = VALUE'.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file (repeatable), searched in --gin_search_paths, the working "
                        "directory and gin_configs/")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="extra gin binding (repeatable), e.g. 'finetune.train_steps = 100'")
    p.add_argument("--gin_search_paths", default="",
                   help="comma-separated extra directories to look for gin files in")
    p.add_argument("--init_from", required=True,
                   help="the pre-trained model: an xlm_jax model_dir or an HF XLM-R directory")
    p.add_argument("--model_dir", required=True, help="where runs and results go")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from xlm_jax.train import gin_utils

    argv = gin_utils.rewrite_gin_args(list(sys.argv if argv is None else argv))[1:]
    parser = _parser()
    if any(a in HELP_FLAGS for a in argv):
        parser.print_help()
        return 0
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        from xlm_jax.finetune import run

        search = [d for d in args.gin_search_paths.split(",") if d]
        gin_utils.parse(args.gin_file, args.gin_bindings, search)
        results = run.finetune(args.model_dir, init_from=args.init_from)
    except (ValueError, OSError, FloatingPointError, KeyError, TypeError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        print(f"error: {type(e).__name__}: {' | '.join(lines)}", file=sys.stderr)
        return 1
    gap = results["transfer_gap"]
    print(f"done: {results['metric']} average {results['average']:.1f}"
          + ("" if gap is None else f", transfer gap {gap:.1f}")
          + f"; {args.model_dir}/{run.RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
