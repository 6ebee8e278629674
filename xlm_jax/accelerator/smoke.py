"""First contact with a new accelerator host: one training step per attention backend, compared.

  python -m xlm_jax.accelerator.smoke [--sizes tiny,base] [--backends xla,cudnn,pallas,auto]
      [--gated_bias off|on|both] [--attention_dropout 0.1] [--batch_size N] [--seq_len T]
      [--steps 5] [--json OUT]

For every size, for the plain model and for the model with XLM-E's gated relative position
bias, and for every attention backend, it compiles and runs the library's own train step
(`train.step.make_train_step` with the MMLM objective and the library's AdamW, on a synthetic
batch) at the run files' accelerator precision: bfloat16 compute, float32 parameters. Every
backend starts from the same parameters, batch and keys, and its loss, attention-block outputs,
final hidden states and gradients are compared with the `xla` backend's (the reference). It
times the step: the compile (trace + lower + compile) apart from the steady state (median of
`--steps` steps, each waited for with `block_until_ready`). A markdown table goes to stdout;
docs/performance.md ("First contact") says what each column and each failure means.

A backend that cannot serve this platform or these inputs is a row "unavailable: <reason>":
the library's own `attention.AttentionBackendError` for an explicitly requested backend (its
reason from `cudnn_unavailable_reason` / `pallas_unavailable_reason`); nothing falls back to
the XLA path. On a CPU the pallas kernel runs interpreted (slow; its times say nothing about a
GPU) and cudnn is unavailable. What `auto` chose is printed under the table (the library's
WARNING line).

Exit status: 0 when every backend that ran agrees with xla within the tolerance; 1 when one
disagrees, produces a NaN/inf or fails to compile or run (or xla itself fails); 2 on bad flags.
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

import jax
import jax.numpy as jnp
import optax

from xlm_jax import cli_help
from xlm_jax.cli_help import HelpFormatter
from xlm_jax.models import attention, attention_backends
from xlm_jax.models.config import SIZES, ModelConfig, get_config

COMPUTE_DTYPE = "bfloat16"  # the run files' accelerator compute dtype (params stay float32)
# Relative errors allowed against the xla backend (our choice). Errors are relative L2 norms,
# ||backend - xla|| / ||xla||, over the whole array ("attention": the worst layer's self-
# attention block output; "grad": all gradients together; "grad leaf": the worst single
# parameter's gradient, which shows a broken small tensor such as the bucket table that the
# global norm hides); the loss's is |difference| / |xla loss|. bfloat16 keeps 8 significant
# bits (a rounding step of 2^-8 = 0.4%), and two correct backends round in different places (a
# fused kernel rescales its softmax block by block), so they differ by a few rounding steps that
# grow with depth. Measured on the CPU (2 x 64, docs/performance.md), pallas against xla,
# attention / hidden / grad / worst leaf: tiny 0.3% / 0.2% / 0.5% / 1.3%, base 0.4% / 0.9% /
# 1.5% / 2.6%, about what xla in bfloat16 differs from xla in float32; the bounds are 4-15x
# base's. Faults measured on tiny: other attention-dropout bits give attention 14%, worst leaf
# 91%; a gated bias left out gives under 1% in the forward (its table starts near +-0.02) but
# 100% on its gates' gradients.
TOLERANCE: dict[str, float] = {"loss": 2**-8, "attention": 2**-4, "hidden": 2**-4,
                               "grad": 2**-4, "grad leaf": 2**-3}
# Parameters left out of "grad leaf" (they count in "grad"): a key projection's bias adds the
# same q.b_k to every logit of a query, which the softmax cancels, so its exact gradient is zero
# and what a step computes there is rounding noise (relative error ~1).
ZERO_GRADIENT_PARAMS = ("attention/key/bias",)
CPU_BATCH, CPU_SEQ_LEN = 2, 64  # our choice: the interpreted kernel stays quick on 2 cores
ACCEL_BATCH, ACCEL_SEQ_LEN = 8, 512  # the run files' sequence length, a batch of 8
GATED = {"off": (False,), "on": (True,), "both": (False, True)}


@dataclasses.dataclass
class StepOutputs:
    """What one backend's step produced: the loss, per-layer attention-block outputs (the
    self-attention module's output, after its projection), final hidden states, gradients."""

    loss: jax.Array
    attention: dict[str, jax.Array]
    hidden: jax.Array
    grads: Any


