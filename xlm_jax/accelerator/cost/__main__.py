"""`python -m xlm_jax.accelerator.cost`: the predicted step time and MFU of a run file on a
target, op by op, from the step XLA compiles for it (on this CPU, with the target's
compile-only devices, as `python -m xlm_jax.accelerator.compile` does).

  python -m xlm_jax.accelerator.cost --target h200:1x1x1 --gin_file=runs/xlmr_base_mmlm.gin \\
      [--batch_size 32 --seq_len 512] [--gin.NAME=VALUE ...] [--top 12] [--json OUT]
  python -m xlm_jax.accelerator.cost --target h100:1x1x1 --hlo DUMP_after_optimizations.txt \\
      --seq_len 512 [--model_flops F]   # an HLO dumped on a device (XLA_FLAGS=--xla_dump_to)

Prints the predicted step time, the predicted MFU (model FLOPs of `xlm_jax.train.step_flops`
on the step's non-pad tokens, over the chip's bf16 peak: the benchmark's definition), the
time by kind of op (matmul, attention kernel, elementwise/fusion, RNG, gather/scatter,
copy/transpose, collective, optimizer update) and the top ops of each kind; `--json` writes
`predicted_step_ms`, `predicted_mfu`, `ops` (every op) and the rest. `cost.model` says how an
op is timed and what the model cannot see; `cost.chips` where each rate comes from.

Exit status: 0 predicted; 1 the run file does not compile for the target; 2 a bad flag, an
unknown target, an unreadable HLO file, or the target's compiler is not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help
from xlm_jax.accelerator.compile import targets as targets_lib
from xlm_jax.accelerator.compile.__main__ import FlagError
from xlm_jax.accelerator.compile.__main__ import _parser as _compile_parser
from xlm_jax.accelerator.compile.__main__ import _validate as _validate_compile

CANNOT_SEE = (
    "a Pallas kernel's inside (timed from its shapes at the efficiency measured for it)",
    "contention on atomics (assumed only for non-native atomics into a vocabulary-sized "
    "table)",
    "caches (every operand is read from HBM once per op)",
    "overlap of collectives with compute (summed)",
    "whether XLA:TPU's asynchronous copies between memory spaces are hidden behind compute "
    "(taken as hidden: listed, not in the step)",
    "the host: dispatch gaps between steps and the input pipeline",
    "autotuning choices on the device that differ from the compile-only target's",
)


def _parser() -> argparse.ArgumentParser:
    p = _compile_parser()
    p.prog = "python -m xlm_jax.accelerator.cost"
    p.description = __doc__
    p.add_argument("--hlo", default=None,
                   help="read this optimised HLO text (an XLA dump) instead of compiling")
    p.add_argument("--model_flops", type=float, default=None,
                   help="with --hlo: model FLOPs per step per device, for the MFU")
    p.add_argument("--top", type=int, default=3, help="top ops listed per kind (default 3)")
    p.add_argument("--dump_hlo", default=None,
                   help="also write the compiled step's optimised HLO text here (to read it)")
    return p


def write_json_atomic(path: str, data: Any) -> None:
    """`data` as JSON at `path` through a temporary file in the same folder and a rename, so
    that a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cost-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def format_report(data: dict[str, Any], top: int) -> str:
    """The printed report: headline, time by kind, the top ops of each kind."""
    mfu = data["predicted_mfu"]
    lines = [f"{data['source']} on {data['target']} ({data['chip']})",
             f"predicted step {data['predicted_step_ms']:.1f} ms, MFU "
             f"{'n/a' if mfu is None else f'{mfu:.1%}'} (calibrated: {data['calibration']}); "
             f"roofline {data['roofline_step_ms']:.1f} ms"]
    if data.get("compile_seconds"):
        cs = data["compile_seconds"]
        lines.append(f"lower {cs['lower']} s, compile {cs['compile']} s (on this host)")
    lines += ["", "| kind | predicted ms | share |", "|---|---|---|"]
    total = data["predicted_step_ms"] or 1.0
    for kind, ms in data["by_kind_ms"].items():
        lines.append(f"| {kind} | {ms:.2f} | {ms / total:.1%} |")
    copies = data.get("overlapped_copies") or {}
    if copies.get("ops"):
        lines += ["", f"not in the step: {copies['ops']} asynchronous copies between memory "
                      f"spaces (prefetches into and evictions from VMEM, overlapping compute): "
                      f"{copies['bytes'] / 1e9:.2f} GB, {copies['alone_ms']:.2f} ms if alone"]
    lines += ["", "| kind | op | runs | GFLOP | MB moved | predicted ms | bound | source op |",
              "|---|---|---|---|---|---|---|---|"]
    for kind in data["by_kind_ms"]:
        ops = [o for o in data["ops"] if o["kind"] == kind and not o.get("overlapped")][:top]
        for o in ops:
            src = o["source_op"].removeprefix("jit(train_step)/")
            lines.append(f"| {kind} | {o['name']} | {o['runs']} | {o['flops'] / 1e9:.1f} | "
                         f"{(o['bytes_read'] + o['bytes_written']) / 1e6:.0f} | "
                         f"{o['predicted_ms']:.3f} | {o['bound']} | {src[-70:]} |")
    lines += ["", "not seen by the model: " + "; ".join(CANNOT_SEE)]
    return "\n".join(lines)


