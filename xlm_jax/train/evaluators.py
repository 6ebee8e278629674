"""Evaluators: what a run measures on its current parameters, behind one protocol.

A run lists its evaluators in gin (`loop.train.evaluators`), big_vision style:

    import xlm_jax.train.evaluators as evaluators
    loop.train.evaluators = [@evaluators.HeldOutLoss(), @evaluators.TatoebaRetrieval()]
    evaluators.TatoebaRetrieval.tatoeba_dir = 'tasks/demo_data/tatoeba'

and one action (`actions.Evaluate`) runs every due evaluator after a step and writes its
scalars to the run's metric writer (TensorBoard's `eval/` split and metrics.jsonl).

The protocol (`Evaluator` gives the defaults):
- construction (gin, before the run): the evaluator's own settings, checked at once; a bad
  value is a one-line ValueError naming `Class.param`;
- `bind(ctx: EvalContext)`: what it needs from the run (model, model_dir, SentencePiece
  model, language table, objectives, mesh...), called once after the objectives are built
  and before anything is compiled; a missing file or task is a one-line ValueError here;
- `due(step)`: whether it runs after `step` (default: `step % every == 0`); the action also
  runs the evaluator that ranks checkpoints at every save (`CheckpointConfig.keep_best`);
- `run(state_or_params, step) -> dict[str, float]`: named scalars, written as
  `{prefix}/{name}` (`prefix` '' writes `name` alone); every process calls it at the same
  steps (an evaluator may gather sharded parameters, a collective);
- `metric_names()`: the names `run` will return, when known before it runs (None: unknown),
  which `CheckpointConfig.best_metric` is checked against; `close()` after the last step;
- `watched`: the scalars (higher is better) whose fall below their step-0 value the run's
  health checks watch (`train.health.EvalWatch`, with `loop.train.eval_at_start`); `run`
  returns each with its standard error as `NAME_se`.

The three evaluators: `HeldOutLoss` (each objective's loss on a held-out task: `mmlm/loss`,
...), `TatoebaRetrieval` (`retrieval/acc1`, ...) and `TransferProbe` (`probe/avg`, ...; a
logistic-regression head on frozen sentence embeddings, `evaluation.probe`). To add one:
subclass `Evaluator`, set `prefix` and `every`, implement `run` (and `bind` if it needs the
run), and list it in `loop.train.evaluators`; gin configures it with dynamic registration.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from xlm_jax import model_dir as md
from xlm_jax.evaluation import probe, retrieval
from xlm_jax.models.config import ModelConfig
from xlm_jax.objectives.base import ENCODER
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import declarations
from xlm_jax.train import mixture
from xlm_jax.train import partitioning
from xlm_jax.train import setup
from xlm_jax.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """What the trainer hands each evaluator's `bind`: the run as built so far."""

    model: ModelConfig
    model_dir: str
    spm_model: str | None  # the run's SentencePiece model (None: the model_dir's copy, if any)
    languages: Sequence[str] | None  # the tasks' lang_ids table (None: not recorded)
    rules: partitioning.Rules
    mesh: jax.sharding.Mesh  # the training mesh
    seed: int
    objectives: Mapping[str, setup.ObjectiveSpec]
    objs: Sequence[step_lib.WeightedObjective]
    shapes: Mapping[str, mixture.Shape]
    check_tasks: bool = True  # False for synthetic runs (no seqio registry)


class Evaluator:
    """The protocol with its defaults: see the module docstring."""

    prefix: str = ""
    every: int = 1000
    watched: tuple[str, ...] = ()  # see the module docstring

    def bind(self, ctx: EvalContext) -> None:
        """Checks and keeps what the evaluator needs from the run; called before compiling."""
        del ctx

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def metric_names(self) -> list[str] | None:
        """The names `run` returns (without `prefix`), if known after `bind`."""
        return None

    def run(self, state_or_params: Any, step: int) -> dict[str, float]:
        raise NotImplementedError

    def close(self) -> None:
        """Called once after the last step."""


