"""Per-objective data streams for the trainer: seqio tasks or TF-free synthetic batches.

A stream yields this process's rows of each global batch as numpy int32 arrays. A seqio
stream saves its position with each checkpoint (`train.data_state`, the default
`data_resume="checkpoint"`); a stream without a saved position is rebuilt with
`start_step=step` and replays the batches before it, exactly but at the input pipeline's
speed; `resume_plan(..., "reseed")` trades exactness for an O(1) restart (see there).

An objective's task (`ObjectiveSpec.task`) is one of:
- `synthetic:KIND` (KIND a name of `xlm_jax.data.features.KINDS`): the global batch is a
  function of (seed, step) only and each process takes its rows, so any process/device layout
  sees the same global batch. Needs no TensorFlow.
- a stream object (`MemoryStream`: fine-tuning sets read from local files,
  `xlm_jax.finetune`): called as `stream(global_batch, seq_len, seed, start_step)`, it yields
  the global batches computed in this process, as a function of (seed, step) only, and each
  process takes its rows, so a resume rebuilds it at its step at once; its `kind` is checked
  against the objective's like a task's. Passed as an object, not by a registered name: it
  lives as long as the spec that holds it (our choice, instead of a module-global table).
- any other string is a registered seqio task or mixture, read as V input shards of
  global_batch / V rows each (`data.pipeline.make_sharded_iterator`; V = `input_shards`,
  by default the process count): process p of P reads shards p*V/P .. (p+1)*V/P - 1, so the
  global sequence depends on V only and a run resumes exactly on any process count that
  divides V (seqio/TensorFlow imported lazily).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

import jax
import numpy as np

from xlm_jax import cli_help
from xlm_jax.data.features import example_kind

SYNTHETIC = "synthetic:"
Batches = Iterator[dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True, eq=False)
class MemoryStream:
    """A stream of global batches computed in this process, an objective's task as an object.

    batches(global_batch, seq_len, seed, start_step) must yield the global batches of steps
    start_step, start_step + 1, ... as a function of (seed, step) only; kind: the example
    kind of its rows (a name of `features.KINDS`); name: how messages and the checkpoint's
    record of the stream name it."""

    batches: Callable[[int, int, int, int], Batches]
    kind: str = "mono"
    name: str = "memory"

    def __post_init__(self) -> None:
        owner = f"MemoryStream({self.name!r})"
        object.__setattr__(self, "kind", example_kind(self.kind, owner).name)

    def __call__(self, global_batch: int, seq_len: int, seed: int, start_step: int) -> Batches:
        return self.batches(global_batch, seq_len, seed, start_step)


Task = Union[str, MemoryStream]  # what ObjectiveSpec.task holds


def is_seqio(task: Task) -> bool:
    """Whether `task` names a seqio task or mixture (not a synthetic or in-memory stream)."""
    return isinstance(task, str) and not task.startswith(SYNTHETIC)


def task_label(task: Task) -> str:
    """How messages and saved stream positions name a task: the string, or a stream's name."""
    return task if isinstance(task, str) else getattr(task, "name", type(task).__name__)


DATA_RESUME_MODES = ("checkpoint", "replay", "reseed")


def resume_plan(seed: int, start_step: int, mode: str) -> tuple[int, int]:
    """`(seed, start_step)` to build a stream with when a run resumes at step `start_step`
    and the checkpoint has no saved position for it (`train.data_state`).

    - "checkpoint" (the default) and "replay": the run's own seed, skipping `start_step`
      batches, so the resumed run sees exactly the batches of the uninterrupted one. This
      costs the input pipeline's time for `start_step` batches: minutes per 10k steps, hours
      for a pod run preempted late, which is why "checkpoint" saves positions with every
      checkpoint and replays only streams that have none ("replay" saves none).
    - "reseed": a new seed derived from `(seed, start_step)` and no skipping: the restart is
      immediate and still deterministic (the same checkpoint resumes to the same batches).
      What the new seed changes is the mixture sampling and each task's shuffle buffer; the
      file sources restart from their first document. On data the run cycles through many
      times (the demo, parallel corpora) that is a fresh draw; on a corpus read for less than
      one epoch the run re-reads its earliest data after each restart, as t5x does when it
      restarts without a dataset checkpoint. Synthetic streams are redrawn entirely.

    At `start_step == 0` both modes give `(seed, 0)`, so fresh runs do not depend on the mode.
    """
    if mode not in DATA_RESUME_MODES:
        raise ValueError(f"data_resume={mode!r} is not one of {DATA_RESUME_MODES}")
    if mode != "reseed" or start_step == 0:
        return seed, start_step
    derived = np.random.SeedSequence([seed % 2**32, start_step]).generate_state(1)[0]
    return int(derived & 0x7FFFFFFF), 0


def _data_module(name: str) -> Any:
    """`xlm_jax.data.<name>`, imported under `cli_help.tensorflow_quietly` (it imports seqio
    and TensorFlow the first time)."""
    with cli_help.tensorflow_quietly():
        return importlib.import_module(f"xlm_jax.data.{name}")


