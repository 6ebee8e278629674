"""`python -m xlm_jax.accelerator.compile`: the CLI of `xlm_jax.accelerator.compile` (see its
docstring)."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from xlm_jax import cli_help
from xlm_jax.accelerator.compile import fit_report as report_lib
from xlm_jax.accelerator.compile import targets as targets_lib

# imports no jax: this CLI sets jax's environment first
from xlm_jax.accelerator.lower import BACKENDS

# models.config.REMAT_POLICIES, restated: importing it imports jax before the target's
# environment (JAX_PLATFORMS and libtpu's variables) is set
REMAT = ("none", "full", "dots_saveable")


class FlagError(ValueError):
    """A bad flag value: one line naming the flag and the value (exit 2)."""


def _parser() -> argparse.ArgumentParser:
    import xlm_jax.accelerator.compile as tool

    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.compile", description=tool.__doc__)
    p.add_argument("--gin_file", action="append", default=[],
                   help="run file(s), e.g. runs/xlme_base.gin (required)")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="gin bindings (also --gin.NAME=VALUE)")
    p.add_argument("--target", default=None,
                   help="TPU topology (v4:2x2x1, v5e:4x4, v5p:4x4x4, v6e:2x2) or GPU node "
                   "(h100:1x1x8, h200:1x1x8, b200:1x1x8) (required)")
    p.add_argument("--mesh", default=None, help="AXIS=SIZE,... over data, fsdp, tensor (default: "
                   "the tool's choice for the target, said in the output)")
    p.add_argument("--batch_size", type=int, default=None,
                   help="global rows per objective (default: the run file's)")
    p.add_argument("--seq_len", type=int, default=None,
                   help="tokens per row (default: the run file's)")
    p.add_argument("--remat", default=None, help=f"override the model's remat: {', '.join(REMAT)}")
    p.add_argument("--accum_steps", type=int, default=None,
                   help="override loop.train.accum_steps (gradient accumulation)")
    p.add_argument("--attention_backend", default=None,
                   help=f"override the run file's: {', '.join(BACKENDS)}")
    p.add_argument("--size", default=None, help="model size override, e.g. tiny")
    p.add_argument("--depth", type=int, default=None,
                   help="reduced depth: DEPTH layers of the run file's kind (a quick check)")
    p.add_argument("--no_collectives", action="store_true",
                   help="skip the collectives (they need the compiled HLO's text: minutes and "
                   "GBs for a base model)")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    return p


def _validate(args: argparse.Namespace) -> tuple[targets_lib.Target, dict[str, int] | None]:
    if not args.gin_file:
        raise FlagError("--gin_file is required (a run file, e.g. runs/xlme_base.gin)")
    if not args.target:
        raise FlagError("--target is required, e.g. v5p:2x2x1 or h100:1x1x8")
    target = targets_lib.parse_target(args.target)
    for flag in ("batch_size", "seq_len", "accum_steps", "depth"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise FlagError(f"--{flag} {value}: must be positive")
    if args.attention_backend is not None and args.attention_backend not in BACKENDS:
        raise FlagError(f"--attention_backend {args.attention_backend!r}: expected one of "
                        f"{', '.join(BACKENDS)}")
    if args.remat is not None and args.remat not in REMAT:
        raise FlagError(f"--remat {args.remat!r}: expected one of {', '.join(REMAT)}")
    mesh = None
    if args.mesh is not None:
        from xlm_jax.accelerator import pod_memory

        try:
            mesh = pod_memory.parse_mesh(args.mesh)
        except ValueError as e:
            raise FlagError(str(e)) from None
        if any(v == 0 or v < -1 for v in mesh.values()):
            raise FlagError(f"--mesh {args.mesh!r}: every axis size must be >= 1 (or -1)")
        known = [v for v in mesh.values() if v > 0]
        import math

        if target.chips % math.prod(known):
            raise FlagError(f"--mesh {args.mesh!r}: {math.prod(known)} devices do not divide "
                            f"the {target.chips} of {target.name}")
    missing = targets_lib.runtime_missing(target)
    if missing:
        raise FlagError(f"--target {args.target}: {missing}")
    return target, mesh


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (0 fits, 1 does not compile or fit, 2 bad input)."""
    from xlm_jax.train.gin_utils import rewrite_gin_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(rewrite_gin_args(argv))
    try:
        target, mesh = _validate(args)
    except ValueError as e:  # FlagError, TargetError
        print(f"error: {e}", file=sys.stderr)
        return 2
    targets_lib.prepare_environment(target)  # before jax starts
    from xlm_jax.accelerator import compile as tool
    from xlm_jax.accelerator.lower import LowerError
    from xlm_jax.train.cli import error_line

    try:
        report = tool.compile_run(args.gin_file, args.gin_bindings, target, mesh,
                                  args.batch_size, args.seq_len, args.remat, args.accum_steps,
                                  args.size, args.depth, args.attention_backend,
                                  collectives=not args.no_collectives)
    except (targets_lib.TargetError, LowerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a run file that cannot be built: one line
        print(f"error: {', '.join(args.gin_file)} does not build for {target.name}: "
              f"{error_line(e).removeprefix('error: ')}", file=sys.stderr)
        return 2
    print(report_lib.format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if not report["fits"]:
        print(f"error: {', '.join(args.gin_file)} on {target.name}: "
              f"{report_lib.verdict(report)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
