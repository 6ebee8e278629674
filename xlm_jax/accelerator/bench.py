"""Throughput benchmarks; prints figures, asserts nothing.

  python -m xlm_jax.accelerator.bench --gin_file=runs/xlmr_base_mmlm.gin --steps 5 [--batch_size 8]
      [--seq_len 128] [--no_torch] [--profile_dir DIR]
    Trains the configured model on TF-free synthetic batches (every objective's stream is
    replaced by synthetic data of its kind) and prints step time, tokens/s and MFU; in the same
    run, `transformers`' XLMRobertaForMaskedLM (PyTorch, fp32, AdamW) at the same shapes
    (skipped with a note when torch or transformers is not installed).
  python -m xlm_jax.accelerator.bench --table [--sizes base,large] [--steps 3] [--batch_size 8]
      [--seq_len 128] [--json OUT.json] [--markdown OUT.md]
    One row per objective present (MMLM, InfoXLM, XLM-E, ERNIE-M, VECO) and size, each its
    own process on the same shapes, plus transformers' step at those shapes; a markdown table
    on stdout (and files).
  python -m xlm_jax.accelerator.bench --pipeline TASK [--module M] [--batch_size 32
      --sequence_length 128 --batches 50] [--prepared DIR] [--num_processes P
      --process_index p] [--epoch] [--resume_at S1,S2]
    The seqio pipeline's examples/s, tokens/s and bytes read by this process, or a resume's
    cost (needs the data extra, i.e. TensorFlow; `python -m xlm_jax.data.pipeline_bench
    --help` lists the flags).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help
# re-exported: the summary --profile_dir prints (its own module, with a CLI of its own)
from xlm_jax.accelerator.profile_summary import summarize_profile  # noqa: F401
from xlm_jax.models.config import ModelConfig


@dataclasses.dataclass
class TorchResult:
    """transformers' step times (warm-up dropped) and where they were taken."""

    step_seconds: list[float]
    device: str  # "cuda" or "cpu"
    dtype: str  # "float32" or "bfloat16 autocast"
    peak_bytes: int | None  # CUDA peak allocation, None on CPU
    tokens: int  # non-pad tokens per step

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / statistics.median(self.step_seconds)


def torch_step_seconds(cfg: ModelConfig, batch_size: int, seq_len: int, steps: int,
                       mask_prob: float = 0.15, bf16: bool = False) -> TorchResult:
    """Per-step wall times of a PyTorch XLM-R MLM training step (fwd + bwd + AdamW), on CUDA
    when PyTorch sees a GPU (SDPA attention; bf16 autocast when `bf16`), else on the CPU.

    The rows are our synthetic monolingual rows at the same shapes (same padding distribution,
    `attention_mask` = non-pad), so both sides count the same kind of non-pad tokens."""
    import numpy as np
    import torch
    import transformers

    from xlm_jax.data.synthetic import synthetic_batch

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
    rows = synthetic_batch(batch_size, seq_len, cfg.vocab_size, "mono", seed=0)["input_ids"]
    valid = rows != cfg.pad_id
    rng = np.random.default_rng(0)
    picked = valid & (rng.random(rows.shape) < mask_prob)
    ids = torch.from_numpy(rows.astype(np.int64))
    attention_mask = torch.from_numpy(valid.astype(np.int64))
    labels = torch.where(torch.from_numpy(picked), ids, torch.tensor(-100))
    ids, attention_mask, labels = ids.to(device), attention_mask.to(device), labels.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps + 1):  # the first step is warm-up
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return TorchResult(times[1:], device, "bfloat16 autocast" if bf16 else "float32", peak,
                       int(valid.sum()))


def jax_peak_bytes() -> int | None:
    """Peak bytes allocated on device 0 (None where the backend keeps no statistics: CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


class WaitAfter:
    """A loop action that waits for the device once, after step `step` (the compiling
    steps), so that the timed steps start on an idle device."""

    def __init__(self, step: int):
        self.step = step

    def before(self, step: int) -> None:
        del step

    def due(self, end: Any) -> bool:
        del end
        return False

    def __call__(self, end: Any, state: Any) -> None:
        if end.step == self.step:
            import jax

            jax.block_until_ready(state)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class BenchResult:
    """One benchmark run's figures (what `--json` writes and `--table` collects)."""

    gin_files: list[str]
    device: str
    model: str  # "12L d=768 V=250002"
    dtype: str
    objectives: list[str]
    batch_size: int
    seq_len: int
    tokens_per_step: float  # non-pad tokens, all objectives
    step_ms: float  # mean over the timed steps, dispatched ahead; compile excluded
    tokens_per_second: float
    model_tflops: float  # model TFLOP/s (train/step_flops.py's count)
    mfu: float | None
    peak_bytes: int | None
    torch_step_ms: float | None = None
    torch_tokens_per_second: float | None = None
    torch_note: str = ""
    compile_s: float | None = None  # trace + lower + compile of the first step
    compile_xla_s: float | None = None  # XLA's part of it (the executable's read on a hit)
    cache_hit: bool | None = None  # its executable came from the persistent compilation cache
    compilation_cache_dir: str | None = None  # the persistent cache in force (None: none)


