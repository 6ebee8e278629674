"""`train()`: the one gin-configurable entry point — a run is setup, then steps and actions.

setup (`train.setup`): checks that need nothing built -> model + objectives -> sharded state
(init, pre-trained init, or restore with its `ResumeInfo`) -> the first step's compile started
on a thread (`train.compile_ahead`) -> data streams from the restored step -> at a run's
start, the fill of objectives whose state must be ready at step 1 (`train.prefill`: XLCo's
queue). Then the step loop: each step is dispatched, and every
periodic job — logging, the objectives' health checks (`train.health`), the evaluators
(`train.evaluators`), checkpoints, profiling, the operative config, a user's own — is an
action called after it (`train.actions`); the run's last line lists the health checks that
fired. Everything else is wired in .gin files (`gin_configs/`), as t5x does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np

from xlm_jax.models.config import ModelConfig, get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.train import actions as actions_lib
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import compile_ahead as ahead_lib
from xlm_jax.train import compile_cache
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import evaluators as evaluators_lib
from xlm_jax.train import host_gc
from xlm_jax.train import step_flops as flops_lib
from xlm_jax.train import health as health_lib
from xlm_jax.train import writers as writers_lib
from xlm_jax.train import mixture
from xlm_jax.train import optim as optim_lib
from xlm_jax.train import partitioning
from xlm_jax.train import prefill
from xlm_jax.train import run_dir
from xlm_jax.train import preemption
from xlm_jax.train import setup
from xlm_jax.train import sizing
from xlm_jax.train import step as step_lib
from xlm_jax.train.setup import ObjectiveSpec  # run files name it `loop.ObjectiveSpec`


@dataclasses.dataclass
class TrainResult:
    """What a finished run returns (the same numbers are in metrics.jsonl)."""

    model_dir: str
    final_step: int  # the last step trained (before train_steps when preempted)
    preempted: bool  # stopped by SIGTERM after saving a checkpoint at final_step
    losses: list[float]
    last_metrics: dict[str, float]
    step_seconds: list[float]  # wall time of each step (first = compile); the host waits for
    # the device only at log, save and eval steps, so time the others only over a window
    tokens_per_step: float  # non-pad tokens per global step, all objectives, mean over steps
    flops_per_token: float
    model: ModelConfig
    batch_size: int  # global, per objective (the run's; `shapes` has each objective's own)
    seq_len: int
    objectives: tuple[str, ...]
    shapes: dict[str, mixture.Shape]
    health: health_lib.HealthReport | None = None  # the health checks that fired
    step_compile: compile_cache.CompileReport | None = None  # the first step's compile
    compiled_ahead: bool = False  # that compile ran beside the input's build (`compile_ahead`)
    first_call_compiles: int = 0  # backend compiles in the first step's call (0: it ran the
    # executable compiled before it)


def model_config(size: str = "base", overrides: Mapping[str, Any] | None = None,
                 dtype: str | None = None, attention_backend: str | None = None,
                 remat: str | None = None, resize: str | None = None,
                 attention_launch: str | None = None) -> ModelConfig:
    """gin-friendly `get_config`: a named size plus a dict of field overrides. `dtype` (the
    compute dtype; parameters keep `param_dtype`), `attention_backend`, `attention_launch`
    (the GPU kernels' tiles, warps and stages, `accelerator.kernel_sweep`) and `remat` are
    bindings of their own so that a command line or a run file's header can set them without
    restating a run file's whole `overrides` dict (`--gin.loop.model_config.dtype="'float32'"`,
    `--gin.loop.model_config.remat="'full'"`); each wins over the same key in `overrides`.
    `resize` (the gin files' `SIZE`, `train.sizing.resized`): a named size whose encoder shape
    (depth, width, heads, FFN) replaces the file's, after `overrides`: the one knob that makes
    any run file small (`--gin.SIZE="'tiny'"`)."""
    fields = dict(overrides or {})
    for name, value in (("dtype", dtype), ("attention_backend", attention_backend),
                        ("remat", remat), ("attention_launch", attention_launch)):
        if value is not None:
            fields[name] = value
    return sizing.resized(get_config(size, **fields), resize)


@gin.configurable(denylist=["model_dir"])
def train(model_dir: str,
          *,
          model: ModelConfig = gin.REQUIRED,
          objectives: Mapping[str, ObjectiveSpec] = gin.REQUIRED,
          train_steps: int = gin.REQUIRED,
          batch_size: int = 32,
          seq_len: int = 128,
          accum_steps: int = 1,
          optimizer: optim_lib.OptimizerConfig = optim_lib.OptimizerConfig(),
          mesh: partitioning.MeshConfig = partitioning.MeshConfig(),
          num_devices: int | None = None,
          axis_rule_overrides: Sequence[tuple[str, Any]] = (),
          loss_normalization: str = "per_objective",
          checkpoint: ckpt_lib.CheckpointConfig = ckpt_lib.CheckpointConfig(),
          log_every: int = 10,
          evaluators: Sequence[evaluators_lib.Evaluator] = (),
          seed: int = 0,
          data_resume: str = "checkpoint",
          task_modules: Sequence[str] = (),
          prepared_data: str | None = None,
          input_shards: int | None = None,
          init_from: str | None = None,
          spm_model: str | None = None,
          save_checkpoints: bool = True,
          save_initial: bool = False,
          eval_at_start: bool = False,
          force_synthetic: bool = False,
          profile_first_step: int = 1,
          profile_steps: int = 0,
          actions: Sequence[actions_lib.Action] = (),
          health: health_lib.HealthConfig = health_lib.HealthConfig(),
          compilation_cache_dir: str | None = compile_cache.AUTO,
          gc_freeze: bool = True,
          compile_ahead: bool = True,
          allow_other_files: bool = False) -> TrainResult:
    """Trains the objective mixture; resumes from the latest checkpoint in `model_dir`.

    `data_resume` says how the input streams continue after a restart: "checkpoint" (saves
    each seqio stream's position with every checkpoint and restores it, exact and in a time
    independent of the step; `xlm_jax.train.data_state`), "replay" (exact, costs the
    pipeline time of the skipped batches) or "reseed" (immediate, reseeded sampling but the
    file sources start over); see `xlm_jax.train.streams.resume_plan`.
    `prepared_data`: a directory `python -m xlm_jax.data.prepared.prepare` wrote; the run's
    tasks read it (same names) instead of their raw files where it holds them, chosen when the
    run builds its datasets (`xlm_jax.data.prepared.choice`): each process reads only its
    share, in a global shuffle, and a restore is constant-time.
    `input_shards`: the seqio streams are read as this many input shards (`train.streams`);
    the global sequence of batches depends on it, not on the process count, so a run whose
    count is a multiple of every process count it will use resumes exactly after a change of
    hosts. None: the checkpoint's count when resuming (if this run's processes can read it),
    else one shard per process.
    `loss_normalization`: "per_objective" (each objective's loss is a mean over its own units)
    or "pooled" (unilm InfoXLM: loss sums over all units); see `step.make_train_step`.
    `save_initial` saves the initial state as checkpoint 0 (the untrained or `init_from`
    model, for baselines); `eval_at_start` runs every evaluator on it and writes the scores at
    step 0 (a resumed run does neither).
    `profile_steps` > 0 records a `jax.profiler` trace of that many steps from step index
    `profile_first_step` (the default 1 skips the compiling step) into `model_dir`, where
    TensorBoard's profile plugin finds it (`plugins/profile/`); only process 0 traces.
    The host reads the device only at steps where an action needs the metrics (log, save and
    eval steps): the metrics of the steps in between stay on the device until then (one
    transfer for the window), and a non-finite loss is found there, before anything is
    logged, evaluated or saved, naming its own step.
    SIGTERM (preemption) saves a checkpoint at the step reached and returns normally
    (`TrainResult.preempted`); see `train.preemption`.
    `evaluators` (`train.evaluators`: `HeldOutLoss`, `TatoebaRetrieval`, `TransferProbe`, a
    user's own) each run every `every` steps and write their scalars under eval/ (metrics.jsonl
    and TensorBoard); with `checkpoint.keep_best` > 0 the one that writes
    `checkpoint.best_metric` also runs at every save step and ranks the checkpoints.
    `force_synthetic` feeds every objective synthetic batches of its kind (the benchmark).
    `actions` run after the built-in ones at every step (`train.actions`: a job's own
    bookkeeping, an extra eval; the tests park a run there to kill it after a save).
    `health` (`train.health.HealthConfig`): the objectives' health checks, read at the log
    steps after a warm-up; each one that fires logs a WARNING once, and the run's last line
    (`health: ...`) lists them.
    `compilation_cache_dir`: jax's persistent compilation cache, so that a restart compiles
    nothing the run compiled before (`train.compile_cache`): 'auto' (a cache the environment
    set, else the user's cache directory on a GPU/TPU, else none), a directory (local or
    gs://), or None/'' (none). The first step is compiled ahead of its call, and the line
    `step compiled in N s: ...` says whether the executable came from the cache.
    `gc_freeze`: the objects alive after the first step's dispatch are frozen out of Python's
    garbage collector for the rest of the loop (`train.host_gc`: a full collection stalled
    an H200's dispatch for 168 ms).
    `compile_ahead`: the first step is compiled on a thread while the input streams are built
    and the first batches read (`train.compile_ahead`); False compiles it after them.
    `model_dir` must be new, empty, or hold this very run (the same model, tokenizer and
    language table: a resume); anything else is refused in one line before anything is
    written (`train.run_dir`). `allow_other_files=True` lets a run start in a directory that
    holds files that are not a run's (nothing of theirs is read or removed). The run's files
    are written once every check has passed, each by temp + rename.
    Progress lines go to stdout (`contextlib.redirect_stdout` to silence them).
    """
    # ---- setup: everything that can fail does so here, before anything is compiled
    started = time.perf_counter()
    streams_lib.resume_plan(seed, 0, data_resume)  # a bad mode fails before anything is built
    if loss_normalization not in step_lib.LOSS_NORMALIZATIONS:
        raise ValueError(f"loop.train.loss_normalization={loss_normalization!r}: expected one "
                         f"of {', '.join(step_lib.LOSS_NORMALIZATIONS)}")
    # jax's persistent cache, before anything compiles: a restart loads the executables (its
    # line prints once set-up has passed: a run that fails there prints only its error)
    cache, cache_line = compile_cache.configure(compilation_cache_dir)
    # whose directory: another run's or the user's files are refused before anything is built
    found = run_dir.inspect(model_dir, model, allow_other_files)
    # fails now if model_dir is unwritable; `checkpoints/` appears at the first save
    ckpt = ckpt_lib.Checkpointer(model_dir, checkpoint, defer_create=True)
    shapes = mixture.resolve(objectives, batch_size, seq_len)
    device_mesh = partitioning.make_mesh(mesh, jax.devices()[:num_devices] if num_devices else None)
    setup.check_batches(shapes, batch_size, accum_steps, device_mesh)
    setup.check_input_shards(input_shards, [shape.batch_size for shape in shapes.values()])
    # the seqio tasks/mixtures the run reads (none when every stream is synthetic)
    seqio_tasks = [] if force_synthetic else [
        spec.task for spec in objectives.values() if streams_lib.is_seqio(spec.task)]
    if not force_synthetic:  # synthetic runs (the benchmark) must not need TensorFlow
        streams_lib.import_modules(task_modules, prepared_data, seqio_tasks)
    languages = setup.check_tasks(model, seqio_tasks)
    if seqio_tasks and jax.process_index() == 0:
        print(f"tasks: {', '.join(seqio_tasks)} loaded in {time.perf_counter() - started:.1f} s",
              flush=True)
    spm_model = streams_lib.run_spm_model(spm_model, seqio_tasks)  # the tasks' tokenizer
    run_dir.check_tokenizer_and_languages(found, spm_model, languages)
    evals = evaluators_lib.check_evaluators(evaluators)
    net = Transformer(model)
    objs, rules = setup.build_objectives(net, objectives, languages, axis_rule_overrides,
                                         optimizer, check_tasks=not force_synthetic)
    context = evaluators_lib.EvalContext(
        model=model, model_dir=model_dir, spm_model=spm_model, languages=languages, rules=rules,
        mesh=device_mesh, seed=seed, objectives=objectives, objs=objs, shapes=shapes,
        check_tasks=not force_synthetic)
    for ev in evals:  # each checks its files and tasks now
        ev.bind(context)
    ranked = evaluators_lib.check_keep_best(checkpoint, evals)
    parts = setup.build_state(net, objs, rules, optimizer, seq_len, device_mesh)
    fill_plan = prefill.plan(objs, shapes)
    is_primary = jax.process_index() == 0
    flops_per_token = flops_lib.mixture_flops_per_token(
        [o.objective for o in objs], seq_len, [shapes[o.name] for o in objs])

    watch = preemption.PreemptionWatch(ckpt.reached_preemption, jax.process_count())
    # after the first step, the objects alive are frozen out of Python's collector: no full
    # collection stalls the dispatch (`train.host_gc`)
    with partitioning.activate(device_mesh, rules), watch, \
            host_gc.FrozenHeap(gc_freeze) as heap, ahead_lib.CompileAhead(compile_ahead) as ahead:
        state, resume = setup.initial_state(ckpt, parts, objs, model, seed, init_from,
                                            model_dir)
        shards = setup.input_shard_count(input_shards, resume,
                                         [shape.batch_size for shape in shapes.values()],
                                         seqio_tasks)
        tasks = {name: (f"{streams_lib.SYNTHETIC}{o.objective.kind}" if force_synthetic else spec.task)
                 for o, (name, spec) in zip(objs, objectives.items())}
        step_fn = setup.jit_train_step(objs, parts, device_mesh, accum_steps, loss_normalization)
        rng = jax.random.PRNGKey(seed + 1)
        # the step compiles beside the streams' build and first batches (`train.compile_ahead`)
        # where every stream is named (seqio or synthetic: its batches hold its kind's
        # features); a stream object's (fine-tuning's, with labels) compiles at the first step
        if all(isinstance(task, str) for task in tasks.values()):
            ahead.start(step_fn, state, setup.batch_specs(objs, shapes, device_mesh, resume.step),
                        rng, device_mesh, rules, cache.path)
        streams, built = setup.make_streams(tasks, shapes, seed, resume, data_resume, model,
                                            model_dir, shards)
        if is_primary:  # every check has passed (the restore's and the input's too)
            setup.write_model_files(model_dir, model, spm_model, languages)
        if not mixture.is_default(shapes, batch_size, seq_len):
            print(f"mixture: {mixture.describe(shapes)}", flush=True)
        if is_primary:
            print(cache_line, flush=True)
            print(f"loss = {step_lib.loss_composition(objs, loss_normalization)}", flush=True)
        if resume.step == 0 and (fill_plan.batches or save_initial or eval_at_start):
            ahead.wait()  # device work before step 1: not beside the compile's autotuning
        # objectives whose state must be ready at step 1 (XLCo's queue): forward passes of the
        # initial parameters over their streams' first batches, once per run
        state, resume = prefill.run(fill_plan, objs, state, streams, resume, parts.shardings,
                                    device_mesh, seed)

        # ---- the actions, in the order they run after each step
        writer = writers_lib.MetricsWriter(model_dir, is_primary=is_primary,
                                           resume_step=resume.step)
        log = actions_lib.LogMetrics(
            writer, writers_lib.Progress(train_steps, out=sys.stdout, log_every=log_every,
                                         is_primary=is_primary),
            log_every, flops_per_token)
        saver = actions_lib.SaveCheckpoint(ckpt, save_checkpoints, model_dir, data_resume,
                                           streams, built, resume.prefill, shards)
        # the objectives' health checks, and the evaluators' watched scalars against step 0's
        checks = actions_lib.CheckHealth(objs, health, optimizer.warmup_steps, is_primary,
                                         evals, from_scratch=not init_from and resume.step == 0)
        evaluate = actions_lib.Evaluate(evals, writer, ranked if save_checkpoints else None,
                                        health=checks)
        run_actions = [
            actions_lib.Profile(model_dir, profile_first_step, profile_steps, train_steps), log,
            evaluate, saver, actions_lib.WriteOperativeConfig(model_dir), *actions]
        run_actions.insert(run_actions.index(log) + 1, checks)  # reads what `log` had read
        if resume.step == 0 and save_initial:  # step 0 = the untrained model, for baselines
            saver.save_initial(state)
        if resume.step == 0 and eval_at_start:  # the evaluators' step-0 baseline
            evaluate.at_start(state)

        # ---- the step loop
        step_seconds: list[float] = []
        pending: list[tuple[int, Any]] = []  # (step, its metrics still on the device)
        done, preempted = resume.step, False
        step_compile, compiled_ahead, first_call_compiles = None, False, 0
        for step in range(resume.step, train_steps):
            for action in run_actions:
                action.before(step)
            t0 = time.perf_counter()
            local = {name: next(streams[name]) for name in mixture.running(shapes, step)}
            batches = {name: setup.global_batch(b, device_mesh) for name, b in local.items()}
            first = step == resume.step
            if first:  # compiled before the first call, which then runs it
                compiled = ahead.result(step_fn, state, batches, rng, cache.path)
                step_compile, compiled_ahead = compiled.compile, compiled.compiled_ahead
                if is_primary:
                    print(f"step compiled in {step_compile.timing()}: "
                          f"{step_compile.describe()}; {_set_up_line(compiled, t0 - started)}",
                          flush=True)
            with jax.profiler.StepTraceAnnotation("train", step_num=step), \
                    (compile_cache.CompileEvents() if first else contextlib.nullcontext()) \
                    as counted:
                state, metrics = step_fn(state, batches, rng)
            if first:  # compiled and dispatched: what is alive now stays
                heap.freeze()
                first_call_compiles = counted.count
                if first_call_compiles and is_primary:
                    print(f"warning: the first step compiled again at its call "
                          f"({first_call_compiles} backend compiles): its arguments differ from "
                          "those it was compiled for", flush=True)
            done = step + 1
            pending.append((done, metrics))
            preempted = watch.reached(done)  # SIGTERM: save this step, then stop
            final = done == train_steps or preempted
            end = actions_lib.StepEnd(done, final, preempted, saver.will_save(done, final),
                                      _tokens(local, model.pad_id), ckpt.wait)
            if any(action.due(end) for action in run_actions):
                end.metrics = actions_lib.read_metrics(pending, objs, ckpt, model_dir)
                pending.clear()
            step_seconds.append(time.perf_counter() - t0)
            for action in run_actions:
                action(end, state)
            if preempted:
                print(f"preempted (SIGTERM) at step {done}: checkpoint saved; the same "
                      "command resumes from it", flush=True)
                break
        for action in reversed(run_actions):
            action.close()
        writer.close()
    if is_primary:  # the checks that fired, or that none did
        print(checks.report().summary(), flush=True)
    return TrainResult(model_dir=model_dir, final_step=done, preempted=preempted,
                       losses=log.losses, last_metrics=log.last, step_seconds=step_seconds,
                       tokens_per_step=(float(np.mean(log.step_tokens)) if log.step_tokens
                                        else 0.0),
                       flops_per_token=flops_per_token, model=model, batch_size=batch_size,
                       seq_len=seq_len, objectives=tuple(objectives), shapes=shapes,
                       health=checks.report(), step_compile=step_compile,
                       compiled_ahead=compiled_ahead, first_call_compiles=first_call_compiles)


def _set_up_line(compiled: ahead_lib.AheadReport, seconds: float) -> str:
    """The end of the "step compiled" line: the set-up's time, and how much of it the first
    step waited for a compile made beside the streams' build."""
    if compiled.compiled_ahead:
        return (f"set-up took {seconds:.1f} s with the compile beside it, then "
                f"{compiled.waited_seconds:.1f} s more")
    return f"set-up took {seconds:.1f} s"


def _tokens(local: Mapping[str, Mapping[str, np.ndarray]], pad_id: int) -> int:
    """The non-pad input tokens of one step's batches, all processes (each process holds
    its own rows of the same shape)."""
    return sum(int((v != pad_id).sum()) for b in local.values() for k, v in b.items()
               if k.endswith("input_ids")) * jax.process_count()
