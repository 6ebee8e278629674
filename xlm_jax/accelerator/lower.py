"""Lower the trainer's sharded train step for a GPU or TPU from a CPU, and say what it holds.

  python -m xlm_jax.accelerator.lower --gin_file=runs/xlme_base.gin --platform cuda \\
      --mesh data=2,tensor=2 --batch_size 8 --seq_len 512 --attention_backend pallas \\
      [--size tiny] [--dump step.mlir] [--gin.NAME=VALUE ...]

It builds exactly what `loop.train` compiles (the same functions, through `pod_memory.build`:
mesh, objectives, rules, optimiser, abstract state, the jitted step with donated state) on
fake CPU devices, traces it with the attention kernels of the target platform
(`attention.lowering_for`) and lowers it with ``lowering_platforms=(platform,)``. That runs
the real Pallas -> Triton (GPU) or Mosaic (TPU) kernel lowering and the real SPMD sharding
annotations; nothing is compiled or run, so no accelerator and no data are needed.

Printed (JSON): the custom calls by name; each fused-attention call (Triton, cuDNN, Mosaic
TPU) with its operand shapes, which are per-device shards when the kernels run under
shard_map; how many tensor types have two trailing-ish dimensions equal to a sequence length
(``[..., T, T]``: attention-sized arrays, counted apart for float ones — logits,
probabilities, biases — and integer/bool ones — masks); what ``attention_backend='auto'``
chose. A backend that cannot serve a call raises before anything is lowered (there is no
silent fallback: ``attention_backends``), and so does a mesh that does not divide the batch
or the heads.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help

PLATFORMS = ("cuda", "tpu")
BACKENDS = ("xla", "cudnn", "pallas", "auto")
# The custom-call targets of the fused attention kernels in StableHLO text.
FUSED_TARGETS = {"triton": "__gpu$xla.gpu.triton", "cudnn": "__cudnn$fmha",
                 "mosaic_tpu": "tpu_custom_call", "mosaic_gpu": "mosaic_gpu"}
_CALL = re.compile(r"custom_call @([\w$.\-]+)\(")
_TENSOR = re.compile(r"tensor<([^>]*)>")


class LowerError(ValueError):
    """A one-line user error of this CLI (flag and value named)."""


def custom_calls(text: str) -> dict[str, int]:
    """Custom-call targets of StableHLO text and how often each appears."""
    return dict(collections.Counter(_CALL.findall(text)))


def fused_calls(text: str) -> list[dict[str, Any]]:
    """Each fused-attention custom call: its kind and operand tensor types."""
    out = []
    for line in text.splitlines():
        found = _CALL.search(line)
        if not found:
            continue
        kind = next((k for k, t in FUSED_TARGETS.items() if found[1].startswith(t)), None)
        if kind is None or " : (" not in line:
            continue
        operands = line.rsplit(" : (", 1)[1].split(") -> ")[0]
        out.append({"kind": kind, "target": found[1], "operands": _TENSOR.findall(operands)})
    return out


def square_tensors(text: str, lengths: Sequence[int]) -> dict[str, int]:
    """Tensor types with two adjacent dimensions equal to one of `lengths` (``[.., T, T, ..]``)
    and how often each occurs in the text."""
    found: collections.Counter[str] = collections.Counter()
    for ty in _TENSOR.findall(text):
        dims = ty.split("x")[:-1]
        if any(f"{t}" == a == b for t in lengths for a, b in zip(dims, dims[1:])):
            found[ty] += 1
    return dict(found)


def check_mesh(mesh: dict[str, int], built_batch: dict[str, int], heads: int) -> None:
    """A one-line LowerError where the mesh's batch axes do not divide an objective's batch
    or its tensor axis the heads (jax would fail deep inside the partitioner)."""
    batch_ways = mesh["data"] * mesh["fsdp"]
    for name, rows in built_batch.items():
        if rows % batch_ways:
            raise LowerError(f"--mesh data={mesh['data']},fsdp={mesh['fsdp']}: {batch_ways} "
                             f"batch shards do not divide objective {name}'s batch of {rows}")
    if heads % mesh["tensor"]:
        raise LowerError(f"--mesh tensor={mesh['tensor']} does not divide the model's "
                         f"{heads} heads")


def configure(gin_files: Sequence[str], bindings: Sequence[str], size: str | None = None,
              attention_backend: str | None = None, attention_dropout: float | None = None,
              width: int | None = None, depth: int | None = None,
              remat: str | None = None) -> None:
    """Parses the run files for a synthetic step (`gin_utils.SYNTHETIC_RUN_MACROS`: no corpus
    needed) and merges the given model overrides into `loop.model_config.overrides` (the run
    file's own overrides are kept). Shared by `lower` and `xlm_jax.accelerator.compile`."""
    import gin

    from xlm_jax.train import gin_utils

    extra = list(gin_utils.SYNTHETIC_RUN_MACROS)
    if size:
        extra.append(f"loop.model_config.size = {size!r}")
    gin_utils.parse(gin_files, extra + list(bindings))
    try:
        overrides = dict(gin.query_parameter("loop.model_config.overrides") or {})
    except ValueError:  # the run file binds none
        overrides = {}
    if attention_dropout is not None:
        overrides["attention_dropout_rate"] = attention_dropout
    if width:  # reduced width, same depth: heads of 32 dims, MLP 4x (our choice)
        overrides.update(hidden_size=width, num_heads=width // 32, mlp_dim=4 * width)
    if depth:  # fewer layers of the same kind: every layer lowers alike (our choice)
        overrides["num_layers"] = depth
    with gin.unlock_config():
        if attention_dropout is not None or width or depth:
            gin.bind_parameter("loop.model_config.overrides", overrides)
        if attention_backend:  # its own binding: it wins over a run file's `overrides`
            gin.bind_parameter("loop.model_config.attention_backend", attention_backend)
        if remat:
            gin.bind_parameter("loop.model_config.remat", remat)


def lower(gin_files: Sequence[str], bindings: Sequence[str], platform: str,
          mesh: dict[str, int], batch_size: int | None, seq_len: int | None,
          attention_backend: str | None, size: str | None,
          attention_dropout: float | None = None, width: int | None = None,
          depth: int | None = None) -> tuple[dict[str, Any], str]:
    """Lowers the configured step for `platform`; returns (summary, StableHLO text).
    jax must already have `prod(mesh)` CPU devices."""
    from xlm_jax.accelerator import pod_memory
    from xlm_jax.models import attention_backends
    from xlm_jax.train import mixture, partitioning

    configure(gin_files, bindings, size, attention_backend, attention_dropout, width, depth)
    kw = pod_memory.train_bindings()
    model = kw["model"]
    shapes = mixture.resolve(kw["objectives"], batch_size or kw["batch_size"],
                             seq_len or kw["seq_len"])
    check_mesh(mesh, {n: s.batch_size for n, s in shapes.items()}, model.num_heads)
    with attention_backends.lowering_for(platform):  # and a GPU's assumed answers
        built = pod_memory.build(mesh, batch_size, seq_len)
        with partitioning.activate(built.mesh, built.rules):
            lowered = built.step_fn.trace(*built.args).lower(lowering_platforms=(platform,))
    text = lowered.as_text()
    lengths = sorted({s.seq_len for s in built.shapes.values()})
    padded = sorted({128 * math.ceil(t / 128) for t in lengths} - set(lengths))
    summary = {
        "platform": platform, "mesh": dict(built.mesh.shape),
        "attention_backend": model.attention_backend,
        "model": f"{model.num_layers}L d={model.hidden_size} heads={model.num_heads}",
        "batches": {n: f"{s.batch_size}x{s.seq_len}" for n, s in built.shapes.items()},
        "custom_calls": custom_calls(text),
        "fused_attention_calls": fused_calls(text),
        "square_tensors": square_tensors(text, lengths + padded),
        "auto_choices": attention_backends.logged(),
    }
    if "cudnn" in model.attention_backend or "auto" in model.attention_backend:
        summary["assumed_cudnn_version"] = attention_backends.ASSUMED_CUDNN_VERSION
    squares = summary["square_tensors"]
    summary["square_tensor_count"] = {
        "float": sum(n for ty, n in squares.items() if ty.split("x")[-1][0] in "fb"),
        "int_or_bool": sum(n for ty, n in squares.items() if ty.split("x")[-1][0] in "iu"),
    }
    return summary, text


def _parser() -> argparse.ArgumentParser:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.lower", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[],
                   help="run file(s), e.g. runs/xlme_base.gin (required)")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="gin bindings (also --gin.NAME=VALUE)")
    p.add_argument("--platform", default=None,
                   help=f"target platform: {' or '.join(PLATFORMS)} (required)")
    p.add_argument("--mesh", default="data=2,tensor=2",
                   help="AXIS=SIZE,... over data, fsdp, tensor; axes left out are 1 "
                   "(default: %(default)s)")
    p.add_argument("--batch_size", type=int, default=None,
                   help="global rows per objective (default: the run file's)")
    p.add_argument("--seq_len", type=int, default=None,
                   help="tokens per row (default: the run file's)")
    p.add_argument("--attention_backend", default=None,
                   help=f"override the run file's: {', '.join(BACKENDS)} (default: keep)")
    p.add_argument("--attention_dropout", type=float, default=None,
                   help="override the run file's attention dropout rate (cuDNN runs without "
                   "it; default: keep)")
    p.add_argument("--size", default=None, help="model size override, e.g. tiny "
                   "(loop.model_config.size; default: the run file's)")
    p.add_argument("--width", type=int, default=None,
                   help="reduced width at the run file's depth: hidden WIDTH, WIDTH/32 heads, "
                   "MLP 4*WIDTH (a multiple of 32; default: the run file's)")
    p.add_argument("--depth", type=int, default=None,
                   help="reduced depth: DEPTH layers of the run file's kind (a quick check; "
                   "every layer lowers alike; default: the run file's)")
    p.add_argument("--dump", default=None, help="write the lowered StableHLO text here")
    return p