def prediction_slots(rate: float, seq_len: int) -> int:
    """MLM prediction slots per row for masking `rate` at length `seq_len`: the run files'
    rule, floor(rate x seq_len) + 1 rounded up to a multiple of 8 (80 for 0.15 x 512)."""
    return -(-(int(rate * seq_len) + 1) // 8) * 8


def run_training_bench(gin_files: Sequence[str], bindings: Sequence[str], steps: int,
                       batch_size: int | None, seq_len: int | None, with_torch: bool,
                       profile_dir: str | None = None,
                       compilation_cache_dir: str | None = "auto") -> BenchResult:
    """Trains `steps` + 1 steps (the first compiles) on synthetic batches, prints the figures
    and returns them. `compilation_cache_dir` binds `loop.train.compilation_cache_dir`
    ('auto', a directory, or '' for none): a second run with the same cache loads the step's
    executable instead of compiling it (the `compile` line says which)."""
    import gin
    import jax

    from xlm_jax.models import attention_backends
    from xlm_jax.train import step_flops as flops_lib
    from xlm_jax.train import gin_utils, loop, mixture

    extra = ["loop.train.save_checkpoints = False",
             "loop.train.force_synthetic = True",
             "loop.train.evaluators = []", *gin_utils.SYNTHETIC_RUN_MACROS,
             f"loop.train.compilation_cache_dir = {compilation_cache_dir!r}"]
    if batch_size:
        extra.append(f"loop.train.batch_size = {batch_size}")
    if seq_len:
        # The run files size the prediction slots for their SEQ_LEN (80 for 512); at another
        # length the slots follow the run files' own rule, floor(rate x T) + 1 rounded up to a
        # multiple of 8, else the vocabulary projection runs at 4x the slots at T=128.
        extra += [f"loop.train.seq_len = {seq_len}",
                  f"MAX_PREDICTIONS = {prediction_slots(0.15, seq_len)}",
                  f"MAX_PREDICTIONS_MONO = {prediction_slots(0.15, seq_len)}",
                  f"MAX_PREDICTIONS_BI = {prediction_slots(0.25, seq_len)}"]
    if batch_size or seq_len:  # VECO's bilingual stream follows loop.train's shapes
        extra += ["BI_BATCH_SIZE = None", "BI_SEQ_LEN = None"]
    gin_utils.parse(gin_files, list(bindings) + extra, placeholders=extra)  # may go unused
    # A mixture of phases (VECO alternates two) compiles once per phase: the first `cycle`
    # steps compile, then whole cycles are timed.
    cycle = mixture.cycle_length(
        mixture.resolve(gin.get_bindings("loop.train").get("objectives", {}), 1, 1))
    timed = -(-steps // cycle) * cycle
    gin.bind_parameter("loop.train.train_steps", cycle + timed)
    # The timed steps are dispatched as a run dispatches them (the host reads the device only
    # at the last, as with log_every: a run's host runs ahead), after one wait for the
    # compiling steps; the step time is their wall time over their count. Waiting for every
    # step would add the host's dispatch to each (18 ms of a 135 ms base step on an H100).
    gin.bind_parameter("loop.train.log_every", cycle + timed)
    gin.bind_parameter("loop.train.actions", [WaitAfter(cycle)])
    if profile_dir:  # trace every timed step
        gin.bind_parameter("loop.train.profile_first_step", cycle)
        gin.bind_parameter("loop.train.profile_steps", timed)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            result = loop.train(profile_dir or tmp)
    model_cfg, bs, sl = result.model, result.batch_size, result.seq_len
    times = result.step_seconds[cycle:]
    step_s = sum(times) / len(times)
    tok_s = result.tokens_per_step / step_s
    mfu = flops_lib.mfu(result.flops_per_token * tok_s)
    dev = jax.devices()[0]
    pad_note = (f" (table padded to {model_cfg.padded_vocab_size})"
                if model_cfg.padded_vocab_size != model_cfg.vocab_size else "")
    model = f"{model_cfg.num_layers}L d={model_cfg.hidden_size} V={model_cfg.vocab_size}"
    print(f"device: {jax.device_count()} x {dev.device_kind} ({dev.platform}); model: "
          f"{model}{pad_note}; dtype {model_cfg.dtype}; attention {model_cfg.attention_backend}; "
          f"objectives/step: {', '.join(result.objectives)}; "
          f"global batch {bs} x {sl} per objective"
          + ("" if mixture.is_default(result.shapes, bs, sl)
             else f" ({mixture.describe(result.shapes)}; the step time is a mean over "
                  "a cycle of the phases)"))
    if dev.platform == "cpu" and model_cfg.dtype != "float32":
        print(f"note: {model_cfg.dtype} on a CPU is slower than float32 and transformers runs "
              "float32 here; --gin.loop.model_config.dtype=\"'float32'\" compares like with like")
    for note in attention_backends.logged():  # what attention_backend='auto' chose, etc.
        print(f"note: {note}")
    bench = BenchResult(
        gin_files=list(gin_files), device=f"{jax.device_count()} x {dev.device_kind}",
        model=model, dtype=model_cfg.dtype, objectives=list(result.objectives), batch_size=bs,
        seq_len=sl, tokens_per_step=result.tokens_per_step, step_ms=step_s * 1000,
        tokens_per_second=tok_s, model_tflops=result.flops_per_token * tok_s / 1e12, mfu=mfu,
        peak_bytes=jax_peak_bytes())
    compiled = result.step_compile
    if compiled is not None:
        bench.compile_s, bench.compile_xla_s = compiled.seconds, compiled.backend_seconds
        bench.cache_hit = compiled.cache_hit
        bench.compilation_cache_dir = compiled.cache_dir
    print(f"xlm_jax  : step {bench.step_ms:9.1f} ms  tokens/s {tok_s:10.1f}  "
          f"model TFLOP/s {bench.model_tflops:7.3f}  "
          f"MFU {'n/a (no peak known for this device)' if mfu is None else f'{mfu:.1%}'}  "
          f"peak memory {_gib(bench.peak_bytes)}"
          f"  (mean of {len(times)} steps dispatched ahead"
          f"{'' if cycle == 1 else f' ({len(times) // cycle} cycles of {cycle} phases)'}, "
          "compile excluded)")
    if compiled is not None:
        print(f"compile  : {compiled.timing()}  {compiled.describe()} (the first step"
              f"{'' if cycle == 1 else ', first phase'}; cache {compiled.cache_dir or 'off'})")
    if profile_dir:
        # raises (exit 1, one line) when there is no trace or it holds no op events: the
        # figures above are printed, nothing after them runs and --json is not written
        print(summarize_profile(profile_dir, timed))
    missing = [m for m in ("torch", "transformers")
               if with_torch and importlib.util.find_spec(m) is None]
    if missing:  # accelerator hosts often have jax only: a note, not a crash
        bench.torch_note = f"skipped ({' and '.join(missing)} not installed)"
        print(f"torch/HF : {bench.torch_note}; --no_torch silences this")
    elif with_torch:
        # Same total rows per step as our objectives' batches together.
        rows = bs * len(result.objectives)
        tr = torch_step_seconds(model_cfg, rows, sl, steps, bf16=model_cfg.dtype == "bfloat16")
        bench.torch_step_ms = statistics.median(tr.step_seconds) * 1000
        bench.torch_tokens_per_second = tr.tokens_per_second
        bench.torch_note = (f"XLMRobertaForMaskedLM on {tr.device}, {tr.dtype}, full-vocab "
                            f"logits, batch {rows} x {sl}")
        print(f"torch/HF : step {bench.torch_step_ms:9.1f} ms  tokens/s "
              f"{tr.tokens_per_second:10.1f}  peak memory {_gib(tr.peak_bytes)}  "
              f"({bench.torch_note}, the same synthetic rows and padding, median of "
              f"{len(tr.step_seconds)} steps)")
        print(f"ratio    : xlm_jax / transformers tokens/s = "
              f"{tok_s / tr.tokens_per_second:.2f}")
    return bench


# The --table rows: (label, {size: gin files}). One per objective the library has.
TABLE_RUNS: tuple[tuple[str, dict[str, list[str]]], ...] = (
    ("MMLM (XLM-R)", {"base": ["runs/xlmr_base_mmlm.gin"],
                      "large": ["runs/xlmr_base_mmlm.gin", "models/large.gin"]}),
    ("InfoXLM (MMLM + TLM + XLCo)", {"base": ["runs/infoxlm_base.gin"],
                                     "large": ["runs/infoxlm_large.gin"]}),
    ("XLM-E (MRTD + TRTD)", {"base": ["runs/xlme_base.gin"], "large": ["runs/xlme_large.gin"]}),
    ("ERNIE-M (CAMLM + BTMLM)", {"base": ["runs/ernie_m_base.gin"],
                                 "large": ["runs/ernie_m_large.gin"]}),
    ("VECO (IS/CS-MLM + TLM)", {"base": ["runs/veco_large.gin", "models/base.gin"],
                                "large": ["runs/veco_large.gin"]}),
)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def table_markdown(rows: Sequence[tuple[str, str, BenchResult | str]]) -> str:
    """The --table markdown: one line per (label, size, result or the reason it failed)."""
    head = ("| objective | size | objectives/step | tokens/step | step (ms) | tokens/s | "
            "model TFLOP/s | MFU | peak memory | transformers tokens/s (ratio) |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for label, size, r in rows:
        if isinstance(r, str):
            lines.append(f"| {label} | {size} | failed: {r} |" + " |" * 7)
            continue
        torch = ("—" if r.torch_tokens_per_second is None else
                 f"{r.torch_tokens_per_second:.1f} ({r.tokens_per_second / r.torch_tokens_per_second:.2f}x)")
        lines.append(
            f"| {label} | {size} | {', '.join(r.objectives)} | {r.tokens_per_step:.0f} | "
            f"{r.step_ms:.1f} | {r.tokens_per_second:.1f} | {r.model_tflops:.3f} | "
            f"{_fmt(None if r.mfu is None else 100 * r.mfu, '.1f')}{'' if r.mfu is None else '%'}"
            f" | {_gib(r.peak_bytes)} | {torch} |")
    return "\n".join(lines)


def run_table(sizes: Sequence[str], steps: int, batch_size: int | None, seq_len: int | None,
              with_torch: bool, bindings: Sequence[str], json_out: str | None,
              markdown_out: str | None,
              runs: Sequence[tuple[str, dict[str, list[str]]]] = TABLE_RUNS,
              compilation_cache_dir: str | None = "auto") -> int:
    """Runs every row of `runs` (default TABLE_RUNS) at each of `sizes` in its own process
    (fresh gin and memory), the transformers comparison in each size's first (MMLM) row;
    prints and writes the table. Returns 1 when a row failed (its reason is in the table)."""
    import json
    import os
    import subprocess

    rows: list[tuple[str, str, BenchResult | str]] = []
    for size in sizes:
        for i, (label, files) in enumerate(runs):
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "row.json")
                cmd = [sys.executable, "-m", "xlm_jax.accelerator.bench", "--steps", str(steps),
                       "--json", out] + [f"--gin_file={f}" for f in files[size]]
                cmd += [f"--gin_bindings={b}" for b in bindings]
                if batch_size:
                    cmd += ["--batch_size", str(batch_size)]
                if seq_len:
                    cmd += ["--seq_len", str(seq_len)]
                if not (with_torch and i == 0):
                    cmd.append("--no_torch")
                cmd.append(f"--compilation_cache_dir={compilation_cache_dir or ''}")
                print(f"[{label}, {size}] {' '.join(cmd[1:])}", flush=True)
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode:
                    # the exception's own line, not gin's "In call to configurable" context
                    errors = [ln for ln in proc.stderr.splitlines() if ln and not ln[0].isspace()]
                    last = (errors or ["no output"])[-1]
                    rows.append((label, size, f"exit {proc.returncode}: {last[:200]}"))
                    print(f"  failed: {last}", flush=True)
                    continue
                print(proc.stdout.rstrip(), flush=True)
                with open(out) as f:
                    rows.append((label, size, BenchResult(**json.load(f))))
    md = table_markdown(rows)
    print(md)
    if markdown_out:
        with open(markdown_out, "w") as f:
            f.write(md + "\n")
    if json_out:
        with open(json_out, "w") as f:
            json.dump([{"objective": label, "size": size,
                        **(dataclasses.asdict(r) if isinstance(r, BenchResult) else
                           {"error": r})} for label, size, r in rows], f, indent=1)
    return 1 if any(isinstance(r, str) for _, _, r in rows) else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from xlm_jax.train import cli

    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.bench", description=__doc__,
                        formatter_class=cli.HelpFormatter)
    p.add_argument("--pipeline", default=None,
                   help="benchmark this seqio task's input pipeline instead (with --batch_size "
                        "and the flags below; `python -m xlm_jax.data.pipeline_bench --help` "
                        "lists the rest)")
    # --pipeline's own flags, passed on to pipeline_bench (None: its default, shown).
    p.add_argument("--module", default=None,
                   help="--pipeline: the module that registers the task (default "
                        "xlm_jax_tasks.demo, the demo data)")
    p.add_argument("--sequence_length", type=int, default=None,
                   help="--pipeline: row length (default 128)")
    p.add_argument("--batches", type=int, default=None,
                   help="--pipeline: timed batches (default 50)")
    p.add_argument("--table", action="store_true",
                   help="every objective x --sizes, each in its own process; a markdown table")
    p.add_argument("--sizes", default="base,large", help="--table: comma-separated sizes")
    p.add_argument("--markdown", default=None, help="--table: also write the markdown here")
    p.add_argument("--json", default=None, help="write the figures as JSON to this file")
    p.add_argument("--gin_file", action="append", default=[],
                   help="run file (repeatable); --gin.NAME=VALUE binds")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="extra gin binding (repeatable)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (after the compiling ones)")
    p.add_argument("--batch_size", type=int, default=None,
                   help="global rows per objective (None: the run file's)")
    p.add_argument("--seq_len", type=int, default=None, help="row length (None: the run file's)")
    p.add_argument("--no_torch", action="store_true",
                   help="skip the transformers comparison (skipped anyway, with a note, when "
                        "torch or transformers is not installed)")
    p.add_argument("--profile_dir", default=None,
                   help="trace the timed steps with jax.profiler into this directory (view with "
                        "TensorBoard's profile plugin) and print the time per step by op kind "
                        "(exit 1 when the trace holds no op events)")
    p.add_argument("--compilation_cache_dir", default="auto",
                   help="jax's persistent compilation cache (loop.train.compilation_cache_dir): "
                        "'auto' (JAX_COMPILATION_CACHE_DIR when set, else the user's cache "
                        "directory on a GPU/TPU, none on a CPU), a directory (local or gs://), "
                        "or '' for none")
    args, rest = p.parse_known_args(argv)
    for flag in ("steps", "batch_size", "seq_len", "sequence_length", "batches"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag} {value}: must be >= 1")
    pipeline_only = [f"--{f}" for f in ("module", "sequence_length", "batches")
                     if getattr(args, f) is not None]
    if pipeline_only and not args.pipeline:
        p.error(f"{pipeline_only[0]} is a --pipeline flag")
    if args.pipeline:
        from xlm_jax.data.pipeline_bench import main as pipeline_main

        sized = ["--batch_size", str(args.batch_size)] if args.batch_size else []
        sized += ["--json", args.json] if args.json else []
        for flag in ("module", "sequence_length", "batches"):
            if getattr(args, flag) is not None:
                sized += [f"--{flag}", str(getattr(args, flag))]
        pipeline_main(["--pipeline", args.pipeline] + sized + rest)  # prints its figures
        return 0
    from xlm_jax.train.gin_utils import rewrite_gin_args

    bindings = list(args.gin_bindings)
    for arg in rewrite_gin_args(rest):
        if arg.startswith("--gin_bindings="):
            bindings.append(arg.split("=", 1)[1])
        else:
            p.error(f"unrecognised argument {arg}")
    if args.table:
        if args.gin_file:
            p.error("--table runs its own run files; drop --gin_file")
        sizes = [s for s in args.sizes.split(",") if s]
        bad = [s for s in sizes if s not in TABLE_RUNS[0][1]]
        if bad:
            p.error(f"--sizes {','.join(bad)}: the table has {', '.join(TABLE_RUNS[0][1])}")
        return run_table(sizes, args.steps, args.batch_size, args.seq_len, not args.no_torch,
                         bindings, args.json, args.markdown,
                         compilation_cache_dir=args.compilation_cache_dir)
    if not args.gin_file:
        p.error("--gin_file is required (or --table, or --pipeline TASK)")
    from xlm_jax.train import cli

    results: list[BenchResult] = []

    def run() -> int:
        results.append(run_training_bench(args.gin_file, bindings, args.steps,
                                          args.batch_size, args.seq_len, not args.no_torch,
                                          args.profile_dir, args.compilation_cache_dir))
        return 0

    if cli.run_reporting(run):
        return 1
    result = results[0]
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(dataclasses.asdict(result), f, indent=1)
    return 0


if __name__ == "__main__":
    cli_help.exit_with(main)
