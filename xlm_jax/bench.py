"""Throughput benchmarks; prints figures, asserts nothing.

  python -m xlm_jax.bench --gin_file=runs/xlmr_base_mmlm.gin --steps 5 [--batch_size 8]
      [--seq_len 128] [--no_torch]
    Trains the configured model on TF-free synthetic batches (every objective's stream is
    replaced by synthetic data of its kind) and prints step time, tokens/s and MFU; in the same
    run, `transformers`' XLMRobertaForMaskedLM (PyTorch, fp32, AdamW) at the same shapes.
  python -m xlm_jax.bench --pipeline TASK [--batch_size 32 --sequence_length 128 --batches 50]
    The seqio pipeline's examples/s and tokens/s (needs the data extra, i.e. TensorFlow).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from xlm_jax.models.config import ModelConfig


def torch_step_seconds(cfg: ModelConfig, batch_size: int, seq_len: int, steps: int,
                       mask_prob: float = 0.15) -> list[float]:
    """Per-step wall times of a PyTorch XLM-R MLM training step (fwd + bwd + AdamW)."""
    import torch
    import transformers

    hf_cfg = transformers.XLMRobertaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.mlp_dim,
        max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps)
    torch.manual_seed(0)
    model = transformers.XLMRobertaForMaskedLM(hf_cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(4, cfg.vocab_size - 1, (batch_size, seq_len))
    labels = torch.where(torch.rand(batch_size, seq_len) < mask_prob, ids, torch.tensor(-100))
    times = []
    for _ in range(steps + 1):  # the first step is warm-up
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[1:]


def run_training_bench(gin_files: Sequence[str], bindings: Sequence[str], steps: int,
                       batch_size: int | None, seq_len: int | None, with_torch: bool) -> None:
    import jax

    from xlm_jax.train import flops as flops_lib
    from xlm_jax.train import gin_utils, loop

    extra = [f"loop.train.train_steps = {steps + 1}", "loop.train.save_checkpoints = False",
             "loop.train.force_synthetic = True", "loop.train.log_every = 1000000",
             "loop.train.eval_every = 0",
             # run files leave these to the user; the benchmark needs neither real data nor a
             # schedule length (an unused macro binding is harmless)
             "TRAIN_STEPS = 1000000", "MONO_TASK = 'synthetic:mono'",
             "PAIR_TASK = 'synthetic:pair'"]
    if batch_size:
        extra.append(f"loop.train.batch_size = {batch_size}")
    if seq_len:
        extra.append(f"loop.train.seq_len = {seq_len}")
    gin_utils.parse(gin_files, list(bindings) + extra)
    with tempfile.TemporaryDirectory() as tmp:
        result = loop.train(tmp, stream=open("/dev/null", "w"))
    model_cfg, bs, sl = result.model, result.batch_size, result.seq_len
    step_s = statistics.median(result.step_seconds[1:])
    tok_s = result.tokens_per_step / step_s
    mfu = flops_lib.mfu(result.flops_per_token * tok_s)
    dev = jax.devices()[0]
    pad_note = (f" (table padded to {model_cfg.padded_vocab_size})"
                if model_cfg.padded_vocab_size != model_cfg.vocab_size else "")
    print(f"device: {jax.device_count()} x {dev.device_kind} ({dev.platform}); model: "
          f"{model_cfg.num_layers}L d={model_cfg.hidden_size} V={model_cfg.vocab_size}"
          f"{pad_note}; "
          f"objectives/step: {', '.join(result.objectives)}; "
          f"global batch {bs} x {sl} per objective")
    print(f"xlm_jax  : step {step_s * 1000:9.1f} ms  tokens/s {tok_s:10.1f}  "
          f"model TFLOP/s {result.flops_per_token * tok_s / 1e12:7.3f}  "
          f"MFU {'n/a (no peak known for this device)' if mfu is None else f'{mfu:.1%}'}"
          f"  (median of {len(result.step_seconds) - 1} steps, compile excluded)")
    if with_torch:
        # Same total tokens per step as our objectives' batches together.
        n_obj = len(result.objectives)
        times = torch_step_seconds(model_cfg, bs * n_obj, sl, steps)
        t = statistics.median(times)
        tokens = bs * n_obj * sl
        print(f"torch/HF : step {t * 1000:9.1f} ms  tokens/s {tokens / t:10.1f}  "
              f"(XLMRobertaForMaskedLM fp32, full-vocab logits, batch {bs * n_obj} x {sl}, "
              f"no padding, median of {len(times)} steps)")


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
    p.add_argument("--no_torch", action="store_true", help="skip the transformers comparison")
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
                       not args.no_torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
