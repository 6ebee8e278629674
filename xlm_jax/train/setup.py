"""Everything a run builds before its first step, in the order `loop.train` calls it.

checks that need nothing built (batch split over the mesh, the tasks' language and token
tables) -> objectives and the rule table -> the state's optimiser, init function, shardings
(traced, nothing allocated) -> the model directory's files -> the initial state (fresh, from a
pre-trained encoder, or restored with its `ResumeInfo`) -> the input streams at the restored
step. `xlm_jax.accelerator.pod_memory` and `xlm_jax.accelerator.lower` build the same state and step
with these.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import RUN_ARGUMENTS, Objective
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import data_state
from xlm_jax.train import declarations
from xlm_jax.train import mixture
from xlm_jax.train import optim as optim_lib
from xlm_jax.train import partitioning
from xlm_jax.train import step as step_lib
from xlm_jax.train.resume import ResumeInfo

logger = logging.getLogger(__name__)
# The distributions whose release decides a run's numerics (XLA's compiler and the device
# runtime): a run that resumes or reproduces another under other versions of them is warned.
# libtpu and the CUDA plugin are recorded as None where absent (a CPU run).
RUNTIME_DISTRIBUTIONS = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin")


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """One objective of the mixture: how to build it, what feeds it, its loss weight."""

    # called as factory(model=..., name=..., **run arguments it declares), see build_objective
    factory: Callable[..., Objective]
    # A seqio task/mixture name, synthetic:KIND, or a stream object (data.MemoryStream)
    task: streams_lib.Task = "synthetic:mono"
    weight: float = 1.0
    eval_task: streams_lib.Task | None = None  # a held-out task for periodic eval (None: no eval)
    # Its own global rows / row length per batch (None: loop.train's batch_size / seq_len),
    # and the steps it runs at: 0-based steps s with s % every == offset (see train.mixture).
    batch_size: int | None = None
    seq_len: int | None = None
    every: int = 1
    offset: int = 0


def _distribution_version(name: str) -> str | None:
    """The installed version of distribution `name`, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_info() -> dict[str, Any]:
    versions = {}
    for mod in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "numpy"):
        try:
            versions[mod] = __import__(mod, fromlist=["_"]).__version__
        except Exception:  # noqa: BLE001 - informational only
            versions[mod] = None
    for dist in RUNTIME_DISTRIBUTIONS[2:]:  # read from metadata: importing them starts nothing
        versions[dist] = _distribution_version(dist)
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        commit = None
    return {"versions": versions, "git_commit": commit, "python": sys.version.split()[0],
            "argv": sys.argv, "process_count": jax.process_count(),
            "device_count": jax.device_count()}