def report_data(text: str, target: targets_lib.Target, seq_len: int | None,
                model_flops: float | None, source: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON report of an optimised HLO text on `target`'s chip."""
    from xlm_jax.accelerator.cost import chips as chips_lib
    from xlm_jax.accelerator.cost import model as model_lib

    chip = chips_lib.chip_for(target.chip)
    report = model_lib.analyze(text, chip, seq_len)
    report.model_flops = model_flops
    copies = report.overlapped
    return {
        "source": source, "target": target.name, "chip": chip.name,
        "predicted_step_ms": report.predicted_s * 1e3,
        "predicted_mfu": report.mfu(chip.bf16_flops),
        "roofline_step_ms": report.roofline_s * 1e3,
        "model_flops_per_device": model_flops,
        "by_kind_ms": {k: v * 1e3 for k, v in report.by_kind().items()},
        "overlapped_copies": {"ops": len(copies),
                              "bytes": sum(o.bytes_read + o.bytes_written for o in copies),
                              "alone_ms": sum(o.time_s for o in copies) * 1e3},
        "calibration": chip.efficiency.source,
        "chip_source": chip.source,
        "cannot_see": list(CANNOT_SEE),
        **extra,
        "ops": [o.as_json() for o in report.ops],
    }


def _compiled(args: argparse.Namespace, target: targets_lib.Target, mesh: Any
              ) -> tuple[str, float | None, dict[str, Any]] | str:
    """(optimised HLO, model FLOPs per device on non-pad tokens, report extras), or the one
    line saying why the run file does not compile."""
    from xlm_jax.accelerator import compile as tool
    from xlm_jax.accelerator.lower import LowerError
    from xlm_jax.train.cli import error_line

    try:
        rep = tool.compile_run(args.gin_file, args.gin_bindings, target, mesh,
                               args.batch_size, args.seq_len, args.remat, args.accum_steps,
                               args.size, args.depth, args.attention_backend,
                               collectives=False, keep_hlo=True)
    except (targets_lib.TargetError, LowerError) as e:
        raise FlagError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a run file that cannot be built: one line
        return (f"{', '.join(args.gin_file)} does not build for {target.name}: "
                f"{error_line(e).removeprefix('error: ')}")
    if "optimized_hlo" not in rep:
        why = rep.get("error") or rep.get("compiler_refused") or "no executable"
        return f"{', '.join(args.gin_file)} does not compile for {target.name}: {why}"
    rows = sum(int(b.split("x")[0]) * int(b.split("x")[1]) for b in rep["batches"].values())
    ours = rep["flops_per_device"]["ours"]
    # the benchmark's model FLOPs: per token, on the non-pad tokens of the synthetic batches
    flops = ours * rep["tokens_per_step"] / rows if rows and rep.get("tokens_per_step") else ours
    extra = {k: rep[k] for k in ("gin_files", "mesh", "batches", "model", "compile_seconds",
                                 "tokens_per_step", "memory_per_device_bytes") if k in rep}
    return rep["optimized_hlo"], flops, extra


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (see the module docstring)."""
    from xlm_jax.train.gin_utils import rewrite_gin_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(rewrite_gin_args(argv))
    try:
        if args.hlo:
            if not args.target:
                raise FlagError("--target is required, e.g. h100:1x1x1 (the chip of the dump)")
            target, mesh = targets_lib.parse_target(args.target), None
        else:
            target, mesh = _validate_compile(args)
        from xlm_jax.accelerator.cost import chips as chips_lib

        chips_lib.chip_for(target.chip)
        if args.top < 0:
            raise FlagError(f"--top {args.top}: must be >= 0")
    except (ValueError, KeyError) as e:  # FlagError, TargetError, an uncalibrated chip
        print(f"error: {str(e).strip(chr(39))}", file=sys.stderr)
        return 2
    if args.hlo:
        try:
            with open(args.hlo) as f:
                text = f.read()
            from xlm_jax.accelerator.cost import hlo as hlo_lib

            hlo_lib.parse_module(text)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"error: --hlo {args.hlo}: {e}", file=sys.stderr)
            return 2
        data = report_data(text, target, args.seq_len, args.model_flops, args.hlo, {})
    else:
        targets_lib.prepare_environment(target)  # before jax starts
        try:
            got = _compiled(args, target, mesh)
        except FlagError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if isinstance(got, str):
            print(f"error: {got}", file=sys.stderr)
            return 1
        text, flops, extra = got
        if args.dump_hlo:
            with open(args.dump_hlo, "w") as f:
                f.write(text)
        seq = args.seq_len or max(int(b.split("x")[1]) for b in extra["batches"].values())
        data = report_data(text, target, seq, flops, ", ".join(args.gin_file), extra)
    print(format_report(data, args.top))
    if args.json:
        write_json_atomic(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