def import_modules(modules: Sequence[str], prepared_data: str | None = None,
                   tasks: Sequence[Task] = ()) -> None:
    """Imports the modules that register seqio tasks (e.g. `xlm_jax_tasks.demo`); one that cannot be
    found is an ImportError naming it and the setting (`loop.train.task_modules`). The
    input pipeline's modules (seqio, TensorFlow) are imported here and in `_data_module`
    only, under `cli_help.tensorflow_quietly`: a run on synthetic streams never imports
    TensorFlow, and one on seqio tasks imports it without TF's start-up noise.

    `prepared_data` (`loop.train.prepared_data`): the directory `python -m
    xlm_jax.data.prepared.prepare` wrote, which the run's `tasks` read where it holds them
    (`data.prepared.choice`): the modules are imported with their registrations reading it
    (so a host that holds only the prepared data registers them), and the registration calls
    behind `tasks` run again where what they read differs (`registry.select_prepared`): also
    a module imported earlier in the process over other data. None: the raw files. With
    `prepared_data` set, a `tasks` member that still reads other data (its module names its
    own `prepared_dir`) is a ValueError naming both."""
    seqio_tasks = [task for task in tasks if is_seqio(task)]
    if not modules and not seqio_tasks:  # synthetic streams: TensorFlow is never imported
        return
    registry, choice = _data_module("registry"), _data_module("prepared.choice")
    for name in modules:
        try:
            with cli_help.tensorflow_quietly(), choice.reading(prepared_data):
                importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise ImportError(
                f"loop.train.task_modules={','.join(modules)}: cannot import {name!r} ({e}; a "
                "task module must be importable from the working directory or PYTHONPATH)"
            ) from e
    registry.select_prepared(seqio_tasks, prepared_data)
    wrong = [(member.name, where, registry.prepared_root(member))
             for member, where in _seqio_members(tasks)]
    wrong = [row for row in wrong if row[2] != prepared_data]
    if not wrong or prepared_data is None:  # None: a module's own prepared_dir is its choice
        return
    name, where, root = wrong[0]
    if root is None:
        raise ValueError(f"task {where} is not prepared in loop.train.prepared_data = "
                         f"{prepared_data!r}; prepare it there first: python -m "
                         "xlm_jax.data.prepared.prepare --module "
                         f"{','.join(modules) or 'MODULE'} --tasks {name} --output_dir "
                         f"{prepared_data}")
    raise ValueError(f"task {where} reads {root}, but loop.train.prepared_data = "
                     f"{prepared_data!r}: its module registers it with a prepared_dir of its "
                     "own; leave that to the run's setting")


def is_prepared(task: Task) -> bool:
    """Whether every Task behind `task` reads prepared data (`xlm_jax.data.prepared`)."""
    members = list(_seqio_members([task]))
    registry = _data_module("registry") if members else None
    return bool(members) and all(registry.prepared_root(m) for m, _ in members)


def _seqio_members(tasks: Sequence[str]) -> Iterator[tuple[Any, str]]:
    """(seqio Task, how to name it) for every Task of the tasks/mixtures in `tasks`; synthetic
    streams have none. A mixture's Task is named "TASK (in MIXTURE)"."""
    for task in tasks:
        if not is_seqio(task):
            continue
        provider = _data_module("registry").get_provider(task)
        for member in getattr(provider, "tasks", [provider]):
            yield member, member.name if member is provider else f"{member.name} (in {task})"


def language_list(tasks: Sequence[str]) -> list[str] | None:
    """The `lang_ids` table the seqio tasks/mixtures in `tasks` were registered with, or None
    when none of them records one (synthetic streams, tasks registered without the registry).

    Raises ValueError when two of them use different tables: their `lang_ids` would then mean
    different languages to the same language-embedding table.
    """
    seen: dict[tuple[str, ...], str] = {}
    for member, _ in _seqio_members(tasks):
        langs = tuple(getattr(member, "xlm_jax_languages", ()))
        if langs:
            seen.setdefault(langs, member.name)
    if len(seen) > 1:
        (a, ta), (b, tb) = list(seen.items())[:2]
        raise ValueError(f"tasks {ta} and {tb} were registered with different language lists "
                         f"({len(a)} vs {len(b)} languages); register them with the same "
                         "language_list")
    return list(next(iter(seen))) if seen else None


def task_languages(task: str) -> list[str] | None:
    """The language codes the rows of `task` (a seqio task or mixture of the registry) can
    carry: both sides of each parallel member, in the order first seen. None when that is not
    recorded (synthetic streams, monolingual tasks, tasks registered without the registry)."""
    codes: list[str] = []
    for member, _ in _seqio_members([task]):
        table = tuple(getattr(member, "xlm_jax_languages", ()))
        ids = (getattr(member, "xlm_jax_definition", None) or {}).get("langs")
        if not table or not ids:
            return None
        codes += [table[i - 1] for i in ids if table[i - 1] not in codes]
    return codes or None