def _validate(args: argparse.Namespace) -> dict[str, int]:
    if not args.gin_file:
        raise LowerError("--gin_file is required (a run file, e.g. runs/xlme_base.gin)")
    if args.platform not in PLATFORMS:
        raise LowerError(f"--platform {args.platform!r}: expected one of {', '.join(PLATFORMS)}")
    if args.attention_backend is not None and args.attention_backend not in BACKENDS:
        raise LowerError(f"--attention_backend {args.attention_backend!r}: expected one of "
                         f"{', '.join(BACKENDS)}")
    if args.width is not None and (args.width <= 0 or args.width % 32):
        raise LowerError(f"--width {args.width}: must be a positive multiple of 32")
    if args.depth is not None and args.depth <= 0:
        raise LowerError(f"--depth {args.depth}: must be positive")
    for flag in ("batch_size", "seq_len"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise LowerError(f"--{flag} {value}: must be positive")
    from xlm_jax.accelerator import pod_memory

    try:
        mesh = pod_memory.parse_mesh(args.mesh)
    except ValueError as e:
        raise LowerError(str(e)) from None
    if any(v < 1 for v in mesh.values()):
        raise LowerError(f"--mesh {args.mesh!r}: every axis size must be >= 1")
    return mesh


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (2: a bad flag or a step that cannot lower)."""
    from xlm_jax.train.gin_utils import rewrite_gin_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(rewrite_gin_args(argv))
    try:
        mesh = _validate(args)
    except LowerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from xlm_jax.accelerator import pod_memory

    pod_memory._setup_devices(math.prod(mesh.values()))  # noqa: SLF001 - same set-up
    import jax

    if jax.device_count() != math.prod(mesh.values()):
        print(f"error: jax has {jax.device_count()} devices, --mesh {args.mesh} needs "
              f"{math.prod(mesh.values())}; run as a fresh process", file=sys.stderr)
        return 2
    try:
        summary, text = lower(args.gin_file, args.gin_bindings, args.platform, mesh,
                              args.batch_size, args.seq_len, args.attention_backend, args.size,
                              args.attention_dropout, args.width, args.depth)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line naming the run
        from xlm_jax.train.cli import error_line  # the gin CLIs' one line (no call sites)

        print(f"error: {', '.join(args.gin_file)} does not lower for {args.platform}: "
              f"{error_line(e).removeprefix('error: ')}", file=sys.stderr)
        return 2
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(text)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
