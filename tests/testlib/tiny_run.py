"""Shared by the trainer tests: a few steps of a tiny model through the real `loop.train`.

Each test file used to carry its own variant of this call; the defaults here are the ones the
sharding, accumulation and resume tests compare against (fp32, no dropout, synchronous saves).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

import jax
import numpy as np

from tests.testlib import process_state
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import checkpoints, evaluators, loop, optim, partitioning

# One layer: every trainer concern (sharding, accumulation, resume, objectives' modules) runs
# through each layer alike, and compile time grows with every unrolled layer; tests about the
# layer structure itself (per-layer scores, loading into other layouts) ask for two.
TINY_MODEL = {"vocab_size": 256, "num_layers": 1, "hidden_size": 32, "num_heads": 4,
              "mlp_dim": 64, "max_positions": 66, "dropout_rate": 0.0,
              "attention_dropout_rate": 0.0}


def mlm_objectives(mono_factory: Callable[..., Any] = MaskedLM, pair: bool = True,
                   max_predictions: int = 6, mono_task: str = "synthetic:mono"
                   ) -> dict[str, loop.ObjectiveSpec]:
    """MMLM on `mono_task` (built by `mono_factory`) and, with `pair`, TLM on synthetic pairs."""
    specs = {"mmlm": loop.ObjectiveSpec(factory=lambda model, name: mono_factory(
        model, name=name, kind="mono", max_predictions=max_predictions), task=mono_task)}
    if pair:
        specs["tlm"] = loop.ObjectiveSpec(factory=lambda model, name: MaskedLM(
            model, name=name, kind="pair", max_predictions=max_predictions),
            task="synthetic:pair")
    return specs


def train_tiny(model_dir: Any, steps: int, *, model: dict | None = None,
               objectives: dict | None = None, batch: int = 8, accum: int = 1,
               mesh: partitioning.MeshConfig | None = None, num_devices: int = 1,
               save_every: int = 1000, optimizer: optim.OptimizerConfig | None = None,
               out: Any = None, keep: int = 5, async_save: bool = False, **kw: Any) -> loop.TrainResult:
    """`loop.train` of TINY_MODEL (updated by `model`) for `steps` steps at seq_len 32; the
    progress lines go to `out` (default: nowhere); `gc_freeze` is off unless given.
    `eval_every=N` (with `eval_batches`, 4) adds `evaluators.HeldOutLoss(every=N,
    num_batches=...)` to the run's evaluators."""
    every, batches = kw.pop("eval_every", 0), kw.pop("eval_batches", 4)
    # No freezing of the heap (`loop.train.gc_freeze`) unless a test asks for it: the full
    # collection before the freeze walks the pytest worker's whole heap at every run (0.2 s
    # with two test files loaded, 400k objects; more as a worker accumulates files). Sampled
    # over a whole suite run (py-spy, every process) the freeze was 196 s of 2,343 s of Python
    # time, 158 s of it under this helper; a suite run with only this change, same file
    # order: 2,566 -> 2,412 s of test time. The freeze changes no number
    # (tests/train/host_gc_test.py trains with it on and off) and every command the suite
    # runs trains with it on, as users do.
    kw.setdefault("gc_freeze", False)
    if every:
        kw["evaluators"] = [*kw.get("evaluators", ()),
                            evaluators.HeldOutLoss(every=every, num_batches=batches)]
    # `loop.train` is gin-configurable: each call records its arguments in gin's operative
    # config (what the trainer writes to operative_config.gin), which outlives the call;
    # `restored` puts gin back, so the next run in this process writes only its own.
    with contextlib.redirect_stdout(out or open(os.devnull, "w")), process_state.restored("gin"):
        return loop.train(
            str(model_dir), model=loop.model_config("tiny", {**TINY_MODEL, **(model or {})}),
            objectives=objectives or mlm_objectives(), train_steps=steps, batch_size=batch,
            seq_len=32, accum_steps=accum,
            optimizer=optimizer or optim.OptimizerConfig(learning_rate=3e-3, warmup_steps=2,
                                                         total_steps=20),
            mesh=mesh or partitioning.MeshConfig(data=-1), num_devices=num_devices,
            checkpoint=checkpoints.CheckpointConfig(save_every_steps=save_every, keep=keep,
                                                    async_save=async_save),
            **{"log_every": 1, **kw})


def assert_trees_close(a: Any, b: Any, atol: float) -> None:
    """Every leaf of `a` equals the leaf at the same path of `b` within `atol` (rtol 0)."""
    flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    for path, x in jax.tree_util.tree_flatten_with_path(a)[0]:
        np.testing.assert_allclose(np.asarray(x), np.asarray(flat_b[path]), atol=atol, rtol=0,
                                   err_msg=jax.tree_util.keystr(path))