PROTOCOL = ("bind", "due", "metric_names", "run", "close")


def full_name(ev: Evaluator, name: str) -> str:
    """The name a scalar of `ev` is written (and ranked) under."""
    return f"{ev.prefix}/{name}" if ev.prefix else name


def check_evaluators(values: Sequence[Any], where: str = "loop.train.evaluators"
                     ) -> list[Evaluator]:
    """`values` as a list, after checking that each entry follows the protocol and that no two
    write under the same prefix; a one-line ValueError naming the entry otherwise."""
    out = list(values or ())
    for i, ev in enumerate(out):
        missing = [m for m in PROTOCOL if not callable(getattr(ev, m, None))]
        if missing or not isinstance(getattr(ev, "prefix", None), str):
            lacks = ", ".join(missing or ["a str prefix"])
            raise ValueError(f"{where}[{i}]={ev!r:.80} is not an evaluator (it lacks {lacks}; "
                             "list evaluators such as @evaluators.HeldOutLoss())")
        _check_int(type(ev).__name__, "every", getattr(ev, "every", None))
    seen: dict[str, int] = {}
    for i, ev in enumerate(out):
        if ev.prefix in seen:
            j = seen[ev.prefix]
            raise ValueError(f"{where}[{j}] ({type(out[j]).__name__}) and [{i}] "
                             f"({type(ev).__name__}) both write under the prefix {ev.prefix!r}; "
                             "give one of them another `prefix`")
        seen[ev.prefix] = i
    return out


def check_keep_best(checkpoint: ckpt_lib.CheckpointConfig, evaluators: Sequence[Evaluator]
                    ) -> Evaluator | None:
    """The evaluator whose `best_metric` ranks the checkpoints (None without keep_best);
    a one-line ValueError, before anything is compiled, when no bound evaluator writes it."""
    if not checkpoint.keep_best:
        return None
    if not evaluators:
        raise ValueError(f"CheckpointConfig.keep_best={checkpoint.keep_best} ranks checkpoints "
                         f"by the eval metric {checkpoint.best_metric!r}, but "
                         "loop.train.evaluators is empty (list the evaluator that writes it)")
    names = {full_name(ev, n): ev for ev in evaluators for n in ev.metric_names() or ()
             if n != "seconds"}
    if checkpoint.best_metric not in names:
        raise ValueError(f"CheckpointConfig.best_metric={checkpoint.best_metric!r} is not a "
                         f"metric of loop.train.evaluators (they write {', '.join(names)})")
    return names[checkpoint.best_metric]


def _check_int(owner: str, name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}.{name}={value!r} is invalid: must be an integer >= 1")


# ----------------------------------------------------------------------------- held-out loss