def vocabulary_size(tasks: Sequence[str]) -> tuple[int, str] | None:
    """The largest token vocabulary (ids 0..size-1 of the `*input_ids` features) among the
    seqio tasks/mixtures in `tasks`, with the task that has it; None for synthetic streams.

    The trainer compares it with the model's `vocab_size` before compiling: an id past the
    embedding table does not fail in JAX (`jnp.take` fills the row with NaN), it shows up as a
    NaN loss at step 1 that names no cause.
    """
    best: tuple[int, str] | None = None
    for member, where in _seqio_members(tasks):
        for key, feature in member.output_features.items():
            if key.endswith("input_ids") and (best is None
                                              or feature.vocabulary.vocab_size > best[0]):
                best = (feature.vocabulary.vocab_size, where)
    return best


def run_spm_model(spm_model: str | None, tasks: Sequence[str]) -> str | None:
    """The SentencePiece model of the run: the one the seqio tasks in `tasks` were registered
    with (their `*input_ids` vocabularies' model file), compared by content.

    `spm_model` unset: the tasks' model (None for synthetic streams), so the model directory
    always carries the model the data were tokenised with. `spm_model` set to a file with other
    content, or tasks tokenised with two different models: a one-line ValueError naming both
    files. Why: a run file still naming the demo's `spm_model` trained on data of another
    tokenizer without a word and copied the wrong model into the model directory, which
    `load_encoder`, retrieval and export then read."""
    from xlm_jax import model_dir as md

    content: dict[str, bytes] = {}

    def read(path: str) -> bytes:
        if path not in content:
            content[path] = md.resolve(path).read_bytes()
        return content[path]

    found: tuple[str, str] | None = None  # (model file, task)
    for member, where in _seqio_members(tasks):
        for key, feature in member.output_features.items():
            path = getattr(feature.vocabulary, "sentencepiece_model_file", None)
            if not key.endswith("input_ids") or not path:
                continue
            if found is None:
                found = (path, where)
            elif read(path) != read(found[0]):
                raise ValueError(f"task {where} is tokenised with {path} but task {found[1]} "
                                 f"with {found[0]} (different models): a run has one tokenizer")
    if found is None:
        return spm_model
    if spm_model is None:
        return found[0]
    if read(spm_model) != read(found[0]):
        raise ValueError(f"loop.train.spm_model={spm_model} is not the SentencePiece model task "
                         f"{found[1]} was registered with ({found[0]}): set spm_model to it, or "
                         "leave spm_model unset to use the tasks' model")
    return spm_model


def task_kinds(task: Task) -> list[tuple[str, str]]:
    """`[(task name, example kind)]` for every seqio Task behind `task` (a Task or a Mixture,
    the kind its registration recorded), or for the synthetic or in-memory stream itself (the
    kind it makes)."""
    if isinstance(task, str) and task.startswith(SYNTHETIC):
        return [(task, example_kind(task[len(SYNTHETIC):], f"task {task!r}").name)]
    if not isinstance(task, str):
        return [(task_label(task), example_kind(task.kind, f"task {task_label(task)!r}").name)]
    registry = _data_module("registry")
    return [(where, registry.provider_kind(member).name)
            for member, where in _seqio_members([task])]


def synthetic_language_count(model_num_languages: int) -> int:
    """How many language ids (1..n) synthetic streams may draw for a model with a language
    table of `model_num_languages` rows: row 0 is padding, so n = rows - 1. An id past the
    table would not fail: `jnp.take` fills out-of-range rows with NaN, and the run stopped at
    step 1 with a NaN loss. Models without a table (0) ignore `lang_ids`; they get 2."""
    return model_num_languages - 1 if model_num_languages else 2


def make_stream(task: Task, global_batch: int, seq_len: int, seed: int, start_step: int,
                vocab_size: int, process_index: int | None = None,
                process_count: int | None = None, num_languages: int = 2,
                input_shards: int | None = None) -> Batches:
    """This process's rows of every global batch from step `start_step` on; a seqio task is
    read as `input_shards` input shards (None: one per process; see the module docstring)."""
    p = jax.process_index() if process_index is None else process_index
    n = jax.process_count() if process_count is None else process_count
    if global_batch % n:
        raise ValueError(f"global batch {global_batch} is not divisible by the "
                         f"{n} processes")
    local = global_batch // n
    if is_seqio(task):
        return _data_module("pipeline").make_sharded_iterator(
            task, global_batch, seq_len, seed, p, n, input_shards or n, start_step=start_step)
    if isinstance(task, str):
        from xlm_jax.data.synthetic import synthetic_batches

        full = synthetic_batches(global_batch, seq_len, vocab_size, kind=task[len(SYNTHETIC):],
                                 seed=seed, num_languages=num_languages, start_step=start_step)
    elif callable(task):
        full = task(global_batch, seq_len, seed, start_step)
    else:
        raise ValueError(f"task {task!r} is neither a task name nor a stream "
                         "(MemoryStream, called as stream(global_batch, seq_len, seed, step))")
    # a global batch per step: this process takes its rows
    return ({k: v[p * local:(p + 1) * local] for k, v in b.items()} for b in full)
