"""Throughput benchmarks; prints figures, asserts nothing.

  python -m xlm_jax.bench --gin_file=runs/xlmr_base_mmlm.gin --steps 5 [--batch_size 8]
      [--seq_len 128] [--no_torch] [--profile_dir DIR]
    Trains the configured model on TF-free synthetic batches (every objective's stream is
    replaced by synthetic data of its kind) and prints step time, tokens/s and MFU; in the same
    run, `transformers`' XLMRobertaForMaskedLM (PyTorch, fp32, AdamW) at the same shapes
    (skipped with a note when torch or transformers is not installed).
  python -m xlm_jax.bench --pipeline TASK [--batch_size 32 --sequence_length 128 --batches 50]
    The seqio pipeline's examples/s and tokens/s (needs the data extra, i.e. TensorFlow).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from xlm_jax.models.config import ModelConfig


@dataclasses.dataclass
class TorchResult:
    """transformers' step times (warm-up dropped) and where they were taken."""

    step_seconds: list[float]
    device: str  # "cuda" or "cpu"
    dtype: str  # "float32" or "bfloat16 autocast"
    peak_bytes: int | None  # CUDA peak allocation, None on CPU


def torch_step_seconds(cfg: ModelConfig, batch_size: int, seq_len: int, steps: int,
                       mask_prob: float = 0.15, bf16: bool = False) -> TorchResult:
    """Per-step wall times of a PyTorch XLM-R MLM training step (fwd + bwd + AdamW), on CUDA
    when PyTorch sees a GPU (SDPA attention; bf16 autocast when `bf16`), else on the CPU."""
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = bf16 and device == "cuda"
    hf_cfg = transformers.XLMRobertaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.mlp_dim,
        max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps)
    torch.manual_seed(0)
    model = transformers.XLMRobertaForMaskedLM(hf_cfg).train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(4, cfg.vocab_size - 1, (batch_size, seq_len))
    labels = torch.where(torch.rand(batch_size, seq_len) < mask_prob, ids, torch.tensor(-100))
    ids, labels = ids.to(device), labels.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps + 1):  # the first step is warm-up
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return TorchResult(times[1:], device, "bfloat16 autocast" if bf16 else "float32", peak)


def jax_peak_bytes() -> int | None:
    """Peak bytes allocated on device 0 (None where the backend keeps no statistics: CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


_OP_KINDS = (  # (kind, substrings of an XLA/GPU op name), first match wins
    ("attention (cuDNN)", ("cudnn", "fmha", "flash")),
    ("matmul", ("gemm", "cublas", "dot", "matmul", "convolution")),
    ("collective", ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute")),
    ("copy/transpose", ("copy", "transpose")),
    ("fusion", ("fusion",)),
)


def _op_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in _OP_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def summarize_profile(log_dir: str, steps: int, top: int = 12) -> str:
    """Device time per step by op kind and the `top` ops, from the newest xplane trace under
    `log_dir` (written by `loop.train(profile_steps=...)`). Hosts with no device plane (CPU)
    get a one-line note: XLA's CPU ops are not recorded as device events."""
    import collections
    import glob
    import os

    from jax.profiler import ProfileData

    files = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")),
                   key=os.path.getmtime)
    if not files:
        return f"no trace found under {log_dir}/plugins/profile"
    data = ProfileData.from_file(files[-1])
    per_op: collections.Counter[str] = collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = [ln for ln in plane.lines if ln.name == "XLA Ops"]
        for ln in lines:
            for ev in ln.events:
                per_op[ev.name] += ev.duration_ns
    if not per_op:
        return f"trace {files[-1]}: no device op events (host-only platform)"
    total = sum(per_op.values())
    kinds: collections.Counter[str] = collections.Counter()
    for name, ns in per_op.items():
        kinds[_op_kind(name)] += ns
    out = [f"profile ({files[-1]}), device op time per step {total / steps / 1e6:.1f} ms:"]
    out += [f"  {k:<20} {ns / steps / 1e6:9.2f} ms  {ns / total:6.1%}"
            for k, ns in kinds.most_common()]
    out.append(f"  top {top} ops:")
    out += [f"  {ns / steps / 1e6:9.2f} ms  {ns / total:6.1%}  {name[:90]}"
            for name, ns in per_op.most_common(top)]
    return "\n".join(out)