@dataclasses.dataclass
class Row:
    """One table row: a (size, gated bias, backend) case and what became of it.

    status: "reference" (the xla row), "ok", "mismatch", "nan", "unavailable", "failed"
    (detail: the phase, init/compile/step/forward, and the error) or "skipped" (the xla
    reference failed);
    errors: relative error per compared quantity (TOLERANCE's keys); worst: the layer and the
    parameter with the largest attention / gradient error."""

    size: str
    gated_bias: bool
    backend: str
    status: str = "ok"
    detail: str = ""
    loss: float | None = None
    errors: dict[str, float] = dataclasses.field(default_factory=dict)
    worst: dict[str, str] = dataclasses.field(default_factory=dict)
    compile_s: float | None = None
    step_ms: float | None = None


def adjust_outputs(row: Row, outputs: StepOutputs) -> StepOutputs:
    """Test hook: every backend's outputs pass through here before they are checked and
    compared (the tests replace it to inject a mismatch or a NaN and see the exit status
    change). Returns `outputs` unchanged."""
    return outputs


def model_config(size: str, gated_bias: bool, backend: str, attention_dropout: float,
                 seq_len: int, num_layers: int | None = None) -> ModelConfig:
    """A named size at bf16 compute with `backend`: the plain model (absolute positions) or
    XLM-E's (absolute positions and the gated relative bias, as runs/xlme_base.gin). The
    position table grows when `seq_len` exceeds it (tiny admits 256 tokens). `num_layers`
    overrides the size's depth (None: keep it)."""
    fields: dict[str, Any] = dict(dtype=COMPUTE_DTYPE, attention_backend=backend,
                                  position_type="both" if gated_bias else "absolute",
                                  attention_dropout_rate=attention_dropout)
    if num_layers:
        fields["num_layers"] = num_layers
    cfg = get_config(size, **fields)
    if cfg.max_sequence_length is not None and seq_len > cfg.max_sequence_length:
        cfg = cfg.replace(max_positions=seq_len + cfg.pad_id + 1)
    return cfg


def keep_gradients() -> optax.GradientTransformation:
    """Passes the gradients through unchanged and keeps them as its state, so the train step's
    new `opt_state[0]` holds the step's gradients (before clipping) for the comparison."""
    return optax.GradientTransformation(
        lambda params: jax.tree_util.tree_map(jnp.zeros_like, params),
        lambda updates, state, params=None: (updates, updates))


