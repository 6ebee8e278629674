"""`finetune`: fine-tune a pre-trained checkpoint on one task with several seeds, select each
seed's checkpoint on the dev sets, score the test sets of every language, and write the
papers' table.

Each seed is one run of the trainer (`xlm_jax.train.loop.train`) in `{model_dir}/seed_{k}`:
the same mesh, AdamW with layer-wise LR decay, orbax checkpoints with exact resume (a
SIGKILLed fine-tuning restarts where it was, its data stream rebuilt at the step), metrics.jsonl
and TensorBoard files. The task head is an objective-owned module (`objectives.task_heads`),
the encoder starts from `init_from` (an xlm_jax model_dir or an HF XLM-R directory).
Checkpoints are written every `eval_every` steps (and at the end); each is scored on the dev
languages of `FinetuneTask.select_on`, the best one (first on ties) on every test language.
Scores are cached per checkpoint (`seed_k/eval/STEP.json`), so a rerun after a finished
training only reads them.

Outputs in `model_dir`: `results.json` (per language: the mean and standard deviation over
seeds and each seed's score; the average over languages; the transfer gap, English minus the
mean of the other languages; each seed's selected step and dev score) and `results.md`
(one table row of the per-language means, the papers' layout).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import gin
import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.finetune import evaluate as ev
from xlm_jax.finetune import rows as rows_lib
from xlm_jax.finetune import tasks as tasks_lib
from xlm_jax.models.transformer import Transformer
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import loop, optim, partitioning

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"


@dataclasses.dataclass(frozen=True)
class Featurised:
    """A split's rows per language, with the examples they came from (for scoring)."""

    rows: dict[str, rows_lib.Rows]
    examples: dict[str, list[Any]]
    mlqa: bool = False  # scored with MLQA's normalisation (MLQA's own files)


def featurise(task: tasks_lib.FinetuneTask, examples: dict[str, list[Any]], tokenizer: Any,
              labels: Sequence[str], lang_id: Any, training: bool, mlqa: bool = False
              ) -> Featurised:
    """Rows of every language's examples (the kind's `rows`); `lang_id(lang)` is the lang_ids
    value (None for a model without language embeddings)."""
    kind = tasks_lib.finetune_kind(task.kind)
    rows = {lang: kind.rows(task, exs, tokenizer, labels, lang_id(lang), training)
            for lang, exs in examples.items()}
    return Featurised(rows=rows, examples=examples, mlqa=mlqa)


def _concat(rows: Sequence[rows_lib.Rows]) -> dict[str, np.ndarray]:
    keys = [k for k in rows[0].arrays]
    return {k: np.concatenate([r.arrays[k] for r in rows]) for k in keys}


def score(task: tasks_lib.FinetuneTask, objective: Any, params: Any, split: Featurised,
          labels: Sequence[str], batch_size: int) -> dict[str, float]:
    """The task metric (0-100) of every language of `split` under `params`."""
    kind = tasks_lib.finetune_kind(task.kind)
    out = {}
    for lang, rows in split.rows.items():
        logits = ev.predict(objective, params, rows, batch_size)
        out[lang] = kind.score(task, logits, rows, split.examples[lang], labels,
                               lang if split.mlqa else None)
    return out


def _mean(scores: dict[str, float]) -> float:
    return float(np.mean(list(scores.values()))) if scores else float("nan")


