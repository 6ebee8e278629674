"""`python -m xlm_jax.evaluation.metrics METRIC --gold FILE --pred FILE [--lang xx]`: prints
one JSON object of 0-100 scores on stdout.

    squad    SQuAD v1.1 dataset JSON + predictions {id: text} -> exact_match, f1, total, missing
    mlqa     as squad, with MLQA's normalisation for answer language --lang
    seqeval  CoNLL files (token first, label last) -> precision, recall, f1, per_type
    aer      Pharaoh alignments (gold: i-j sure, ipj possible) -> aer, precision, recall
    bucc     src_id<TAB>tgt_id pair files -> precision, recall, f1

Any error (unreadable or malformed input, a usage error) prints one line on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from xlm_jax import cli_help
from xlm_jax.evaluation.metrics import (aer_files, bucc_files, mlqa_evaluate_files,
                                        seqeval_files, squad_evaluate_files)
from xlm_jax.evaluation.metrics.squad import MLQA_LANGUAGES


_METRICS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "squad": ("SQuAD v1.1 exact match and token F1", squad_evaluate_files),
    "mlqa": ("MLQA exact match and token F1 (language-specific normalisation)",
             mlqa_evaluate_files),
    "seqeval": ("span precision/recall/F1 of CoNLL label files (seqeval default mode)",
                seqeval_files),
    "aer": ("alignment error rate of Pharaoh alignments", aer_files),
    "bucc": ("precision/recall/F1 of mined sentence pairs", bucc_files),
}


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: one subcommand per metric, each with --gold and --pred."""
    parser = cli_help.Parser(
        prog="python -m xlm_jax.evaluation.metrics",
        description="Score predictions against gold files; prints one JSON object with scores "
                    "on a 0-100 scale.")
    commands = parser.add_subparsers(dest="metric", required=True, metavar="METRIC")
    for name, (help_text, _) in _METRICS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--gold", required=True, metavar="FILE", help="gold file")
        sub.add_argument("--pred", required=True, metavar="FILE", help="predictions file")
        if name == "mlqa":
            sub.add_argument("--lang", required=True, metavar="xx",
                             help=f"answer language, one of {', '.join(MLQA_LANGUAGES)}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0, or 2 after printing `error: ...`)."""
    args = build_parser().parse_args(argv)
    score = _METRICS[args.metric][1]
    try:
        if args.metric == "mlqa":
            result = score(args.gold, args.pred, args.lang)
        else:
            result = score(args.gold, args.pred)
    except (ValueError, OSError) as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