class Case:
    """One model (size, gated bias) at one batch shape: the train step's pieces from the
    library (Transformer, MaskedLM, make_optimizer, make_init_fn, make_train_step), one
    synthetic MMLM batch and keys, shared by every backend."""

    def __init__(self, size: str, gated_bias: bool, attention_dropout: float, batch_size: int,
                 seq_len: int, num_layers: int | None = None):
        from xlm_jax.accelerator.bench import prediction_slots
        from xlm_jax.data.synthetic import synthetic_batch

        self.size, self.gated_bias, self.attention_dropout = size, gated_bias, attention_dropout
        self.batch_size, self.seq_len, self.num_layers = batch_size, seq_len, num_layers
        ref = self.config("xla")
        self.slots = prediction_slots(0.15, seq_len)  # the run files' rule (80 at 512)
        rows = synthetic_batch(batch_size, seq_len, ref.vocab_size, "mono", seed=0)
        self.batches = {"mmlm": {k: jnp.asarray(v) for k, v in rows.items()}}
        self.rng = jax.random.PRNGKey(1)
        self.phase = "init"  # what `run` was doing when it raised: init, compile, step, forward
        _, self.tx, init = self._pieces(ref)
        # One initialisation (through the xla model) for every backend: the parameter tree
        # does not depend on the backend.
        self.state = jax.jit(lambda r: _unbox(init(r)))(jax.random.PRNGKey(0))

    def config(self, backend: str) -> ModelConfig:
        return model_config(self.size, self.gated_bias, backend, self.attention_dropout,
                            self.seq_len, self.num_layers)

    def _pieces(self, cfg: ModelConfig) -> tuple[Any, optax.GradientTransformation, Callable]:
        from xlm_jax.models.transformer import Transformer
        from xlm_jax.objectives.mlm import MaskedLM
        from xlm_jax.train import optim
        from xlm_jax.train import step as step_lib

        net = Transformer(cfg)
        objs = [step_lib.WeightedObjective(MaskedLM(net, max_predictions=self.slots))]
        tx = optax.chain(keep_gradients(), optim.make_optimizer(optim.OptimizerConfig()))
        return objs, tx, step_lib.make_init_fn(net, objs, tx, self.seq_len)

    def run(self, backend: str, steps: int) -> tuple[StepOutputs, float, float]:
        """(outputs, compile seconds, median step milliseconds) of `backend`'s train step."""
        from xlm_jax.train import step as step_lib

        cfg = self.config(backend)
        objs, _, _ = self._pieces(cfg)
        self.phase = "compile"
        start = time.perf_counter()
        compiled = jax.jit(step_lib.make_train_step(objs, self.tx)).lower(
            self.state, self.batches, self.rng).compile()
        compile_s = time.perf_counter() - start
        self.phase = "step"
        new_state, metrics = jax.block_until_ready(compiled(self.state, self.batches, self.rng))
        loss, grads = metrics["loss"], new_state.opt_state[0]
        del new_state, metrics  # the rest of the new state: memory the timed steps need
        times = []
        for _ in range(steps):  # the step above warmed up; these are timed
            start = time.perf_counter()
            jax.block_until_ready(compiled(self.state, self.batches, self.rng))
            times.append(time.perf_counter() - start)
        self.phase = "forward"
        attn, hidden = self._forward(cfg)
        outputs = StepOutputs(loss=loss, attention=attn, hidden=hidden, grads=grads)
        return outputs, compile_s, 1000 * statistics.median(times)

    def _forward(self, cfg: ModelConfig) -> tuple[dict[str, jax.Array], jax.Array]:
        """The encoder's forward on the batch in training mode (dropout on, same key for every
        backend): each layer's attention-block output and the final hidden states."""
        from xlm_jax.models.transformer import MultiHeadAttention, Transformer
        from xlm_jax.objectives.mlm import encoder_kwargs

        net = Transformer(cfg)
        batch = self.batches["mmlm"]
        row_ids = jnp.arange(self.batch_size, dtype=jnp.int32)

        def encode(mdl: Transformer) -> jax.Array:
            return mdl.encode(batch["input_ids"], deterministic=False, row_ids=row_ids,
                              **encoder_kwargs(batch, cfg.num_languages > 0)).last_hidden_state

        def forward(params: Any, rng: jax.Array) -> tuple[jax.Array, Any]:
            return net.apply({"params": params}, rngs={"dropout": rng}, method=encode,
                             mutable=["intermediates"],
                             capture_intermediates=lambda m, name: (
                                 isinstance(m, MultiHeadAttention) and name == "__call__"))

        hidden, variables = jax.jit(forward)(self.state.params["encoder"], self.rng)
        flat = jax.tree_util.tree_flatten_with_path(variables["intermediates"])[0]
        return {_path_name(path[:-2]): x for path, x in flat}, hidden


def _unbox(tree: Any) -> Any:
    import flax.linen as nn

    return nn.meta.unbox(tree)


def relative_error(a: jax.Array, b: jax.Array) -> float:
    """||a - b|| / ||b|| in float32 (0 when both are zero, inf when only `b` is)."""
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    diff, ref = float(jnp.linalg.norm(a - b)), float(jnp.linalg.norm(b))
    return diff / ref if ref else (0.0 if diff == 0 else float("inf"))


def _path_name(path: Sequence[Any]) -> str:
    """A tree path as 'layers_0/attention/...' (dict keys by name)."""
    return "/".join(str(getattr(k, "key", k)) for k in path)


def _named_leaves(tree: Any) -> dict[str, jax.Array]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_path_name(path): x for path, x in flat}


def non_finite(outputs: StepOutputs) -> list[str]:
    """Names of the outputs holding a NaN or an infinity."""
    named = {"loss": outputs.loss, "hidden": outputs.hidden,
             **{f"attention {k}": v for k, v in outputs.attention.items()},
             **{f"grad {k}": v for k, v in _named_leaves(outputs.grads).items()}}
    return [k for k, v in named.items() if not bool(jnp.all(jnp.isfinite(v)))]


