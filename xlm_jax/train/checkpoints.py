"""Checkpoints: a thin wrapper over orbax `CheckpointManager`.

What: `Checkpointer(model_dir, cfg)` saves the train state (any pytree of arrays, e.g.
a flax struct TrainState with params and optimizer state) plus a small JSON `extra`
(data-pipeline position, config fingerprint, ...) under `model_dir/checkpoints/<step>/`,
keeps the newest `keep` (and, with `keep_best`, the best by an eval metric beside them),
and restores onto whatever shardings the caller asks for.

Why this way: orbax writes each array shard from the process that owns it (multi-host
safe, async), and `StandardRestore` with an abstract target of `jax.ShapeDtypeStruct`s
carrying `.sharding` reshards on load, so a run saved on 8 devices restores onto 4 or
64 (the restore-cannot-change-device-count complaint of orbax#648 does not apply).
Before restoring, `check_compatible` compares the saved shapes with the model's and
fails with one line naming the parameter, instead of an opaque tensorstore error.
Every process must call `save`/`restore` (orbax coordinates them); no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from xlm_jax import model_dir as md
from xlm_jax.models import layer_stack
from xlm_jax.train.optim import param_path_names

PyTree = Any

_MAX_LISTED = 3
BEST_MODES = ("max", "min")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When and how many checkpoints to write; validated on creation."""

    # Save when step % save_every_steps == 0 (step > 0); `save(..., force=True)` overrides.
    save_every_steps: int = 1000
    # Keep the newest `keep` checkpoints; older ones are deleted after a successful save.
    keep: int = 3
    # Write in a background thread (training continues once arrays are copied to host).
    async_save: bool = True
    # Beside the newest `keep`, also keep the `keep_best` checkpoints with the best
    # `best_metric` (an eval metric handed to `save(..., metrics=)`: a scalar of one of the
    # trainer's evaluators, "retrieval/acc1" = mean Tatoeba acc@1 in %; `train.evaluators`).
    # best_mode "max": higher is better, "min": lower. 0 = keep-last-N only. A checkpoint
    # saved without the metric is kept only while it is among the newest `keep`.
    keep_best: int = 0
    best_metric: str = "retrieval/acc1"
    best_mode: str = "max"

    def __post_init__(self) -> None:
        for name, low in (("save_every_steps", 1), ("keep", 1), ("keep_best", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"CheckpointConfig.{name}={value!r} is invalid: must be an "
                                 f"integer >= {low}")
        if self.best_mode not in BEST_MODES:
            raise ValueError(f"CheckpointConfig.best_mode={self.best_mode!r} is invalid: must "
                             f"be one of {', '.join(BEST_MODES)}")
        if not self.best_metric or not isinstance(self.best_metric, str):
            raise ValueError(f"CheckpointConfig.best_metric={self.best_metric!r} is invalid: "
                             "must be a metric name such as 'retrieval/acc1'")


def preservation_policy(cfg: CheckpointConfig) -> Any:
    """What orbax keeps after each save: the newest `keep` (`LatestN`), plus with
    `keep_best` the best `keep_best` of the checkpoints saved with metrics (`BestN`; those
    saved without are left to `LatestN`), whichever keeps a step (`AnyPreservationPolicy`)."""
    policies = [ocp.checkpoint_managers.LatestN(n=cfg.keep)]
    if cfg.keep_best:
        policies.append(ocp.checkpoint_managers.BestN(
            get_metric_fn=_metric_fn(cfg.best_metric), reverse=cfg.best_mode == "min",
            n=cfg.keep_best, keep_checkpoints_without_metrics=False))
    return ocp.checkpoint_managers.AnyPreservationPolicy(policies)


def _metric_fn(name: str) -> Any:
    def metric(metrics: dict) -> float:
        return float(metrics[name])

    return metric


def _flat_shapes(tree: PyTree) -> dict[str, tuple[int, ...]]:
    """{'params/layers_0/attention/query/kernel': shape} for every leaf of a pytree.

    Works on model states (GetAttrKey for dataclasses/namedtuples) and on orbax
    metadata trees (DictKey/SequenceKey) alike, because only the names are kept.
    """
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out["/".join(param_path_names(path))] = tuple(getattr(leaf, "shape", np.shape(leaf)))
    return out


def check_compatible(saved_metadata_tree: PyTree, abstract_state: PyTree, *,
                     directory: str = "", step: int | None = None) -> None:
    """Raise a one-line ValueError if the checkpoint's tree does not fit the model's.

    Names the first problems: a parameter whose shape differs ("has shape (8, 2, 4) but
    the model expects (8, 4, 2)"), one the model expects but the checkpoint lacks, or one
    the checkpoint has but the model does not. dtypes may differ (orbax casts on load).
    """
    saved = _flat_shapes(saved_metadata_tree)
    want = _flat_shapes(abstract_state)
    where = f"checkpoint {directory or '<unknown dir>'} step {step}"
    if (any(k.startswith("params/embeddings/") for k in saved)
            and any(k.startswith("params/encoder/") for k in want)):
        raise ValueError(
            f"{where} was written before parameters were split into {{encoder, objectives}} "
            "(objective-owned modules); a run cannot resume across that change. Start a new "
            "model_dir with loop.train.init_from set to this model_dir: it loads the encoder "
            "weights (the optimizer and objective state start afresh)")
    saved_layout, want_layout = layer_stack.names_layout(saved), layer_stack.names_layout(want)
    if None not in (saved_layout, want_layout) and saved_layout != want_layout:
        # The optimizer state mirrors the parameters, so a resume would convert it too; a new
        # run from the weights is the supported way across layouts.
        raise layer_stack.layout_error(
            saved_layout, want_layout, where,
            f"resume with ModelConfig.scan_layers={saved_layout}, or start a new model_dir "
            "with loop.train.init_from set to this model_dir: it loads the encoder weights in "
            "either layout (the optimizer and objective state start afresh)")
    problems = []
    for name, shape in want.items():
        if name not in saved:
            problems.append(f"parameter '{name}' {shape} is missing from the checkpoint")
        elif tuple(saved[name]) != tuple(shape):
            problems.append(f"parameter '{name}' has shape {tuple(saved[name])} but the model "
                            f"expects {tuple(shape)}")
    for name in saved:
        if name not in want:
            problems.append(f"parameter '{name}' {tuple(saved[name])} is in the checkpoint but "
                            "not in the model")
    if problems:
        shown = "; ".join(problems[:_MAX_LISTED])
        more = (f"; and {len(problems) - _MAX_LISTED} more problem(s)"
                if len(problems) > _MAX_LISTED else "")
        raise ValueError(f"{where}: {shown}{more}")


def _as_abstract(tree: PyTree) -> PyTree:
    """Arrays -> ShapeDtypeStruct with their sharding; ShapeDtypeStructs must have one."""

    def visit(path, x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
            name = "/".join(param_path_names(path))
            raise ValueError(f"restore: abstract_state leaf '{name}' {x.shape} has no sharding; "
                             "build it with jax.ShapeDtypeStruct(shape, dtype, sharding=...)")
        return x

    return jax.tree_util.tree_map_with_path(visit, tree)


class Checkpointer:
    """Save/restore train state + JSON extra under `model_dir/checkpoints` (orbax)."""

    def __init__(self, model_dir: str, cfg: CheckpointConfig = CheckpointConfig(),
                 defer_create: bool = False):
        """`defer_create`: `checkpoints/` is created at the first save (or preemption query)
        instead of now, so that a run refused later in its set-up leaves the model directory
        as it found it (the trainer's choice, `train.run_dir`); writability is still checked
        now, by a probe file written into and removed from `checkpoints/` where it exists,
        else `model_dir` (created when missing)."""
        self.cfg = cfg
        self.directory = md.checkpoints_dir(model_dir)
        self._manager: Any = None
        if not defer_create:
            md.check_writable(self.directory, "checkpoints")  # local or gs://: fails now
            self._manager = self._open()
        elif md.resolve(self.directory).exists():
            md.check_writable(self.directory, "checkpoints")
        else:
            md.check_writable(model_dir, "model_dir")  # creates only a missing model_dir

    def _open(self) -> Any:
        # `preservation_policy` keeps latest-N and best-N side by side (orbax's `max_to_keep`
        # with `best_fn` would keep only the best N, dropping the latest one resume needs);
        # `best_fn` is still set so that orbax writes and reads the metrics of each step.
        cfg = self.cfg
        options = ocp.CheckpointManagerOptions(
            preservation_policy=preservation_policy(cfg),
            best_fn=_metric_fn(cfg.best_metric) if cfg.keep_best else None,
            best_mode=cfg.best_mode,
            save_interval_steps=1,  # the decision is ours (should_save); orbax just writes
            enable_async_checkpointing=cfg.async_save,
            create=True,
        )
        # Handlers are named up front so that a fresh process (a resumed run) can read the
        # metadata of checkpoints it did not write; with bare item names it reads none.
        return ocp.CheckpointManager(
            epath.Path(self.directory), options=options,
            item_handlers={md.STATE_ITEM: ocp.StandardCheckpointHandler(),
                           md.EXTRA_ITEM: ocp.JsonCheckpointHandler()})

    @property
    def manager(self) -> Any:
        """The orbax `CheckpointManager`, opened (and `checkpoints/` created) on first use."""
        if self._manager is None:
            self._manager = self._open()
        return self._manager

    def _unopened_and_absent(self) -> bool:
        return self._manager is None and not md.resolve(self.directory).exists()

    def should_save(self, step: int) -> bool:
        """True at every `save_every_steps`-th step (never at step 0)."""
        return step > 0 and step % self.cfg.save_every_steps == 0

    def save(self, step: int, state: PyTree, extra: dict | None = None,
             force: bool = False, metrics: dict[str, float] | None = None) -> bool:
        """Save if `should_save(step)` or `force`; returns whether a save was started.

        A step that is already on disk is not written again (returns False), so a final
        forced save right after a periodic one is harmless. With async_save the write
        finishes in the background; `wait()` blocks until it is durable. `metrics` (the
        eval scalars of this very step, with `cfg.best_metric` among them) rank the
        checkpoint for `keep_best`; without them it is kept only as one of the newest.
        """
        step = int(step)
        if not (force or self.should_save(step)):
            return False
        if step in self.manager.all_steps():
            return False
        extra = {} if extra is None else extra
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint step {step}: extra is not JSON-serialisable ({e})"
                             ) from None
        if not self.cfg.keep_best:
            metrics = None
        elif metrics is not None:
            if self.cfg.best_metric not in metrics:
                raise ValueError(f"checkpoint step {step}: metrics {sorted(metrics)} lack "
                                 f"CheckpointConfig.best_metric={self.cfg.best_metric!r}")
            metrics = {k: float(v) for k, v in metrics.items()}
        return bool(self.manager.save(
            step,
            args=ocp.args.Composite(**{md.STATE_ITEM: ocp.args.StandardSave(state),
                                       md.EXTRA_ITEM: ocp.args.JsonSave(extra)}),
            metrics=metrics, force=True))

    def latest_step(self) -> int | None:
        """The newest finished checkpoint step, or None if there is none."""
        if self._unopened_and_absent():
            return None
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """All finished checkpoint steps, ascending."""
        if self._unopened_and_absent():
            return []
        return sorted(self.manager.all_steps())

    def best_step(self) -> int | None:
        """The finished step with the best `best_metric` (None when no checkpoint has
        metrics); without `keep_best`, the latest step."""
        if not self.cfg.keep_best:
            return self.latest_step()
        scored = {s: m for s in self.all_steps()
                  if (m := self.manager.metrics(s)) is not None and self.cfg.best_metric in m}
        if not scored:
            return None
        sign = 1.0 if self.cfg.best_mode == "max" else -1.0
        return max(scored, key=lambda s: (sign * float(scored[s][self.cfg.best_metric]), -s))

    def reached_preemption(self, step: int) -> bool:
        """True when the job is being preempted (TPU/GKE signal): save now and exit."""
        return bool(self.manager.reached_preemption(step))

    def restore(self, step: int | None, abstract_state: PyTree) -> tuple[PyTree, dict]:
        """Restore (state, extra) from `step` (None = latest) onto `abstract_state`.

        `abstract_state` is a pytree of `jax.ShapeDtypeStruct` with `.sharding` (e.g.
        `jax.eval_shape` of the init + the shardings of the current mesh); each array is
        loaded directly into that sharding, whatever mesh/device count it was saved from.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint to restore in {self.directory}")
        step = int(step)
        available = self.all_steps()
        if step not in available:
            raise FileNotFoundError(f"checkpoint {self.directory} has no step {step}; "
                                    f"available steps: {available or 'none'}")
        abstract = _as_abstract(abstract_state)
        metadata = self.manager.item_metadata(step)
        check_compatible(metadata[md.STATE_ITEM], abstract, directory=self.directory, step=step)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(**{md.STATE_ITEM: ocp.args.StandardRestore(abstract),
                                       md.EXTRA_ITEM: ocp.args.JsonRestore()}))
        return restored[md.STATE_ITEM], dict(restored[md.EXTRA_ITEM] or {})

    def wait(self) -> None:
        """Block until any background save has finished (call before exiting)."""
        if self._manager is not None:
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release orbax's threads."""
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