def summarise(per_seed: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Per-language mean/std over seeds, the average over languages and the transfer gap
    (English minus the mean of the others; None without English or without others)."""
    langs = tasks_lib.split_languages(per_seed[0])
    table = {lang: {"mean": float(np.mean([s[lang] for s in per_seed])),
                    "std": float(np.std([s[lang] for s in per_seed])),
                    "per_seed": [float(s[lang]) for s in per_seed]} for lang in langs}
    means = {lang: v["mean"] for lang, v in table.items()}
    others = [v for lang, v in means.items() if lang != "en"]
    gap = means["en"] - float(np.mean(others)) if "en" in means and others else None
    return {"languages": table, "average": _mean(means), "transfer_gap": gap}


def markdown(name: str, summary: dict[str, Any], metric: str) -> str:
    """One header and one row: each language's mean, the average and the gap (papers' form)."""
    langs = list(summary["languages"])
    head = "| model | " + " | ".join(langs) + " | avg | gap |"
    rule = "|" + "---|" * (len(langs) + 3)
    cells = [f"{summary['languages'][lang]['mean']:.1f}" for lang in langs]
    gap = summary["transfer_gap"]
    row = (f"| {name} | " + " | ".join(cells) + f" | {summary['average']:.1f} | "
           + ("-" if gap is None else f"{gap:.1f}") + " |")
    return f"{metric} (0-100), mean over seeds\n\n{head}\n{rule}\n{row}\n"


@gin.configurable
def finetune(model_dir: str, *, init_from: str = gin.REQUIRED,
             task: tasks_lib.FinetuneTask = gin.REQUIRED, train_steps: int = 1000,
             batch_size: int = 32, learning_rate: float = 2e-5, warmup_fraction: float = 0.1,
             weight_decay: float = 0.01, layerwise_lr_decay: float | None = None,
             dropout_rate: float = 0.1, seeds: Sequence[int] = (1, 2, 3),
             eval_every: int = 0, eval_batch_size: int = 64, accum_steps: int = 1,
             mesh: partitioning.MeshConfig = partitioning.MeshConfig(data=-1),
             num_devices: int | None = None, log_every: int = 50, name: str | None = None,
             init_step: int | None = None, async_save: bool = True, out: Any = sys.stdout
             ) -> dict[str, Any]:
    """Fine-tunes and scores; returns what `results.json` holds. `eval_every` 0 = score only
    the final checkpoint; `init_step` picks a checkpoint of a trainer `init_from` (default the
    latest; 0 = the untrained model a run saved with `save_initial`). Defaults are the usual
    HF fine-tuning values (lr 2e-5, 10% warmup, linear decay, dropout 0.1)."""
    from xlm_jax.encoder import load_encoder

    md.check_writable(model_dir, "finetune.model_dir")
    data = tasks_lib.load(task)
    source = init_from
    if init_step is not None:
        init_from = _export_step(init_from, init_step, model_dir)
    encoder = load_encoder(init_from)
    tok = encoder.tokenizer
    lang_id = (lambda lang: encoder.lang_id(lang)) if encoder.has_language_embeddings else (
        lambda lang: None)
    labels = data.labels
    train = featurise(task, data.train, tok, labels, lang_id, training=True)
    dev = featurise(task, data.dev, tok, labels, lang_id, training=False,
                    mlqa=(task.dev_task or task.xtreme_task) == "mlqa")
    test = featurise(task, data.test, tok, labels, lang_id, training=False,
                     mlqa=task.xtreme_task == "mlqa")
    train_arrays = _concat([train.rows[lang] for lang in tasks_lib.split_languages(train.rows)])
    cfg = dataclasses.replace(encoder.config, dropout_rate=dropout_rate,
                              attention_dropout_rate=dropout_rate)
    kind = tasks_lib.finetune_kind(task.kind)
    obj_name = kind.objective

    def factory(model: Transformer, name: str) -> Any:
        return kind.head(model, name, len(labels))

    every = eval_every or train_steps
    optimizer = optim.OptimizerConfig(
        learning_rate=learning_rate, warmup_steps=int(warmup_fraction * train_steps),
        total_steps=train_steps, weight_decay=weight_decay, clip_norm=1.0,
        layerwise_lr_decay=layerwise_lr_decay,
        num_layers=cfg.num_layers if layerwise_lr_decay else 0)
    spm = md.find_spm(encoder.path)
    # One objective for scoring every checkpoint of every seed: its jitted forward compiles once.
    objective = factory(model=Transformer(cfg), name=obj_name)
    # The training rows, epoch after epoch: a function of (seed, step), as a resume needs.
    stream = streams_lib.MemoryStream(
        lambda b, t, s, start: rows_lib.epoch_batches(train_arrays, b, s, start),
        kind=objective.kind, name=f"finetune {task.xtreme_task} train")
    per_seed_test, selected = [], []
    for seed in seeds:
        run_dir = os.path.join(model_dir, f"seed_{seed}")
        with contextlib.redirect_stdout(out):
            loop.train(
                run_dir, model=cfg,
                objectives={obj_name: loop.ObjectiveSpec(factory, task=stream)},
                train_steps=train_steps, batch_size=batch_size, seq_len=task.max_length,
                accum_steps=accum_steps, optimizer=optimizer, mesh=mesh,
                num_devices=num_devices,
                checkpoint=ckpt_lib.CheckpointConfig(save_every_steps=every, keep=10**6,
                                                     async_save=async_save),
                log_every=log_every, seed=seed, init_from=init_from, spm_model=spm)
        dev_scores = {}
        for step in md.checkpoint_steps(run_dir):
            cached = _cached(run_dir, step)
            if cached is None:
                params = ev.load_params(run_dir, step)
                cached = {"dev": score(task, objective, params, dev, labels, eval_batch_size)}
                _cache(run_dir, step, cached)
            dev_scores[step] = cached
        best = max(dev_scores, key=lambda s: (_mean(dev_scores[s]["dev"]), -s))
        if "test" not in dev_scores[best]:
            params = ev.load_params(run_dir, best)
            dev_scores[best]["test"] = score(task, objective, params, test, labels,
                                             eval_batch_size)
            _cache(run_dir, best, dev_scores[best])
        per_seed_test.append(dev_scores[best]["test"])
        selected.append({"seed": seed, "step": best, "dev": _mean(dev_scores[best]["dev"])})
        print(f"seed {seed}: selected step {best} (dev {selected[-1]['dev']:.1f}), test "
              f"average {_mean(per_seed_test[-1]):.1f}", file=out, flush=True)
    summary = summarise(per_seed_test)
    results = {"task": task.xtreme_task, "kind": task.kind, "metric": task.metric,
               "setting": task.setting, "select_on": task.select_on, "init_from": source,
               "init_step": init_step,
               "labels": list(labels), "seeds": list(seeds), "selected": selected, **summary}
    md.write_json(os.path.join(model_dir, RESULTS_JSON), results)
    md.write_text(os.path.join(model_dir, RESULTS_MD),
                  markdown(name or _run_name(source, init_step), summary, task.metric))
    return results


def _run_name(source: str, step: int | None) -> str:
    base = os.path.basename(os.path.normpath(source))
    return base if step is None else f"{base} (step {step})"


def _export_step(init_from: str, step: int, model_dir: str) -> str:
    """The encoder of checkpoint `step` of the trainer run `init_from`, written as an xlm_jax
    model directory under `model_dir` (with its SentencePiece model and language list), which
    the trainer's `init_from` then loads."""
    from xlm_jax.convert import hf

    if not md.is_model_dir(init_from) or step not in md.checkpoint_steps(init_from):
        raise ValueError(f"finetune.init_step={step}: {init_from} has no checkpoint {step} "
                         f"(its checkpoints: {md.checkpoint_steps(init_from) or 'none'})")
    out = os.path.join(model_dir, f"init_step_{step}")
    if not md.is_model_dir(out):
        cfg, params = hf.load_xlm_jax(init_from, step=step)
        hf.save_xlm_jax(out, cfg, params, spm_from=init_from)
        langs = md.read_languages(init_from)
        if langs:
            md.write_languages(out, langs)
    return out


def _eval_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "eval", f"{step}.json")


def _cached(run_dir: str, step: int) -> dict[str, Any] | None:
    path = md.resolve(_eval_path(run_dir, step))
    return json.loads(path.read_text()) if path.exists() else None


def _cache(run_dir: str, step: int, value: dict[str, Any]) -> None:
    path = md.resolve(_eval_path(run_dir, step))
    path.parent.mkdir(parents=True, exist_ok=True)
    md.write_json(path, value)