def compare(row: Row, got: StepOutputs, ref: StepOutputs) -> None:
    """Fills `row.errors`/`row.worst` with `got`'s errors against the xla reference `ref` and
    sets `row.status` to "mismatch" (naming the quantities) when one exceeds TOLERANCE."""
    row.errors["loss"] = relative_error(got.loss, ref.loss)
    layers = {k: relative_error(got.attention[k], v) for k, v in ref.attention.items()}
    row.worst["attention"] = max(layers, key=layers.get)
    row.errors["attention"] = layers[row.worst["attention"]]
    row.errors["hidden"] = relative_error(got.hidden, ref.hidden)
    g, r = _named_leaves(got.grads), _named_leaves(ref.grads)
    diff2 = sum(float(jnp.sum((g[k].astype(jnp.float32) - v) ** 2)) for k, v in r.items())
    ref2 = sum(float(jnp.sum(jnp.square(v.astype(jnp.float32)))) for v in r.values())
    row.errors["grad"] = (diff2 / ref2) ** 0.5
    leaves = {k: relative_error(g[k], v) for k, v in r.items()
              if not any(p in k for p in ZERO_GRADIENT_PARAMS)}
    row.worst["grad leaf"] = max(leaves, key=leaves.get)
    row.errors["grad leaf"] = leaves[row.worst["grad leaf"]]
    over = [k for k, v in row.errors.items() if not v <= TOLERANCE[k]]
    if over:
        row.status = "mismatch"
        row.detail = ", ".join(f"{k} {row.errors[k]:.3g} > {TOLERANCE[k]:.3g}" for k in over)


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def run_case(case: Case, backend: str, steps: int, ref: StepOutputs | None
             ) -> tuple[Row, StepOutputs | None]:
    """One row: `backend`'s step run, checked for non-finite values and compared with `ref`
    (None: this is the reference). Returns the row and the outputs (None when it did not run).
    """
    row = Row(case.size, case.gated_bias, backend, "reference" if ref is None else "ok")
    try:
        outputs, row.compile_s, row.step_ms = case.run(backend, steps)
    except attention.AttentionBackendError as e:  # raised while tracing: nothing ran
        row.status, row.detail = "unavailable", str(e)
        return row, None
    except Exception as e:  # noqa: BLE001 - reported in the row; the exit status says it
        row.status, row.detail = "failed", f"{case.phase}: {_one_line(e)}"
        return row, None
    outputs = adjust_outputs(row, outputs)
    row.loss = float(outputs.loss)
    bad = non_finite(outputs)
    if bad:
        row.status = "nan"
        row.detail = "non-finite " + ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "")
    elif ref is not None:
        compare(row, outputs, ref)
    return row, outputs


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table_markdown(rows: Sequence[Row]) -> str:
    """The markdown table: one line per row; errors are relative to the xla row above."""
    keys = list(TOLERANCE)
    lines = ["| size | gated bias | backend | status | loss | "
             + " | ".join(f"{k} err" for k in keys) + " | compile (s) | step (ms) |",
             "|---" * (len(keys) + 7) + "|"]
    for r in rows:
        status = r.status if not r.detail else f"{r.status}: {r.detail}"
        errors = " | ".join(_fmt(r.errors.get(k), ".2e") for k in keys)
        lines.append(f"| {r.size} | {'on' if r.gated_bias else 'off'} | {r.backend} | "
                     f"{status.replace('|', '/')} | {_fmt(r.loss, '.4f')} | {errors} | "
                     f"{_fmt(r.compile_s, '.1f')} | {_fmt(r.step_ms, '.1f')} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.smoke", description=__doc__,
                        formatter_class=HelpFormatter)
    p.add_argument("--sizes", default="tiny,base",
                   help=f"comma-separated model sizes, of {', '.join(SIZES)}")
    p.add_argument("--backends", default=",".join(attention.VALID_BACKENDS),
                   help="comma-separated attention backends, of "
                        f"{', '.join(attention.VALID_BACKENDS)}; xla, the reference, always runs")
    p.add_argument("--gated_bias", default="both", choices=tuple(GATED),
                   help="the model without (off) or with (on) XLM-E's gated relative position "
                        "bias, or both")
    p.add_argument("--attention_dropout", type=float, default=0.1,
                   help="attention dropout of the step (0.1 is the run files' value; the "
                        "backends agree only if they draw the same dropout bits; 0 checks the "
                        "kernels without dropout, and only then can cudnn run)")
    p.add_argument("--batch_size", type=int, default=None,
                   help=f"rows per step (None: {ACCEL_BATCH} on an accelerator, {CPU_BATCH} "
                        "on a CPU)")
    p.add_argument("--seq_len", type=int, default=None,
                   help=f"tokens per row (None: {ACCEL_SEQ_LEN} on an accelerator, "
                        f"{CPU_SEQ_LEN} on a CPU, where the pallas kernel runs interpreted)")
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps after the first (compiling, warm-up) step; the table "
                        "gives their median")
    p.add_argument("--num_layers", type=int, default=None,
                   help="layers of every size (None: the size's own); fewer is a quicker "
                   "check, as every layer runs the same kernels")
    p.add_argument("--json", default=None, help="also write the rows and settings as JSON here")
    return p


