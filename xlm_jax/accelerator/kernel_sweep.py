"""Each flash-attention kernel timed alone over launch settings: tiles, warps, stages.

  python -m xlm_jax.accelerator.kernel_sweep [--shape 32,512,12,64] [--dtype bfloat16]
      [--dropout 0.1] [--bias none,gated] [--launches 64x64w4s3,128x64w4s3,...]
      [--budget_s 150] [--iters 10] [--json OUT]

Why: a base step's attention kernels ran at very different rates on an H200 (the MMLM step's
forward kernel at 7.6% of the chip's peak, its dk/dv and dq kernels at about 20%; XLM-E's
gated-bias kernels slower still), and their one launch setting was chosen by timing forward
and backward together. This times the three kernels (`fused_attention.KERNELS`: forward, dk/dv,
dq) apart, each with every launch in `--launches` (default `gpu_launches()`, in the order we
expect them to win, so a budget that runs out leaves the likely ones measured), on the shapes
of a base run file: a key-padding mask as the model passes it (`TokenMask.padding`; a quarter
of the rows end in padding), attention
dropout, and for `gated` XLM-E's relative bias (32 buckets, distance 128, a per-query gate).

Every launch's outputs are compared with the default launch's (`fused_attention.GPU_LAUNCH`;
interpreted on a CPU, where times say nothing about a GPU): a launch whose largest error,
relative to the largest output, exceeds the dtype's tolerance is "wrong" and never "best".
Then, budget allowing, forward + backward of the whole call with each bias's best launches
against the default (`combined`). Prints a markdown table as it goes and the launch text to
set (`ModelConfig.attention_launch`); `--json` is rewritten after every row (`complete` false
until the end). A launch the compiler refuses (Triton's shared memory, say) is a "failed" row,
not a failure of the sweep. Exit status: 0 when no launch was wrong and, if any row ran, one
was ok; 1 otherwise; 2 on a bad flag.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from xlm_jax import cli_help
from xlm_jax.models import kernel_launch

BIASES = ("none", "gated")
NUM_BUCKETS, MAX_DISTANCE = 32, 128  # XLM-E's run files (models/config.py's defaults)
# (block_q, block_k) tiles and (warps, stages), in the order tried (our choice: the current
# setting first, then the tiles FA-2 Triton kernels commonly use at head dim 64 on Hopper)
_TILES = ((64, 64), (128, 64), (64, 128), (128, 128), (128, 32), (32, 128), (32, 64), (64, 32))
_WARPS_STAGES = ((4, 3), (8, 3), (4, 2), (4, 4), (8, 2))
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 5e-3}  # largest error / largest |x|


@dataclasses.dataclass(frozen=True)
class Problem:
    """The attention call the kernels are timed on."""

    batch: int
    seq_len: int
    heads: int
    head_dim: int
    dtype: str
    dropout: float
    bias: str  # "none" or "gated"

    def flops(self, kernel: str) -> float:
        """Matmul FLOPs of one kernel: forward 2 products (QKᵀ, PV), dk/dv 4 (QKᵀ again,
        dO·Vᵀ, Pᵀ·dO, dSᵀ·Q), dq 3 (QKᵀ, dO·Vᵀ, dS·K), each 2·B·H·T²·Dh."""
        per = 2 * self.batch * self.heads * self.seq_len**2 * self.head_dim
        return per * {"forward": 2, "dkv": 4, "dq": 3}[kernel]


@dataclasses.dataclass
class Row:
    """One kernel at one launch: "ok", "wrong" (outputs off the default's), "failed"."""

    bias: str
    kernel: str
    launch: str
    status: str
    ms: float | None = None
    tflops: float | None = None
    error: float | None = None  # largest |got - default| / largest |default| over outputs
    reason: str = ""


def parse_launch(text: str) -> kernel_launch.Launch:
    """``"128x64w4s3"`` -> ``Launch(128, 64, 4, 3)``."""
    return kernel_launch.Launch(*kernel_launch.launch_fields(text))


def gpu_launches() -> list[str]:
    """The default candidates, most likely first: each (warps, stages) over every tile."""
    return [f"{bq}x{bk}w{w}s{s}" for w, s in _WARPS_STAGES for bq, bk in _TILES]


@dataclasses.dataclass(frozen=True)
class Call:
    """One random attention call shaped like a base step's: its arguments for
    `flash_attention`, the same prepared for the kernels, and a padded output cotangent."""

    q: Any
    k: Any
    v: Any
    kwargs: dict[str, Any]  # the array arguments (mask, relative, dropout_rng)
    inputs: Any  # fused_attention.FlashInputs
    do: Any  # [B, Tq_p, H, Dh_p]


def make_call(problem: Problem, seed: int = 0) -> Call:
    """The call `problem` describes, with random values (a fixed seed)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from xlm_jax.models import fused_attention, position
    from xlm_jax.models.token_mask import TokenMask

    b, t, h, d = problem.batch, problem.seq_len, problem.heads, problem.head_dim
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(problem.dtype)
    q, k, v, cot = (jnp.asarray(rng.normal(size=(b, t, h, d)), dtype) for _ in range(4))
    lengths = np.where(np.arange(b) % 4 == 3, t - t // 8, t)  # a quarter of the rows padded
    # the mask as the model gives it (`Encoder`: a TokenMask of the rows' valid tokens, which
    # the kernels evaluate per tile from [B, T] rows), not a [B, 1, T, T] array read per tile
    kwargs: dict[str, Any] = {"mask": TokenMask.padding(np.arange(t)[None] < lengths[:, None])}
    if problem.bias == "gated":
        pos = jnp.tile(jnp.arange(t, dtype=jnp.int32), (b, 1))
        kwargs["relative"] = position.RelativeBias(
            jnp.asarray(rng.normal(size=(NUM_BUCKETS, h)), jnp.float32), pos, pos,
            jnp.asarray(rng.uniform(0.0, 2.0, size=(b, h, t)), jnp.float32),
            num_buckets=NUM_BUCKETS, max_distance=min(MAX_DISTANCE, t // 2))
    if problem.dropout:
        kwargs["dropout_rng"] = jax.random.key(3)
    inputs = fused_attention.prepare(q, k, v, dropout_rate=problem.dropout, **kwargs)
    padded = inputs.arrays[0].shape
    do = jnp.pad(cot, ((0, 0), (0, padded[1] - t), (0, 0), (0, padded[3] - d)))
    return Call(q, k, v, kwargs, inputs, do)


def kernel_fn(call: Call, kernel: str, launch) -> Callable[..., Any]:
    """A jitted ``(arrays, o, lse) -> outputs`` of one kernel at ``launch`` (the arrays are
    arguments, not constants baked into the program)."""
    import jax

    from xlm_jax.models import fused_attention

    st, tq, dh, do = call.inputs.st, call.inputs.tq, call.inputs.dh, call.do

    def run(arrays, o, lse, do):
        inputs = fused_attention.FlashInputs(st, arrays, tq, dh)
        return fused_attention.run_kernel(inputs, kernel, launch, o=o, lse=lse, do=do)

    return lambda arrays, o, lse, jitted=jax.jit(run): jitted(arrays, o, lse, do)


def _time_ms(fn: Callable[[], Any], iters: int) -> float:
    """Median milliseconds of ``fn()`` after one call that compiles it."""
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _error(got: Sequence[Any], want: Sequence[Any]) -> float:
    """Largest |got - want| relative to the largest |want|, over the outputs both have."""
    import numpy as np

    worst = 0.0
    for g, w in zip(got, want):
        if w is None:
            continue
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        finite = np.isfinite(w)  # lse is +inf on fully masked rows
        if not np.array_equal(finite, np.isfinite(g)):
            return float("inf")
        scale = max(float(np.max(np.abs(w[finite]), initial=0.0)), 1e-30)
        worst = max(worst, float(np.max(np.abs(g[finite] - w[finite]), initial=0.0)) / scale)
    return worst


class Sweep:
    """The kernels of each bias variant timed over launches, within a budget."""

    def __init__(self, problems: Sequence[Problem], launches: Sequence[str], iters: int,
                 budget_s: float, on_row: Callable[[Row], None] = lambda row: None):
        self.problems, self.launches, self.iters = list(problems), list(launches), iters
        self.deadline = time.perf_counter() + budget_s
        self.on_row = on_row
        self.rows: list[Row] = []
        self.combined: list[dict[str, Any]] = []
        self.complete = False
        self._state: dict[str, Any] = {}

    def _setup(self, problem: Problem):
        """The call and the default launch's outputs of each kernel (the forward's o and lse
        are the backward kernels' operands)."""
        if problem.bias not in self._state:
            call = make_call(problem)
            default, arrays = call.inputs.st.launch, call.inputs.arrays
            o, lse = kernel_fn(call, "forward", default.forward)(arrays, None, None)
            ref = {"forward": (o, lse)}
            for kernel in ("dkv", "dq"):
                ref[kernel] = kernel_fn(call, kernel, default.of(kernel))(arrays, o, lse)
            self._state[problem.bias] = (call, ref)
        return self._state[problem.bias]

    def _one(self, problem: Problem, kernel: str, text: str) -> Row:
        try:  # the default launch's reference first: if it cannot run, every row says why
            call, ref = self._setup(problem)
            o, lse = ref["forward"]
            fn = kernel_fn(call, kernel, parse_launch(text))
            ms = _time_ms(lambda: fn(call.inputs.arrays, o, lse), self.iters)
            err = _error(fn(call.inputs.arrays, o, lse), ref[kernel])
        except Exception as e:  # noqa: BLE001 - a launch the compiler refuses is a row
            return Row(problem.bias, kernel, text, "failed",
                       reason=f"{type(e).__name__}: {e}".splitlines()[0][:200])
        ok = err <= TOLERANCE[problem.dtype]
        return Row(problem.bias, kernel, text, "ok" if ok else "wrong", round(ms, 4),
                   round(problem.flops(kernel) / ms / 1e9, 1), err,
                   "" if ok else f"error {err:.3g} above {TOLERANCE[problem.dtype]:g}")

    def run(self) -> None:
        """Launch by launch (each kernel of each problem), stopping at the deadline."""
        from xlm_jax.models import fused_attention

        for text in self.launches:
            for problem in self.problems:
                for kernel in fused_attention.KERNELS:
                    if time.perf_counter() >= self.deadline:
                        return
                    row = self._one(problem, kernel, text)
                    self.rows.append(row)
                    self.on_row(row)
        self._combine()
        self.complete = True

    def best(self) -> dict[str, dict[str, Row]]:
        """The fastest correct launch of each (bias, kernel)."""
        out: dict[str, dict[str, Row]] = {}
        for row in self.rows:
            if row.status == "ok":
                cur = out.setdefault(row.bias, {}).get(row.kernel)
                if cur is None or row.ms < cur.ms:
                    out[row.bias][row.kernel] = row
        return out

    def best_launches(self) -> dict[str, kernel_launch.KernelLaunch]:
        """Each bias variant's best launch of every kernel, where every kernel has one."""
        return {bias: kernel_launch.KernelLaunch(
                    *(parse_launch(kernels[k].launch) for k in kernel_launch.KERNELS))
                for bias, kernels in self.best().items()
                if len(kernels) == len(kernel_launch.KERNELS)}

    def _combine(self) -> None:
        """Forward + backward of the whole call (`flash_attention` under `jax.grad`): the
        default launch against each bias's best."""
        import jax
        import jax.numpy as jnp

        from xlm_jax.models import fused_attention

        best = self.best_launches()
        for problem in self.problems:
            chosen = best.get(problem.bias)
            if chosen is None or time.perf_counter() >= self.deadline:
                continue
            call, _ = self._setup(problem)
            t, d = problem.seq_len, problem.head_dim
            cot = call.do[:, :t, :, :d].astype(jnp.float32)

            def step_ms(launch: Any) -> float:
                def loss(q, k, v, cot, kwargs):
                    out = fused_attention.flash_attention(
                        q, k, v, launch=launch, dropout_rate=problem.dropout, **kwargs)
                    return jnp.sum(out.astype(jnp.float32) * cot)

                grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
                return _time_ms(lambda: grad(call.q, call.k, call.v, cot, call.kwargs),
                                self.iters)

            row = {"bias": problem.bias, "launch": kernel_launch.text(chosen),
                   "default_launch": kernel_launch.text(call.inputs.st.launch)}
            try:
                times = {"default": step_ms(call.inputs.st.launch), "best": step_ms(chosen)}
            except Exception as e:  # noqa: BLE001 - the rows stand; say why this did not
                self.combined.append({**row, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
                continue
            self.combined.append({**row, "default_ms": round(times["default"], 4),
                                  "best_ms": round(times["best"], 4)})

    def launch_text(self) -> dict[str, str]:
        """`best_launches` as `ModelConfig.attention_launch` text."""
        return {bias: kernel_launch.text(launch) for bias, launch in self.best_launches().items()}

    def as_json(self, problems_info: dict[str, Any]) -> dict[str, Any]:
        return {"settings": problems_info, "complete": self.complete,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "best": {b: {k: r.launch for k, r in ks.items()} for b, ks in self.best().items()},
                "launch_text": self.launch_text(), "combined": self.combined}


def table_row(row: Row) -> str:
    f = lambda x, spec: "—" if x is None else format(x, spec)  # noqa: E731
    return (f"| {row.bias} | {row.kernel} | {row.launch} | {row.status} | {f(row.ms, '.4f')} | "
            f"{f(row.tflops, '.1f')} | {f(row.error, '.2e')} | {row.reason} |")


def problem_flags(shape: str, dtype: str, bias: str) -> tuple[tuple[int, ...], list[str]]:
    """``--shape``, ``--dtype`` and ``--bias`` checked: ((batch, seq_len, heads, head_dim),
    the biases); ValueError (one line) otherwise. Shared with `kernel_ptx`."""
    dims = tuple(int(x) for x in shape.split(","))
    if len(dims) != 4:
        raise ValueError(f"--shape {shape!r}: batch,seq_len,heads,head_dim")
    biases = [x.strip() for x in bias.split(",")]
    if dtype not in TOLERANCE or any(x not in BIASES for x in biases):
        raise ValueError(f"--dtype {dtype!r} / --bias {bias!r}: dtype one of "
                         f"{', '.join(TOLERANCE)}, bias of {', '.join(BIASES)}")
    return dims, biases


def _parser() -> argparse.ArgumentParser:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.kernel_sweep", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="32,512,12,64", help="batch,seq_len,heads,head_dim")
    p.add_argument("--dtype", default="bfloat16", help=", ".join(TOLERANCE))
    p.add_argument("--dropout", type=float, default=0.1, help="attention dropout rate")
    p.add_argument("--bias", default="none,gated", help="comma-separated: none, gated")
    p.add_argument("--launches", default=None,
                   help="comma-separated BQxBKwWARPSsSTAGES (default: the GPU candidates)")
    p.add_argument("--budget_s", type=float, default=150.0, help="stop starting rows after it")
    p.add_argument("--iters", type=int, default=10, help="timed calls per row (median)")
    p.add_argument("--json", default=None, help="write the results here (after every row)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        (b, t, h, d), biases = problem_flags(args.shape, args.dtype, args.bias)
        launches = (gpu_launches() if args.launches is None
                    else [x.strip() for x in args.launches.split(",")])
        for text in launches:
            try:
                kernel_launch.launch_fields(text)  # pure Python: checked before jax starts
            except ValueError as e:
                raise ValueError(f"--launches: {e}") from None
    except ValueError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    import jax

    from xlm_jax.accelerator.check import write_atomic

    problems = [Problem(b, t, h, d, args.dtype, args.dropout, x) for x in biases]
    device = jax.devices()[0]
    info = {"shape": [b, t, h, d], "dtype": args.dtype, "dropout": args.dropout,
            "platform": device.platform, "device_kind": device.device_kind,
            "budget_s": args.budget_s, "iters": args.iters}
    print(f"device: {device.device_kind} ({device.platform}); shape {args.shape}, "
          f"{args.dtype}, dropout {args.dropout:g}"
          + ("; interpreted on a CPU: the times say nothing about a GPU"
             if device.platform == "cpu" else ""))
    print("| bias | kernel | launch | status | ms | TFLOP/s | error | reason |")
    print("|---|---|---|---|---|---|---|---|")

    def on_row(row: Row) -> None:
        print(table_row(row), flush=True)
        if args.json:
            write_atomic(args.json, json.dumps(sweep.as_json(info), indent=1))

    sweep = Sweep(problems, launches, args.iters, args.budget_s, on_row)
    sweep.run()
    if not sweep.complete:
        print(f"budget: stopped after {len(sweep.rows)} of "
              f"{len(launches) * len(problems) * 3} rows")
    texts = sweep.launch_text()
    for bias, kernels in sweep.best().items():
        print(f"best ({bias}): " + "; ".join(f"{k} {r.launch} {r.ms:.4f} ms"
                                             for k, r in kernels.items()))
        if bias in texts:
            print(f"  to run with it: --gin.loop.model_config.attention_launch=\"'{texts[bias]}'\"")
    for c in sweep.combined:
        if "error" in c:
            print(f"combined ({c['bias']}): not timed: {c['error']}")
            continue
        print(f"combined ({c['bias']}): forward + backward {c['default_ms']:.4f} ms with the "
              f"default launch, {c['best_ms']:.4f} ms with {c['launch']}")
    if args.json:
        write_atomic(args.json, json.dumps(sweep.as_json(info), indent=1))
    wrong = any(r.status == "wrong" for r in sweep.rows)
    none_ok = bool(sweep.rows) and not any(r.status == "ok" for r in sweep.rows)
    return 1 if wrong or none_ok else 0


if __name__ == "__main__":
    sys.exit(main())
