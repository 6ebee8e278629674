"""Compile time and compiled memory of the training gradient: per-layer loop vs `nn.scan`.

    python docs/experiments/scan_compile.py [--layers 24 48] [--remat none full dots_saveable]
        [--layouts loop scan] [--vocab 8192] [--batch 8] [--seq 128]

For each depth, layout (`ModelConfig.scan_layers` False/True) and remat policy it lowers and
compiles, without running, the gradient of a masked-LM loss (cross-entropy at 20 positions per
row, dropout on with per-row masks, as the train step computes it) at XLM-R Large widths
(d=1024, 16 heads, FFN 4096), and prints a markdown table of the seconds spent tracing and
lowering (`jit(...).lower`), compiling (`.compile()`) and the compiled program's
`memory_analysis()` sizes (temporaries, arguments, outputs) on the default backend. Parameters
and batch are abstract (`jax.ShapeDtypeStruct`), so nothing is allocated.

The vocabulary is 8192 ids (our choice): XLM-R's 250k-row table would add the same embedding
and logits cost to every row and hide the layers' share. The figures are one backend's: on a
CPU, XLA's buffer assignment does not shrink the temporaries with remat the way an
accelerator's does (tests/models/remat_test.py), and compile times depend on the host's cores.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer

MIB = 2 ** 20
PREDICTIONS = 20  # masked positions per row (15% of 128, rounded up; our choice)


def measure(layers: int, scan: bool, remat: str, vocab: int, batch: int, seq: int
            ) -> dict[str, Any]:
    """Lowers and compiles one gradient; returns its timings and memory sizes."""
    cfg = get_config("large", num_layers=layers, vocab_size=vocab, pad_vocab_to_multiple_of=128,
                     remat=remat, scan_layers=scan)
    model = Transformer(cfg)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    positions = jax.ShapeDtypeStruct((batch, PREDICTIONS), jnp.int32)
    params = jax.eval_shape(lambda: nn.meta.unbox(
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)

    def loss(p, input_ids, at, labels, rng):
        def fn(mdl):
            h = mdl.encode(input_ids, deterministic=False, row_ids=jnp.arange(batch))
            logits = mdl.mlm_logits(h.last_hidden_state, at)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return model.apply({"params": p}, rngs={"dropout": rng}, method=fn)

    grad = jax.jit(jax.grad(loss))
    t0 = time.perf_counter()
    lowered = grad.lower(params, ids, positions, positions, key)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    return {"lower_s": t1 - t0, "compile_s": t2 - t1,
            "temp": getattr(mem, "temp_size_in_bytes", float("nan")) / MIB,
            "args": getattr(mem, "argument_size_in_bytes", float("nan")) / MIB,
            "out": getattr(mem, "output_size_in_bytes", float("nan")) / MIB}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[24, 48])
    p.add_argument("--layouts", nargs="+", default=["loop", "scan"], choices=["loop", "scan"])
    p.add_argument("--remat", nargs="+", default=["none", "full", "dots_saveable"])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    a = p.parse_args()
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax "
          f"{jax.__version__}; d=1024, 16 heads, FFN 4096, vocab {a.vocab}, batch "
          f"{a.batch} x {a.seq} tokens\n", flush=True)
    print("| layers | layout | remat | lower s | compile s | temp MiB | args MiB | out MiB |")
    print("|---:|---|---|---:|---:|---:|---:|---:|", flush=True)
    for layers in a.layers:
        for layout in a.layouts:
            for remat in a.remat:
                r = measure(layers, layout == "scan", remat, a.vocab, a.batch, a.seq)
                print(f"| {layers} | {layout} | {remat} | {r['lower_s']:.1f} | "
                      f"{r['compile_s']:.1f} | {r['temp']:.0f} | {r['args']:.0f} | "
                      f"{r['out']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