def _bad_flag(args: argparse.Namespace) -> str | None:
    """A one-line error naming the flag and value, or None."""
    for flag, value, valid in (("--sizes", args.sizes, SIZES),
                               ("--backends", args.backends, attention.VALID_BACKENDS)):
        bad = [v for v in value.split(",") if v not in valid] or ([] if value else [value])
        if bad:
            return f"{flag} {','.join(bad) or repr(value)}: not one of {', '.join(valid)}"
    for flag, value, low in (("--batch_size", args.batch_size, 1), ("--seq_len", args.seq_len, 3),
                             ("--steps", args.steps, 1), ("--num_layers", args.num_layers, 1)):
        if value is not None and value < low:
            return f"{flag} {value}: must be at least {low}"
    if not 0.0 <= args.attention_dropout < 1.0:
        return f"--attention_dropout {args.attention_dropout}: must be in [0, 1)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    error = _bad_flag(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    sizes = args.sizes.split(",")
    backends = ["xla"] + [b for b in dict.fromkeys(args.backends.split(",")) if b != "xla"]
    dev = jax.devices()[0]
    cpu = dev.platform == "cpu"
    batch_size = args.batch_size or (CPU_BATCH if cpu else ACCEL_BATCH)
    seq_len = args.seq_len or (CPU_SEQ_LEN if cpu else ACCEL_SEQ_LEN)
    print(f"device: {dev.device_kind} ({dev.platform}; 1 of {jax.device_count()} used), jax "
          f"{jax.__version__}; compute "
          f"{COMPUTE_DTYPE}, params float32; batch {batch_size} x {seq_len}"
          + (f"; {args.num_layers} layer{'s' * (args.num_layers > 1)}" if args.num_layers else "") + "; attention dropout "
          f"{args.attention_dropout}; tolerance (relative error vs xla): "
          + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items()), flush=True)
    if cpu:
        print("note: on a CPU the pallas kernel runs interpreted (slow; its step time says "
              "nothing about a GPU) and cudnn is unavailable", flush=True)
    rows: list[Row] = []
    for size in sizes:
        for gated in GATED[args.gated_bias]:
            ref = case = outputs = None
            try:  # parameters, optimiser state and batch, shared by the backends
                case = Case(size, gated, args.attention_dropout, batch_size, seq_len,
                            args.num_layers)
            except Exception as e:  # noqa: BLE001 - reported in the row (out of memory, ...)
                rows.append(Row(size, gated, "xla", "failed", f"init: {_one_line(e)}"))
            for backend in backends:
                label = f"[{size}, gated bias {'on' if gated else 'off'}, {backend}]"
                if case is None or (backend != "xla" and ref is None):  # nothing to compare with
                    if backend != "xla":
                        rows.append(Row(size, gated, backend, "skipped",
                                        "the xla reference failed"))
                    continue
                print(f"{label} ...", flush=True)
                row, outputs = run_case(case, backend, args.steps, ref)
                rows.append(row)
                print(f"{label} {row.status}{': ' + row.detail if row.detail else ''}",
                      flush=True)
                if row.status == "reference":
                    ref = outputs
            del case, ref, outputs  # free this model's arrays before the next one's
    print(table_markdown(rows))
    notes = attention_backends.logged()  # what `auto` chose; interpreted kernels
    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": f"{dev.device_kind} ({dev.platform})", "jax": jax.__version__,
                       "dtype": COMPUTE_DTYPE, "batch_size": batch_size, "seq_len": seq_len,
                       "num_layers": args.num_layers,
                       "attention_dropout": args.attention_dropout, "tolerance": TOLERANCE,
                       "notes": notes, "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
    failed = [r for r in rows if r.status in ("mismatch", "nan", "failed", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
