"""`python -m xlm_jax.embed --model DIR --input FILE --layer 8 --pool mean --out FILE.npy`.

Embeds each line of FILE (UTF-8, one sentence per line) with the model's SentencePiece model and
saves a float32 array [num_lines, hidden] to FILE.npy: `Encoder.embed`, the same vectors as
Tatoeba retrieval (`xlm_jax.evaluation.retrieval`) computes for the same layer, pool and length.
"""
from __future__ import annotations

import sys

import numpy as np

from xlm_jax import cli_help


def main(argv: list[str] | None = None) -> int:
    from xlm_jax.cli_help import HelpFormatter

    p = cli_help.Parser(prog="python -m xlm_jax.embed", description=__doc__,
                        formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="HF XLM-R dir or xlm_jax model dir")
    p.add_argument("--input", required=True, help="text file, one sentence per line")
    p.add_argument("--layer", type=int, default=8, help="0 = embeddings, L = last layer")
    p.add_argument("--pool", default="mean", choices=("mean", "cls"),
                   help="how a sentence's tokens pool")
    p.add_argument("--batch_size", type=int, default=32, help="sentences per forward pass")
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sentence with <s> and </s>, longer ones truncated (default: "
                        "xlm_jax.encoder.DEFAULT_MAX_LENGTH, capped at the model's positions)")
    p.add_argument("--out", required=True, help="output .npy")
    args = p.parse_args(argv)
    from xlm_jax.encoder import load_encoder

    try:
        with open(args.input, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
        enc = load_encoder(args.model)
        vecs = enc.embed(lines, layer=args.layer, pool=args.pool, batch_size=args.batch_size,
                         max_length=args.max_length)
    except (ValueError, FileNotFoundError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    np.save(args.out, vecs.astype(np.float32))
    print(f"wrote {args.out}: {vecs.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