def version_drift(previous: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """The WARNING line for a run whose `RUNTIME_DISTRIBUTIONS` differ from those of the
    run_info.json already in its model_dir (`previous`), naming each such distribution with
    both versions; None when none differs. A distribution the old file did not record (files
    written before it was) is not compared."""
    old, new = previous.get("versions") or {}, current.get("versions") or {}
    names = [n for n in RUNTIME_DISTRIBUTIONS if n in old and old[n] != new.get(n)]
    if not names:
        return None
    was = ", ".join(f"{n} {old[n]}" for n in names)
    now = ", ".join(f"{n} {new.get(n)}" for n in names)
    return f"run_info.json was written with {was}; this process has {now}: numerics may differ"


def write_run_info(model_dir: str, info: Mapping[str, Any]) -> None:
    """Writes `info` as the model_dir's run_info.json, first logging `version_drift` (once, at
    WARNING) against the file already there: a resumed or reproduced run on another JAX or
    device runtime may not reproduce the earlier numbers."""
    path = md.resolve(model_dir) / md.RUN_INFO
    if path.exists():
        try:
            previous = md.read_json(path)
        except ValueError:  # a torn or hand-edited file: nothing to compare with
            previous = {}
        message = version_drift(previous if isinstance(previous, dict) else {}, info)
        if message:
            logger.warning(message)
    md.write_run_info(model_dir, dict(info))


def write_model_files(model_dir: str, cfg: ModelConfig, spm_model: str | None,
                       languages: Sequence[str] | None) -> None:
    """The files that make `model_dir` loadable by `load_encoder`: config, run info (warning
    when the JAX or device runtime versions moved since the last run wrote it), the
    SentencePiece model and the `lang_ids` table (`languages.txt`, one code per line)."""
    if languages:
        md.write_languages(model_dir, languages)
    md.write_config(model_dir, cfg)
    write_run_info(model_dir, _run_info())
    md.copy_spm(spm_model, model_dir)


def global_batch(local: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, Any]:
    return {k: jax.make_array_from_process_local_data(partitioning.batch_sharding(mesh, v.ndim), v)
            for k, v in local.items()}


def batch_specs(objs: Sequence[step_lib.WeightedObjective], shapes: Mapping[str, mixture.Shape],
                mesh: jax.sharding.Mesh, step: int) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
    """Step `step`'s global batches of the objectives that run then (`mixture.running`), as
    the `jax.ShapeDtypeStruct`s of what `global_batch` gives for a named stream: every feature
    of the objective's kind (`data.features`), int32 [batch, seq_len], with `batch_sharding`
    (tests/data/synthetic_test.py checks that synthetic and seqio batches are so). For
    compiling a step before any batch exists (`train.compile_ahead`,
    `accelerator.pod_memory`) without drawing one (a synthetic pair batch of 8192 x 512 takes
    8.5 s to draw on the 2-core CPU)."""
    from xlm_jax.data.features import feature_names  # TF-free

    sharding = partitioning.batch_sharding(mesh, 2)
    return {o.name: {k: jax.ShapeDtypeStruct((shapes[o.name].batch_size, shapes[o.name].seq_len),
                                             np.int32, sharding=sharding)
                     for k in feature_names(o.objective.kind)}
            for o in objs if o.name in mixture.running(shapes, step)}


def _check_batch(batch_size: int, accum_steps: int, mesh: jax.sharding.Mesh,
                 name: str = "") -> None:
    dp = partitioning.data_parallel_size(mesh)
    what = f"objective '{name}': global batch size" if name else "global batch size"
    if batch_size % dp:
        raise ValueError(f"{what} {batch_size} is not divisible by the data-parallel "
                         f"size {dp} (mesh data x fsdp = {dict(mesh.shape)})")
    if batch_size % accum_steps or (batch_size // accum_steps) % dp:
        raise ValueError(f"{what} {batch_size} with accum_steps={accum_steps} gives "
                         f"microbatches not divisible by the data-parallel size {dp}")


def check_tasks(model: ModelConfig, seqio_tasks: Sequence[str]) -> list[str] | None:
    """The tasks' language table, after checking that the model's language and token tables
    are large enough for them (an id past a table gives NaN rows, not an error, in JAX)."""
    languages = streams_lib.language_list(seqio_tasks)
    if languages and model.num_languages and model.num_languages < len(languages) + 1:
        raise ValueError(f"model num_languages={model.num_languages} is too small for the "
                         f"tasks' language list of {len(languages)} languages (lang_ids go up "
                         f"to {len(languages)}; set num_languages >= {len(languages) + 1})")
    vocab = streams_lib.vocabulary_size(seqio_tasks)
    if vocab and vocab[0] > model.vocab_size:
        raise ValueError(f"task {vocab[1]} has a vocabulary of {vocab[0]} ids but the model has "
                         f"vocab_size={model.vocab_size}; set the model's vocab_size to "
                         f"{vocab[0]} (loop.model_config.overrides), or register the task "
                         "with the model's SentencePiece model")
    return languages


def _unaliased(tree: Any) -> Any:
    """`tree` with every leaf its own buffer: a leaf that is the same array object as an
    earlier one is copied. `adapt_pretrained` may place one loaded array at two paths (VECO's
    translation decoder starts from the stack's own layers), and a train state whose leaves
    share a buffer cannot be donated to the step (XLA refuses to donate a buffer twice)."""
    seen: set[int] = set()

    def own(x: Any) -> Any:
        if id(x) in seen:
            return jax.numpy.array(x, copy=True)
        seen.add(id(x))
        return x

    return jax.tree_util.tree_map(own, tree)


def fresh_state(init_fn: Callable[..., Any], shardings: Any,
                 objs: Sequence[step_lib.WeightedObjective], model: ModelConfig, seed: int,
                 init_from: str | None) -> step_lib.TrainState:
    """The initial state, sharded; with `init_from`, the encoder's parameters are loaded
    (objective modules keep their initialisation) and the objective state is rebuilt from
    them (an EMA key encoder starts at the loaded weights)."""
    state = jax.jit(lambda r: nn.meta.unbox(init_fn(r)), out_shardings=shardings)(
        jax.random.PRNGKey(seed))
    if not init_from:
        return state
    from xlm_jax.encoder import load_encoder

    pre = load_encoder(init_from)
    if pre.config.vocab_size != model.vocab_size:
        raise ValueError(f"{init_from}: vocab_size={pre.config.vocab_size} but the "
                         f"model being trained has vocab_size={model.vocab_size}")
    params = step_lib.load_pretrained_params(state.params, pre.params, init_from,
                                             vocab_size=model.vocab_size)
    for o in objs:
        params = o.objective.adapt_pretrained(params)
    params = jax.device_put(_unaliased(params), shardings.params)
    obj_state = jax.jit(lambda p: nn.meta.unbox(step_lib.init_objective_state(objs, p)),
                        out_shardings=shardings.obj_state)(params)
    return state.replace(params=params, obj_state=obj_state)


def restored_state(ckpt: ckpt_lib.Checkpointer, step: int, abstract: Any, shardings: Any
                   ) -> tuple[step_lib.TrainState, ResumeInfo]:
    """The state of checkpoint `step`, loaded straight into the current mesh's shardings,
    and the checkpoint's `ResumeInfo`."""
    target = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    restored, extra = ckpt.restore(step, flax.serialization.to_state_dict(target))
    return (flax.serialization.from_state_dict(target, restored),
            ResumeInfo.from_json(extra, jax.process_count()))


def initial_state(ckpt: ckpt_lib.Checkpointer, parts: "StateParts",
                  objs: Sequence[step_lib.WeightedObjective], model: ModelConfig, seed: int,
                  init_from: str | None, model_dir: str
                  ) -> tuple[step_lib.TrainState, ResumeInfo]:
    """The run's first state and where it starts: the latest checkpoint's state, restored
    into the current shardings, or a fresh one (its encoder from `init_from` when given) at
    step 0. Call inside `partitioning.activate`."""
    latest = ckpt.latest_step()
    if latest is None:
        state = fresh_state(parts.init_fn, parts.shardings, objs, model, seed, init_from)
        return state, ResumeInfo(step=0, process_count=jax.process_count())
    state, resume = restored_state(ckpt, latest, parts.abstract, parts.shardings)
    print(f"resumed from {model_dir} step {resume.step}", flush=True)
    return state, resume


def check_input_shards(requested: int | None, batch_sizes: Sequence[int]) -> int | None:
    """`requested` (loop.train.input_shards), or a one-line ValueError when this run's
    processes cannot read that many input shards: it must be a multiple of the process count
    and divide every objective's batch. Called before anything is built."""
    if requested is None:
        return None
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"loop.train.input_shards={requested!r}: expected an int >= 1")
    processes = jax.process_count()
    if not _shards_readable(requested, processes, batch_sizes):
        raise ValueError(
            f"loop.train.input_shards={requested}: must be a multiple of the {processes} "
            f"processes and divide every objective's batch "
            f"({', '.join(map(str, sorted(set(batch_sizes))))} rows)")
    return requested


def _shards_readable(shards: int, processes: int, batch_sizes: Sequence[int]) -> bool:
    """Whether `processes` processes can read `shards` input shards: each reads shards /
    processes of them, and each shard gives an equal part of every objective's batch."""
    return shards % processes == 0 and all(b % shards == 0 for b in batch_sizes)


def input_shard_count(requested: int | None, resume: ResumeInfo,
                      batch_sizes: Sequence[int], seqio_tasks: Sequence[str]) -> int:
    """How many input shards the run's seqio streams are read as (`train.streams`):
    `requested` (loop.train.input_shards) when given; else, resuming, the checkpoint's count
    when this run's processes can read it (the count is a multiple of the process count and
    divides every objective's batch), so that the run continues the same global sequence;
    else one per process. Raises a one-line ValueError for a `requested` count that cannot
    be read; prints a note when the data order changes at a resume."""
    processes = jax.process_count()
    if requested is not None:
        shards = check_input_shards(requested, batch_sizes)
    else:
        saved = resume.saved_shards if resume.step else processes
        shards = saved if _shards_readable(saved, processes, batch_sizes) else processes
    if resume.step and seqio_tasks and shards != resume.saved_shards:
        print(f"note: the input was read as {resume.saved_shards} shards and now as {shards} "
              f"({processes} processes): the data order differs from the uninterrupted run "
              "(set loop.train.input_shards to a multiple of every process count the run "
              "will use, from its start, to resume exactly)", flush=True)
    return shards


def check_batches(shapes: Mapping[str, mixture.Shape], batch_size: int, accum_steps: int,
                  mesh: jax.sharding.Mesh) -> None:
    """Raises a one-line ValueError when the run's batch, or an objective's own batch, does
    not split evenly over the mesh's data-parallel axes (per microbatch)."""
    _check_batch(batch_size, accum_steps, mesh)
    for name, shape in shapes.items():
        if shape.batch_size != batch_size:
            _check_batch(shape.batch_size, accum_steps, mesh, name)


def _run_arguments(factory: Callable[..., Objective]) -> tuple[str, ...]:
    """The `run_arguments` a factory declares: an Objective class's (gin's configurable
    subclass included), or that of the class a `functools.partial` wraps; () otherwise."""
    target = factory.func if isinstance(factory, functools.partial) else factory
    return tuple(getattr(target, "run_arguments", ()))


def build_objective(net: Transformer, name: str, spec: ObjectiveSpec,
                    languages: Sequence[str] | None, check_tasks: bool) -> Objective:
    """`spec.factory(model=net, name=name, ...)`, with the run arguments the factory declares
    (`Objective.run_arguments`): the run's language table, and the languages its seqio task
    records (when `check_tasks`; None otherwise)."""
    wanted = _run_arguments(spec.factory)
    unknown = [a for a in wanted if a not in RUN_ARGUMENTS]
    if unknown:
        raise ValueError(f"objective {name!r}: run_arguments names {unknown[0]!r}; the trainer "
                         f"passes {', '.join(RUN_ARGUMENTS)}")
    values = {}  # only what the factory asks for: the task's languages query the registry
    if "languages" in wanted:
        values["languages"] = languages
    if "task_languages" in wanted:
        values["task_languages"] = streams_lib.task_languages(spec.task) if check_tasks else None
    return spec.factory(model=net, name=name, **values)


def build_objectives(net: Transformer, specs: Mapping[str, ObjectiveSpec],
                     languages: Sequence[str] | None,
                     axis_rule_overrides: Sequence[tuple[str, Any]],
                     optimizer: optim_lib.OptimizerConfig, check_tasks: bool
                     ) -> tuple[list[step_lib.WeightedObjective], partitioning.Rules]:
    """The mixture's objectives, built with the run's language table (None: synthetic
    streams), and the run's rule table, after the checks that need no shapes: each seqio
    task's kind and languages, module names, rules, learning-rate multipliers."""
    objs = [step_lib.WeightedObjective(build_objective(net, name, spec, languages, check_tasks),
                                       spec.weight)
            for name, spec in specs.items()]
    plain = [o.objective for o in objs]
    declarations.check_kinds(plain, {o.name: streams_lib.task_kinds(specs[o.name].task)
                                     for o in objs} if check_tasks else {})
    owners = declarations.module_owners(plain)
    rules = declarations.merge_rules(partitioning.standard_logical_axis_rules(), plain,
                                     axis_rule_overrides)
    optim_lib.check_module_multipliers(optimizer, owners)
    return objs, rules


def _check_declarations(objectives: Sequence[Objective], init_fn: Callable[..., Any],
                        rules: partitioning.Rules) -> Any:
    """The checks that need the state's shapes (traced, nothing computed or compiled);
    returns the boxed abstract state they traced, for the shardings."""
    boxed = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
    declarations.check_encoder_params_used(objectives, boxed.params)
    declarations.check_logical_names(objectives, boxed.params, boxed.obj_state, rules)
    declarations.check_shared_shapes(
        objectives, lambda o: jax.eval_shape(o.init_modules, jax.random.PRNGKey(0)))
    return boxed


@dataclasses.dataclass(frozen=True)
class StateParts:
    """The optimiser, the init function and the sharded abstract state of a run: what the
    train step is compiled against (`train` and `xlm_jax.accelerator.pod_memory` build it the same
    way)."""

    schedule: Any  # optax schedule (reported as the learning_rate metric)
    tx: Any  # optax.GradientTransformation
    init_fn: Callable[..., step_lib.TrainState]  # rng -> boxed TrainState
    abstract: Any  # unboxed TrainState of jax.ShapeDtypeStruct
    shardings: Any  # TrainState of NamedSharding


def build_state(net: Transformer, objs: Sequence[step_lib.WeightedObjective],
                rules: partitioning.Rules, optimizer: optim_lib.OptimizerConfig,
                seq_len: int, mesh: jax.sharding.Mesh) -> StateParts:
    """Builds the optimiser and init function, checks the declarations against the traced
    state and derives its shardings; traces only, allocates nothing."""
    schedule = optim_lib.make_schedule(optimizer)
    tx = optim_lib.make_optimizer(optimizer)
    init_fn = step_lib.make_init_fn(net, objs, tx, seq_len)
    boxed = _check_declarations([o.objective for o in objs], init_fn, rules)
    abstract, shardings = step_lib.state_shardings(init_fn, mesh, rules, boxed)
    return StateParts(schedule, tx, init_fn, abstract, shardings)


def jit_train_step(objs: Sequence[step_lib.WeightedObjective], parts: StateParts,
                   mesh: jax.sharding.Mesh, accum_steps: int, loss_normalization: str
                   ) -> Callable[..., Any]:
    """The jitted train step `(state, batches, rng) -> (state, metrics)`: the state sharded
    by `parts.shardings` and donated, batches as given (`batch_sharding`), rng and metrics
    replicated. Trace it inside `partitioning.activate(mesh, rules)`."""
    return jax.jit(
        step_lib.make_train_step(objs, parts.tx, parts.schedule, accum_steps,
                                 loss_normalization),
        in_shardings=(parts.shardings, None, partitioning.replicated(mesh)),
        out_shardings=(parts.shardings, partitioning.replicated(mesh)),
        donate_argnums=(0,))


def make_streams(tasks: Mapping[str, streams_lib.Task], shapes: Mapping[str, mixture.Shape],
                 seed: int, resume: ResumeInfo, data_resume: str, model: ModelConfig, model_dir: str,
                 input_shards: int | None = None
                 ) -> tuple[dict[str, Any], dict[str, data_state.SavedStream]]:
    """Each objective's input stream at its position after step `resume.step`, and how each
    was built (recorded with the positions a save writes; see `train.data_state`).

    A stream whose position the checkpoint saved is rebuilt with its saved seed and put
    back there; any other continues by `data.resume_plan` from the number of steps before
    the start that its objective ran at (`mixture.Shape.runs_before`) plus the batches the
    fill before step 1 took from it (`ResumeInfo.prefill`, `train.prefill`), except a prepared
    stream whose positions were saved for another input shard count: it is reseeded
    (`resume_plan`'s "reseed"), constant-time and deterministic, where replaying would cost
    the pipeline time of every step before. Seqio streams are read as `input_shards` input
    shards (`input_shard_count`; None: one per process). A task is a name (seqio,
    synthetic:KIND) or a stream object (`data.MemoryStream`), used as it is."""
    from xlm_jax.data.pipeline import process_shards  # TF-free module at import

    start = resume.step
    shards = input_shards or jax.process_count()
    mine = process_shards(jax.process_index(), jax.process_count(), shards)
    streams, built, replayed, reseeded, restored = {}, {}, [], [], []
    for i, (name, task) in enumerate(tasks.items()):
        shape = shapes[name]
        here = data_state.SavedStream(seed + 1000 * i, streams_lib.task_label(task),
                                      shape.batch_size, shape.seq_len)
        path = data_state.saved_stream(
            resume, name, here, model_dir, mine, shards
        ) if start and data_resume == "checkpoint" else None
        if path is not None:
            stream_seed, position = resume.data_state[name]["seed"], 0
        else:
            mode = data_resume
            if (start and mode == "checkpoint" and name in resume.data_state
                    and not resume.positions_usable(shards)
                    and streams_lib.is_prepared(task)):
                # saved for another shard count: a prepared stream starts a fresh permutation
                # at once (docs/scaling.md) instead of replaying every batch before the step
                mode = "reseed"
                reseeded.append(name)
            # the batches its steps drew, and those the fill before step 1 took
            stream_seed, position = streams_lib.resume_plan(
                here.seed, shape.runs_before(start) + resume.prefilled(name), mode)
            if position and streams_lib.is_seqio(task):
                replayed.append(name)
        streams[name] = streams_lib.make_stream(
            task, shape.batch_size, shape.seq_len, stream_seed, position, model.vocab_size,
            num_languages=streams_lib.synthetic_language_count(model.num_languages),
            input_shards=shards)
        if path is not None:
            streams[name].restore(path)
            restored.append(name)
        built[name] = dataclasses.replace(here, seed=stream_seed)
    if start:
        if restored:
            print(f"restored the input position of {', '.join(restored)}", flush=True)
        asked = [n for n in tasks if data_resume == "reseed" and streams_lib.is_seqio(tasks[n])]
        if asked:
            print(f"the input of {', '.join(asked)} continues in a new order drawn from (seed, "
                  f"step {start}) (loop.train.data_resume = 'reseed')", flush=True)
        if reseeded:
            print(f"the prepared data of {', '.join(reseeded)} continues in a new order drawn "
                  f"from (seed, step {start}): its positions were saved for "
                  f"{resume.saved_shards} input shards", flush=True)
        if replayed:
            print(f"replaying the input batches of {', '.join(replayed)} for the exact data "
                  "order (no saved position for them; loop.train.data_resume = 'reseed' "
                  "restarts the data at once instead)", flush=True)
    return streams, built
