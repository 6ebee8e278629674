"""`python -m xlm_jax.convert import-hf --hf_dir DIR --out DIR` /
`export-hf --checkpoint DIR --out DIR [--step N] [--format auto|xlm-roberta|xlm_jax]
[--overwrite]`.

export-hf writes an HF directory that `transformers` loads: an XLM-R-shaped model (post-LN,
absolute positions, no language table) as XLM-R (config.json + model.safetensors, read by
`XLMRobertaModel`), any other model (pre-LN, XLM-E's gated relative position bias, language
embeddings) in the self-contained format of `xlm_jax.convert.remote`, which loads with
`AutoModel.from_pretrained(DIR, trust_remote_code=True)`. A VECO checkpoint exports its NLU
encoder (cross-attention dropped). import-hf reads either kind back into the xlm_jax format
(xlm_jax_config.json + orbax params/).
"""
from __future__ import annotations

import sys

from xlm_jax import cli_help
from xlm_jax import model_dir as md
from xlm_jax.convert import hf as hf_lib

FORMATS = ("auto", "xlm-roberta", "xlm_jax")


def _parser() -> cli_help.Parser:
    parser = cli_help.Parser(prog="python -m xlm_jax.convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import-hf", help="HF directory (XLM-R or exported) -> xlm_jax model "
                                           "directory")
    imp.add_argument("--hf_dir", required=True,
                     help="HF directory: XLM-R (config.json, weights) or one export-hf wrote")
    imp.add_argument("--out", required=True, help="the xlm_jax model directory to write")
    exp = sub.add_parser("export-hf", help="xlm_jax model/checkpoint -> HF directory")
    exp.add_argument("--checkpoint", required=True, help="xlm_jax model dir or trainer model_dir")
    exp.add_argument("--out", required=True, help="the HF directory to write")
    exp.add_argument("--step", type=int, default=None,
                     help="checkpoint step of a trainer model_dir (default: the latest)")
    exp.add_argument("--format", choices=FORMATS, default="auto",
                     help="xlm-roberta: HF's XLMRobertaModel (XLM-R-shaped models only); "
                          "xlm_jax: the self-contained remote-code model (any model); auto "
                          "(default): xlm-roberta when the model is XLM-R-shaped, else xlm_jax")
    exp.add_argument("--overwrite", action="store_true",
                     help="replace what --out holds (a non-empty directory is refused "
                          "otherwise); the new export replaces it only once fully written")
    return parser


def import_hf(hf_dir: str, out: str) -> None:
    """An HF directory (XLM-R, or what `export_hf` wrote) -> an xlm_jax model directory,
    with its SentencePiece model and language list when it has them."""
    cfg, params = hf_lib.load_hf_dir(hf_dir)
    md.check_writable(out, "import-hf --out")
    hf_lib.save_xlm_jax(out, cfg, params, spm_from=hf_dir)
    languages = md.read_languages(hf_dir)
    if languages:
        md.write_languages(out, languages)


def export_hf(checkpoint: str, out: str, step: int | None = None, fmt: str = "auto",
              overwrite: bool = False) -> str:
    """Writes `checkpoint`'s encoder (checkpoint `step` of a trainer model_dir, default the
    latest) as an HF directory `out` in format `fmt` (`FORMATS`); returns the format written.
    A non-empty `out` is refused unless `overwrite`; the directory appears whole or not at
    all, its files with the user's umask (`model_dir.staged`)."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")
    md.refuse_unless_empty(out, "export-hf --out", overwrite)  # before the reading
    cfg, params = hf_lib.load_xlm_jax(checkpoint, step=step)
    if cfg.cross_attention:  # a VECO stack: its NLU encoder is the exportable model
        from xlm_jax.models.reassemble import nlu_encoder

        cfg, params = nlu_encoder(cfg, params)
        print("VECO checkpoint: exporting the NLU encoder (cross-attention dropped)")
    if fmt == "auto":
        fmt = "xlm-roberta" if hf_lib.is_xlmr_shaped(cfg) else "xlm_jax"
    if fmt == "xlm-roberta":
        hf_lib.model_config_to_hf_config(cfg)  # names what XLM-R lacks before writing anything
    with md.staged(out, "export-hf --out", replace=overwrite) as where:
        if fmt == "xlm-roberta":
            hf_lib.save_hf_dir(where, cfg, params, spm_from=checkpoint)
        else:
            from xlm_jax.convert import remote

            remote.save_remote_dir(where, cfg, params, spm_from=checkpoint,
                                   languages=md.read_languages(checkpoint))
    return fmt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "import-hf":
            import_hf(args.hf_dir, args.out)
            print(f"wrote {args.out}")
        else:
            fmt = export_hf(args.checkpoint, args.out, step=args.step, fmt=args.format,
                            overwrite=args.overwrite)
            how = ("XLMRobertaModel" if fmt == "xlm-roberta" else
                   "AutoModel.from_pretrained(..., trust_remote_code=True)")
            print(f"wrote {args.out} (loads with {how})")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