class HeldOutLoss(Evaluator):
    """Every `every` steps: each objective's eval metrics (`step.make_eval_step`, dropout off)
    over `num_batches` batches of its held-out task, at the objective's own batch shape,
    written as `{objective}/{metric}` (`mmlm/loss`, `mmlm/accuracy`, ...; prefix ''). Each is
    a mean over all the batches' units (sums and counts added first, `step.EvalSums`), and
    `{objective}/count` is the units of all the batches together.
    `tasks` maps objective names to held-out tasks; None takes each `ObjectiveSpec.eval_task`.
    Needs the train state (`run(state, step)`): the objectives read their state too."""

    def __init__(self, every: int = 1000, num_batches: int = 4,
                 tasks: Mapping[str, str] | None = None, prefix: str = ""):
        _check_int("HeldOutLoss", "every", every)
        _check_int("HeldOutLoss", "num_batches", num_batches)
        self.every, self.num_batches, self.prefix = every, num_batches, prefix
        self.tasks = None if tasks is None else dict(tasks)

    def bind(self, ctx: EvalContext) -> None:
        specs = ctx.objectives
        tasks = self.tasks if self.tasks is not None else {
            n: s.eval_task for n, s in specs.items() if s.eval_task}
        if not tasks:
            raise ValueError("HeldOutLoss: no held-out task (set ObjectiveSpec.eval_task of an "
                             "objective, or HeldOutLoss.tasks)")
        for name, task in tasks.items():
            if name not in specs:
                raise ValueError(f"HeldOutLoss.tasks[{name!r}]: no objective {name!r} in the "
                                 f"mixture ({', '.join(specs)})")
            if ctx.check_tasks and streams_lib.is_seqio(task):
                try:
                    kinds = streams_lib.task_kinds(task)
                except Exception as e:  # noqa: BLE001 - seqio's own unknown-task error
                    raise ValueError(f"HeldOutLoss: the held-out task {task!r} of objective "
                                     f"{name!r}: {str(e).splitlines()[0]}") from None
                objective = next(o.objective for o in ctx.objs if o.name == name)
                declarations.check_kinds([objective], {name: kinds})
        self._tasks, self._ctx = tasks, ctx
        self._eval_fn = jax.jit(step_lib.make_eval_step(ctx.objs))

    def run(self, state_or_params: Any, step: int) -> dict[str, float]:
        ctx, sums = self._ctx, {}
        for name, task in self._tasks.items():
            shape = ctx.shapes[name]
            s = streams_lib.make_stream(
                task, shape.batch_size, shape.seq_len, ctx.seed + 7, 0, ctx.model.vocab_size,
                num_languages=streams_lib.synthetic_language_count(ctx.model.num_languages))
            for i in range(self.num_batches):
                batch = {name: setup.global_batch(next(s), ctx.mesh)}
                out = jax.device_get(self._eval_fn(state_or_params, batch,
                                                   jax.random.PRNGKey(i)))[name]
                out = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), out)
                sums[name] = (jax.tree_util.tree_map(np.add, sums[name], out) if name in sums
                              else out)
        return step_lib.eval_report(ctx.objs, sums)


# ----------------------------------------------------------------------------- on one device

def encoder_params(state_or_params: Any) -> Any:
    """The encoder's parameters of a TrainState, of its `params` tree, or themselves."""
    params = getattr(state_or_params, "params", state_or_params)
    return params[ENCODER] if ENCODER in params else params


def _on_one_device(tree: Any, device: jax.Device) -> Any:
    """`tree`'s arrays whole on `device`: an array spread over other processes' devices is
    first gathered (a collective: every process must call this at the same point)."""
    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x)
        return jax.device_put(x, device)

    return jax.tree_util.tree_map(one, tree)


class LocalEncoder:
    """An `Encoder` over the run's current encoder parameters, copied whole onto the first
    local device, used under a one-device mesh (the model's activation constraints must not
    span the training mesh). Its local directory holds the SentencePiece model the Encoder
    reads (every process has its own, whatever the model_dir's filesystem); one Encoder is
    kept for the run, so its jitted forward compiles once."""

    def __init__(self, ctx: EvalContext, where: str):
        spm = ctx.spm_model or md.find_spm(ctx.model_dir)
        if not spm:
            raise ValueError(f"{where}: the eval needs a SentencePiece model to tokenise the "
                             "sentences; set loop.train.spm_model")
        self.dir = tempfile.mkdtemp(prefix="xlm_jax_eval_")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)  # also on errors
        md.copy_spm(spm, self.dir)
        self.model, self.rules = ctx.model, ctx.rules
        self.language_list = list(ctx.languages) if ctx.languages else None
        self.mesh = partitioning.make_mesh(None, jax.local_devices()[:1])
        self._encoder: Any = None

    @contextlib.contextmanager
    def __call__(self, state_or_params: Any) -> Iterator[Any]:
        from xlm_jax.encoder import Encoder

        local = _on_one_device(encoder_params(state_or_params), self.mesh.devices.flat[0])
        if self._encoder is None:
            self._encoder = Encoder(config=self.model, params=local, path=self.dir,
                                    language_list=self.language_list)
        self._encoder.params = local
        try:
            with partitioning.activate(self.mesh, self.rules):
                yield self._encoder
        finally:
            self._encoder.params = None  # the state's buffers are donated to the next step

    def close(self) -> None:
        """Removes the local directory (also done when the object is collected)."""
        self._cleanup()


