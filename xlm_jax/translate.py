"""`python -m xlm_jax.translate --gin_file=finetune/veco_translate.gin --model_dir=DIR`.

Fine-tunes an encoder-decoder reassembled from a VECO stack on a translation task (the
`Translation` objective through the trainer: teacher forcing, label smoothing, checkpoints,
resume), then translates a held-out test set with beam search and scores the detokenised
output with sacreBLEU (`xlm_jax.evaluation.bleu.evaluate`). Writes `translations.txt`
and `bleu.json` into the model directory and prints the score. `--init_from` starts from a
pre-trained checkpoint (VECO: the decoder takes the stack's last layers); without it the model
starts from random initialisation.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from xlm_jax import cli_help


def main(argv: Sequence[str] | None = None) -> int:
    from xlm_jax.evaluation import bleu as translation_eval
    from xlm_jax.train import cli, gin_utils, loop

    argv = gin_utils.rewrite_gin_args(list(sys.argv[1:] if argv is None else argv))
    p = cli_help.Parser(prog="python -m xlm_jax.translate", description=__doc__,
                        formatter_class=cli.HelpFormatter)
    p.add_argument("--gin_file", action="append", required=True,
                   help="gin file (repeatable), e.g. finetune/veco_translate.gin")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="extra gin binding (repeatable); --gin.NAME=VALUE is short for it")
    p.add_argument("--model_dir", required=True,
                   help="where checkpoints, translations.txt and bleu.json go")
    p.add_argument("--init_from", default=None, help="pre-trained checkpoint (VECO stack)")
    p.add_argument("--skip_training", action="store_true", help="evaluate the checkpoint only")
    args = p.parse_args(argv)
    bindings = list(args.gin_bindings)
    if args.init_from:
        bindings.append(f"loop.train.init_from = {args.init_from!r}")
    try:
        with cli_help.tensorflow_quietly():  # a gin file importing a task module imports TF
            gin_utils.parse(args.gin_file, bindings)
        translation_eval.evaluate(args.model_dir, check_only=True)
        if not args.skip_training:
            loop.train(args.model_dir)
        result = translation_eval.evaluate(args.model_dir)
    except (ValueError, OSError, ImportError) as e:
        if cli.debug_wanted():
            raise
        # gin appends "In call to configurable ..." on a second line: keep the message
        print(f"error: {gin_utils.user_names(str(e).splitlines()[0])}", file=sys.stderr)
        return 2
    print(f"BLEU {result['bleu']:.2f} ({result['source_lang']}->{result['target_lang']}, "
          f"{result['sentences']} sentences, beam {result['beam_size']}): {result['signature']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