def run_training_bench(gin_files: Sequence[str], bindings: Sequence[str], steps: int,
                       batch_size: int | None, seq_len: int | None, with_torch: bool,
                       profile_dir: str | None = None) -> None:
    import jax

    from xlm_jax.models import attention
    from xlm_jax.train import flops as flops_lib
    from xlm_jax.train import gin_utils, loop, mixture

    extra = [f"loop.train.train_steps = {steps + 1}", "loop.train.save_checkpoints = False",
             "loop.train.force_synthetic = True",
             "loop.train.log_every = 1",  # the host waits for every step: per-step times
             "loop.train.eval_every = 0",
             # run files leave these to the user; the benchmark needs neither real data nor a
             # schedule length (an unused macro binding is harmless)
             "TRAIN_STEPS = 1000000", "MONO_TASK = 'synthetic:mono'",
             "PAIR_TASK = 'synthetic:pair'", "TASK_MODULES = []", "XLCO_TASK = 'synthetic:mixup'",
             "INIT_FROM = None"]
    if batch_size:
        extra.append(f"loop.train.batch_size = {batch_size}")
    if seq_len:
        extra.append(f"loop.train.seq_len = {seq_len}")
    if profile_dir:  # trace every timed step (step 0 compiles)
        extra += ["loop.train.profile_first_step = 1", f"loop.train.profile_steps = {steps}"]
    gin_utils.parse(gin_files, list(bindings) + extra)
    with tempfile.TemporaryDirectory() as tmp:
        result = loop.train(profile_dir or tmp, out=open("/dev/null", "w"))
    model_cfg, bs, sl = result.model, result.batch_size, result.seq_len
    step_s = statistics.median(result.step_seconds[1:])
    tok_s = result.tokens_per_step / step_s
    mfu = flops_lib.mfu(result.flops_per_token * tok_s)
    dev = jax.devices()[0]
    pad_note = (f" (table padded to {model_cfg.padded_vocab_size})"
                if model_cfg.padded_vocab_size != model_cfg.vocab_size else "")
    print(f"device: {jax.device_count()} x {dev.device_kind} ({dev.platform}); model: "
          f"{model_cfg.num_layers}L d={model_cfg.hidden_size} V={model_cfg.vocab_size}"
          f"{pad_note}; dtype {model_cfg.dtype}; attention {model_cfg.attention_backend}; "
          f"objectives/step: {', '.join(result.objectives)}; "
          f"global batch {bs} x {sl} per objective"
          + ("" if mixture.is_default(result.shapes, bs, sl)
             else f" ({mixture.describe(result.shapes)}; the step time is a median over "
                  "the phases)"))
    fallbacks = sorted(attention._LOGGED_FALLBACK_REASONS)  # noqa: SLF001 - reported, not changed
    if model_cfg.attention_backend == "cudnn" and fallbacks:
        print(f"note: cudnn attention fell back to xla ({'; '.join(fallbacks)})")
    print(f"xlm_jax  : step {step_s * 1000:9.1f} ms  tokens/s {tok_s:10.1f}  "
          f"model TFLOP/s {result.flops_per_token * tok_s / 1e12:7.3f}  "
          f"MFU {'n/a (no peak known for this device)' if mfu is None else f'{mfu:.1%}'}  "
          f"peak memory {_gib(jax_peak_bytes())}"
          f"  (median of {len(result.step_seconds) - 1} steps, compile excluded)")
    if profile_dir:
        print(summarize_profile(profile_dir, steps))
    missing = [m for m in ("torch", "transformers")
               if with_torch and importlib.util.find_spec(m) is None]
    if missing:  # accelerator hosts often have jax only: a note, not a crash
        print(f"torch/HF : skipped ({' and '.join(missing)} not installed; --no_torch "
              "silences this)")
    elif with_torch:
        # Same total tokens per step as our objectives' batches together.
        n_obj = len(result.objectives)
        tr = torch_step_seconds(model_cfg, bs * n_obj, sl, steps,
                                bf16=model_cfg.dtype == "bfloat16")
        t = statistics.median(tr.step_seconds)
        tokens = bs * n_obj * sl
        print(f"torch/HF : step {t * 1000:9.1f} ms  tokens/s {tokens / t:10.1f}  "
              f"peak memory {_gib(tr.peak_bytes)}  (XLMRobertaForMaskedLM on {tr.device}, "
              f"{tr.dtype}, full-vocab logits, batch {bs * n_obj} x {sl}, no padding, "
              f"median of {len(tr.step_seconds)} steps)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m xlm_jax.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", help="benchmark this seqio task's input pipeline instead")
    p.add_argument("--gin_file", action="append", default=[])
    p.add_argument("--gin_bindings", action="append", default=[])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--seq_len", type=int, default=None)
    p.add_argument("--no_torch", action="store_true",
                   help="skip the transformers comparison (skipped anyway, with a note, when "
                        "torch or transformers is not installed)")
    p.add_argument("--profile_dir", default=None,
                   help="trace the timed steps with jax.profiler into this directory (view with "
                        "TensorBoard's profile plugin) and print device time by op")
    args, rest = p.parse_known_args(argv)
    if args.pipeline:
        from xlm_jax.data.pipeline_bench import main as pipeline_main

        pipeline_main(["--pipeline", args.pipeline] + rest)  # prints its figures
        return 0
    from xlm_jax.train.gin_utils import rewrite_gin_args

    bindings = list(args.gin_bindings)
    for arg in rewrite_gin_args(rest):
        if arg.startswith("--gin_bindings="):
            bindings.append(arg.split("=", 1)[1])
        else:
            p.error(f"unrecognised argument {arg}")
    if not args.gin_file:
        p.error("--gin_file is required (or --pipeline TASK)")
    run_training_bench(args.gin_file, bindings, args.steps, args.batch_size, args.seq_len,
                       not args.no_torch, args.profile_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
