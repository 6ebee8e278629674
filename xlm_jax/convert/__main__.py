"""`python -m xlm_jax.convert import-hf --hf_dir DIR --out DIR` / `export-hf --checkpoint DIR --out DIR`.

import-hf writes the xlm_jax format (xlm_jax_config.json + orbax params/); export-hf writes an
XLM-R-compatible directory (config.json + model.safetensors) that `transformers` loads.
"""
from __future__ import annotations

import sys

from xlm_jax import cli_help
from xlm_jax.convert import hf as hf_lib


def main(argv: list[str] | None = None) -> int:
    parser = cli_help.Parser(prog="python -m xlm_jax.convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import-hf", help="HF XLM-R directory -> xlm_jax model directory")
    imp.add_argument("--hf_dir", required=True, help="HF XLM-R directory (config.json, weights)")
    imp.add_argument("--out", required=True, help="the xlm_jax model directory to write")
    exp = sub.add_parser("export-hf", help="xlm_jax model/checkpoint -> HF XLM-R directory")
    exp.add_argument("--checkpoint", required=True, help="xlm_jax model dir or trainer model_dir")
    exp.add_argument("--out", required=True, help="the HF directory to write")
    args = parser.parse_args(argv)
    try:
        if args.command == "import-hf":
            cfg, params = hf_lib.load_hf_dir(args.hf_dir)
            hf_lib.save_xlm_jax(args.out, cfg, params, spm_from=args.hf_dir)
        else:
            cfg, params = hf_lib.load_xlm_jax(args.checkpoint)
            if cfg.cross_attention:  # a VECO stack: its NLU encoder is the exportable model
                from xlm_jax.models.reassemble import nlu_encoder

                cfg, params = nlu_encoder(cfg, params)
                print("VECO checkpoint: exporting the NLU encoder (cross-attention dropped)")
            hf_lib.save_hf_dir(args.out, cfg, params, spm_from=args.checkpoint)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