# ----------------------------------------------------------------------------- retrieval

class TatoebaRetrieval(Evaluator):
    """Tatoeba retrieval (`evaluation.retrieval.evaluate`, the code of the demo and the CLI)
    every `every` steps, under the prefix `retrieval`:

      acc1            mean acc@1 (%) over languages and both directions, at the layer asked
                      for (several layers: the best of them, as the CLI reports)
      acc1_se         its binomial standard error (`RetrievalResult.standard_error`); acc1 is
                      watched (its fall below step 0's warns, `train.health`)
      layer           that layer (several layers only)
      acc1_layer{k}   each layer's mean acc@1 (%) (several layers only)
      seconds         the eval's wall time (gather + embed + rank)

    Each eval's whole result (every language and scored layer, each sentence's hits at the
    reported layer, and the settings it ran with) is also written, by process 0, to
    `model_dir/eval/{prefix}_step{N}.json` (`result_path`; `RetrievalResult.load` reads it),
    so a per-language table or a paired comparison of a step needs no second scoring of its
    checkpoint (`python -m xlm_jax.demo` reads the last one).

    `tatoeba_dir` holds tatoeba.{xx}-eng.{xx} + tatoeba.{xx}-eng.eng; `layers`: a layer
    (0 = embeddings), a list of layers or "all" (one forward pass for all); `pool` "mean" or
    "cls"; `languages` None: every language of the directory; `max_sentences`: the first N
    lines of each language (None: all); `max_length`: tokens per sentence (None: the
    Encoder's default, 128)."""

    watched = ("acc1",)

    def __init__(self, tatoeba_dir: str = "", every: int = 1000,
                 layers: int | str | Sequence[int] = "all", pool: str = "mean",
                 languages: Sequence[str] | None = None, max_sentences: int | None = None,
                 max_length: int | None = None, batch_size: int = 64,
                 prefix: str = "retrieval"):
        if not tatoeba_dir:
            raise ValueError("TatoebaRetrieval.tatoeba_dir is not set: a directory with "
                             f"{retrieval.FILE_PATTERN}")
        for name, value in (("every", every), ("batch_size", batch_size)):
            _check_int("TatoebaRetrieval", name, value)
        for name, value in (("max_sentences", max_sentences), ("max_length", max_length)):
            _check_int("TatoebaRetrieval", name, value, allow_none=True)
        if pool not in retrieval.POOLS:
            raise ValueError(f"TatoebaRetrieval.pool={pool!r} is invalid: must be one of "
                             f"{', '.join(retrieval.POOLS)}")
        self.tatoeba_dir, self.every, self.layers, self.pool = tatoeba_dir, every, layers, pool
        self.languages = None if languages is None else list(languages)
        self.max_sentences, self.max_length = max_sentences, max_length
        self.batch_size, self.prefix = batch_size, prefix
        self._layers: list[int] | None = None

    def layer_list(self, num_layers: int) -> list[int]:
        """The layers scored, checked against the model (a one-line error when out of range)."""
        try:
            if isinstance(self.layers, (int, str)):
                return retrieval.check_layer(self.layers, num_layers)
            return sorted({l for x in self.layers for l in retrieval.check_layer(x, num_layers)})
        except ValueError as e:
            raise ValueError(f"TatoebaRetrieval.layers: {e}") from None

    def metric_names(self) -> list[str] | None:
        if self._layers is None:
            return None
        several = ["layer", *(f"acc1_layer{k}" for k in self._layers)]
        return ["acc1", "acc1_se", *(several if len(self._layers) > 1 else []), "seconds"]

    def bind(self, ctx: EvalContext) -> None:
        self.close()  # a second run with the same object starts afresh
        self._layers = self.layer_list(ctx.model.num_layers)
        where = f"TatoebaRetrieval.tatoeba_dir={self.tatoeba_dir!r}"
        try:
            found = retrieval.find_languages(self.tatoeba_dir)
            langs = list(self.languages or found)
            unknown = [l for l in langs if l not in found]
            if unknown:
                raise FileNotFoundError(f"no files for language(s) {', '.join(unknown)} "
                                        f"(found: {', '.join(found)})")
            pairs = [retrieval.read_pair(self.tatoeba_dir, l) for l in langs]
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        self.local = LocalEncoder(ctx, where)
        self._dir, self._languages = self.tatoeba_dir, langs
        self._model_dir = ctx.model_dir
        if self.max_sentences:  # the first lines of each language, in the local directory
            for p in pairs:
                for path, lines in ((p.src_path, p.src), (p.eng_path, p.eng)):
                    with open(os.path.join(self.local.dir, os.path.basename(path)), "w",
                              encoding="utf-8") as f:
                        f.write("".join(f"{s}\n" for s in lines[:self.max_sentences]))
            self._dir = self.local.dir

    def run(self, state_or_params: Any, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.local(state_or_params) as encoder:
            result = retrieval.evaluate(
                encoder, self._dir, self._layers, self._languages, pool=self.pool,
                max_length=self.max_length, batch_size=self.batch_size, step=step)
        scalars = {"acc1": 100.0 * result.average, "acc1_se": 100.0 * result.standard_error}
        if len(self._layers) > 1:
            scalars["layer"] = float(result.reported_layer)
            scalars.update({f"acc1_layer{k}": 100.0 * v for k, v in result.per_layer.items()})
        scalars["seconds"] = time.perf_counter() - t0
        if jax.process_index() == 0:  # every process computed the same result
            md.write_json(result_path(self._model_dir, self.prefix, step),
                          {**result.to_json(), "settings": self.settings()})
        return scalars

    def settings(self) -> dict[str, Any]:
        """What the result file records of how it was scored (the demo compares these with
        its own scoring before it reuses a result)."""
        return retrieval.scoring_settings(
            os.path.abspath(self.tatoeba_dir), self._languages, self.layers, self.pool,
            self.max_sentences, self.max_length, self.batch_size)

    def close(self) -> None:
        if getattr(self, "local", None) is not None:
            self.local.close()
            self.local = None


def result_path(model_dir: str, prefix: str, step: int) -> str:
    """Where `TatoebaRetrieval` writes the whole result of its eval after `step`."""
    return os.path.join(model_dir, "eval", f"{prefix}_step{step}.json")


# ----------------------------------------------------------------------------- transfer probe

class TransferProbe(Evaluator):
    """A zero-shot transfer probe (`evaluation.probe`, which says how the head is fitted):
    a softmax regression on frozen pair embeddings [u, v, |u-v|, u*v] of a sentence-pair task
    in XTREME's layout (`data_dir/{task}/{split}-{lang}.tsv`; the demo's: data_dir
    'tasks/demo_data', task 'pawsx'), fitted on `train_language`'s training pairs and scored
    on each test language, every `every` steps, under the prefix `probe`:

      acc_{lang}  test accuracy (%) per language, the training language's included
      avg         mean over the languages other than the training one (zero-shot transfer);
                  watched (its fall below step 0's warns, `train.health`)
      avg_se      its binomial standard error over the test pairs
      gap         the training language's accuracy minus avg (when it has a test file)
      auc_avg     mean ROC AUC (%) of the head's score over those languages (binary tasks)
      train_acc   accuracy on the training pairs (how well the head fits)
      seconds     the eval's wall time (gather + embed + fit + score)

    `layer` None is the last layer; `languages` None: every test file; `max_train` /
    `max_test`: the first N pairs of a file; `l2` and `steps`: the head's regularisation and
    L-BFGS iterations (our choices: 1e-2 on standardised features, 100)."""

    watched = ("avg",)

    def __init__(self, data_dir: str = "", task: str = "pawsx", every: int = 1000,
                 train_language: str = "en", languages: Sequence[str] | None = None,
                 train_split: str = "train", test_split: str = "test",
                 max_train: int | None = None, max_test: int | None = None,
                 layer: int | None = None, pool: str = "mean", max_length: int | None = None,
                 batch_size: int = 64, l2: float = 1e-2, steps: int = 100,
                 prefix: str = "probe"):
        if not data_dir:
            raise ValueError("TransferProbe.data_dir is not set: the folder holding "
                             f"{task}/{{split}}-{{lang}}.tsv (the demo's: 'tasks/demo_data')")
        if task not in probe.PAIR_TASKS:
            raise ValueError(f"TransferProbe.task={task!r} is invalid: must be one of "
                             f"{', '.join(probe.PAIR_TASKS)}")
        for name, value in (("every", every), ("batch_size", batch_size), ("steps", steps)):
            _check_int("TransferProbe", name, value)
        for name, value in (("max_train", max_train), ("max_test", max_test),
                            ("max_length", max_length)):
            _check_int("TransferProbe", name, value, allow_none=True)
        if pool not in retrieval.POOLS:
            raise ValueError(f"TransferProbe.pool={pool!r} is invalid: must be one of "
                             f"{', '.join(retrieval.POOLS)}")
        if not isinstance(l2, (int, float)) or isinstance(l2, bool) or not l2 > 0:
            raise ValueError(f"TransferProbe.l2={l2!r} is invalid: must be a number > 0")
        self.data_dir, self.task, self.every, self.prefix = data_dir, task, every, prefix
        self.train_language = train_language
        self.languages = None if languages is None else list(languages)
        self.splits, self.limits = (train_split, test_split), (max_train, max_test)
        self.layer, self.pool, self.max_length = layer, pool, max_length
        self.batch_size, self.l2, self.steps = batch_size, float(l2), steps
        self._data: probe.ProbeData | None = None

    def metric_names(self) -> list[str] | None:
        if self._data is None:
            return None
        tested = list(self._data.test)
        return [*(f"acc_{lang}" for lang in tested), "avg", "avg_se",
                *(["gap"] if self.train_language in tested else []),
                *(["auc_avg"] if len(self._data.labels) == 2 else []), "train_acc", "seconds"]

    def bind(self, ctx: EvalContext) -> None:
        self.close()  # a second run with the same object starts afresh
        num_layers = ctx.model.num_layers
        self._layer = num_layers if self.layer is None else self.layer
        if not 0 <= self._layer <= num_layers:
            raise ValueError(f"TransferProbe.layer={self.layer} out of range: valid layers are "
                             f"0..{num_layers} (0 = embeddings)")
        where = f"TransferProbe.data_dir={self.data_dir!r}"
        try:
            self._data = probe.read_probe_data(
                self.data_dir, self.task, self.train_language, self.languages, *self.splits,
                *self.limits)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if ctx.model.num_languages:  # each pair is embedded in its file's language
            table = list(ctx.languages) if ctx.languages else None
            missing = [l for l in [self.train_language, *self._data.test]
                       if table is not None and l not in table]
            if missing:
                raise ValueError(f"{where}: language(s) {', '.join(missing)} are not in the "
                                 "run's language table, which the model's language "
                                 "embeddings need")
        self.local = LocalEncoder(ctx, where)

    def run(self, state_or_params: Any, step: int) -> dict[str, float]:
        del step
        t0 = time.perf_counter()
        with self.local(state_or_params) as encoder:
            result = probe.evaluate(encoder, self._data, self._layer, pool=self.pool,
                                    max_length=self.max_length, batch_size=self.batch_size,
                                    l2=self.l2, steps=self.steps)
        return {**result.scalars(), "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        if getattr(self, "local", None) is not None:
            self.local.close()
            self.local = None
