"""The trainer's batch iterator: registered seqio tasks/mixtures -> numpy batches.

`make_batch_iterator` yields dicts of int32 numpy arrays with the model features of the task's
kind; the feature contract (ids, feature names, kinds, `language_index`) is in
`xlm_jax.data.features`. Importing this module does NOT import TensorFlow or seqio:
`make_batch_iterator` imports TF/seqio (and the seqio-based `registry` and `converters`) only
when it is called.
"""

from __future__ import annotations

import atexit
import os
import weakref
import zlib
from collections.abc import Callable

import numpy as np

from xlm_jax.data.prepared import shard_files as pf

__all__ = ["BatchIterator", "IteratorNotSaveable", "ShardedBatches", "make_batch_iterator",
           "make_sharded_iterator", "position_saved", "process_shards", "STATE_SUFFIX"]


def make_batch_iterator(
    task_or_mixture: str,
    batch_size: int,
    sequence_length: int,
    seed: int,
    shard_index: int = 0,
    num_shards: int = 1,
    start_step: int = 0,
) -> "BatchIterator":
    """Yields an endless, deterministic stream of numpy batches for a registered task/mixture.

    Each batch is a dict of int32 arrays [batch_size, sequence_length] with the features of
    the task's kind (see `xlm_jax.data.features`). The stream depends only on
    (task_or_mixture, batch_size, sequence_length, seed, shard_index, num_shards): two
    processes with the same arguments produce the same batches.

    Resuming, two ways, both exact:
    - `BatchIterator.save(prefix)` writes the tf.data iterator's state (every source's block
      counter, shuffle buffers, sampling and packing state; for prepared data only where
      each op's input stands, a few integers per op) and `restore(prefix)` puts a
      freshly built iterator (same arguments) back there: the time does not grow with the
      position (t5x's dataset checkpointing; `xlm_jax.data.block_reader.BlockReader` makes our
      file sources checkpointable). A user source built on `from_generator` cannot be
      saved: `save` then raises `IteratorNotSaveable`.
    - `start_step=k` builds the same pipeline and skips k batches (`Dataset.skip`): the
      input-pipeline time of k batches, about 30 ms per 32 x 128 batch of `demo_mono` on a
      2-core machine, ~5 minutes per 10k steps; for pipelines that cannot be saved.

    Sharding: host `shard_index` of `num_shards` reads every `num_shards`-th document (or
    sentence pair) of each corpus; the hosts' streams are disjoint.

    The registering module (e.g. `xlm_jax_tasks.demo`) must have been imported. TensorFlow is
    imported here, lazily, and hidden from GPUs so that it does not take accelerator memory.
    """
    for name, value, low in (("batch_size", batch_size, 1), ("sequence_length", sequence_length, 8),
                             ("num_shards", num_shards, 1), ("start_step", start_step, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"make_batch_iterator: {name} must be an int >= {low}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"make_batch_iterator: seed must be an int, got {seed!r}")
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or not (
        0 <= shard_index < num_shards
    ):
        raise ValueError(
            f"make_batch_iterator: shard_index={shard_index!r} must be in "
            f"[0, num_shards={num_shards})"
        )
    ds = _batched_dataset(task_or_mixture, batch_size, sequence_length, seed, shard_index,
                          num_shards)
    if start_step:
        ds = ds.skip(start_step)
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:  # registered after TF's own handlers, so it runs before them
        atexit.register(_close_live_iterators)
        _ATEXIT_REGISTERED = True
    it = BatchIterator(ds, f"{task_or_mixture} (shard {shard_index} of {num_shards})")
    _LIVE.add(it)
    return it


def make_sharded_iterator(task_or_mixture: str, global_batch: int, sequence_length: int,
                          seed: int, process_index: int, process_count: int,
                          input_shards: int, start_step: int = 0) -> "ShardedBatches":
    """Process `process_index` of `process_count`'s rows of an endless stream of global
    batches read as `input_shards` input shards.

    Input shard v of V is `make_batch_iterator(..., global_batch // V rows, shard_index=v,
    num_shards=V)`: what one process of a V-process run reads. Row block v of every global
    batch comes from shard v, and process p reads shards p*V/P .. (p+1)*V/P - 1, its rows of
    the global batch in order. So the global sequence depends on V, never on P: a run saved
    by P processes resumes exactly on any P' that divides V (each shard's position is saved
    on its own, `ShardedBatches.save`). With V = P (the trainer's default) every process
    reads one shard, as before input shards existed; a larger V costs each process V/P
    pipelines (their threads and buffers) for the freedom to change P.
    Raises ValueError (one line) when P does not divide V or V does not divide the batch."""
    shards = process_shards(process_index, process_count, input_shards)
    if global_batch % input_shards:
        raise ValueError(f"a global batch of {global_batch} rows cannot be read as "
                         f"{input_shards} input shards of equal rows; choose input_shards "
                         f"dividing {global_batch}")
    return ShardedBatches(
        {v: make_batch_iterator(task_or_mixture, global_batch // input_shards, sequence_length,
                                seed, shard_index=v, num_shards=input_shards,
                                start_step=start_step) for v in shards}, input_shards)


def process_shards(process_index: int, process_count: int, input_shards: int) -> range:
    """The input shards process `process_index` of `process_count` reads, in row order:
    p*V/P .. (p+1)*V/P - 1. Raises ValueError (one line) when P does not divide V."""
    if input_shards < 1 or input_shards % process_count:
        raise ValueError(f"input_shards={input_shards} must be a multiple of the {process_count} "
                         "processes (each process reads input_shards / processes of them)")
    per = input_shards // process_count
    return range(process_index * per, (process_index + 1) * per)


class ShardedBatches:
    """Batches whose rows are those of several input shards' iterators, side by side in shard
    order (`make_sharded_iterator`); saved and restored shard by shard."""

    def __init__(self, iterators: "dict[int, BatchIterator]", count: int) -> None:
        self.iterators, self.count = dict(iterators), count

    @property
    def shards(self) -> tuple[int, ...]:
        """The input shards this process reads, in row order."""
        return tuple(self.iterators)

    def __iter__(self) -> "ShardedBatches":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        parts = [next(it) for it in self.iterators.values()]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def save(self, prefix_of: Callable[[int], str]) -> None:
        """Writes each shard's position under `prefix_of(shard)` (`BatchIterator.save`)."""
        for v, it in self.iterators.items():
            it.save(prefix_of(v))

    def restore(self, prefix_of: Callable[[int], str]) -> None:
        """Moves each freshly built shard to the position under `prefix_of(shard)`."""
        for v, it in self.iterators.items():
            it.restore(prefix_of(v))

    def close(self) -> None:
        for it in self.iterators.values():
            it.close()


STATE_SUFFIX = ".tfdata.zz"  # a saved position: PREFIX + this (`BatchIterator.save`)
_STATE_KEY = "_STATE"  # the one tensor of a tf.data iterator's saved state


def position_saved(prefix: str) -> bool:
    """Whether a position was saved under `prefix`, in this form or the earlier one
    (`tf.train.Checkpoint` files, `PREFIX.index`)."""
    from etils import epath  # pylint: disable=g-import-not-at-top

    return any(epath.Path(prefix + suffix).exists() for suffix in (STATE_SUFFIX, ".index"))


class IteratorNotSaveable(Exception):
    """The pipeline has a part whose position tf.data cannot save (e.g. `from_generator`)."""


class BatchIterator:
    """Numpy batches of a tf.data pipeline, with its position saveable (`save`/`restore`)."""

    def __init__(self, dataset, name: str) -> None:
        self.name = name
        self._it = iter(dataset)

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._it is None:
            raise StopIteration
        batch = next(self._it)
        return {k: np.asarray(v, dtype=np.int32) for k, v in batch.items()}

    def save(self, prefix: str) -> str:
        """Writes the iterator's position to `PREFIX.tfdata.zz` (`prefix` a local or `gs://`
        path prefix; returns `prefix`): tf.data's serialized iterator state, zlib-compressed.

        Our choice over `tf.train.Checkpoint` files (`PREFIX.index`, `PREFIX.data-*`, which
        `restore` still reads): the state is mostly the ops' key names, repeated for every
        Task of a mixture, and compresses ~40x (a symbolic position of the 77-Task demo
        mixture: 398 KB -> 9.6 KB). It goes through the iterator's own
        `_serialize_to_tensors`, which `tf.train.Checkpoint` calls too (a private TF method)."""
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        try:
            state = self._it._serialize_to_tensors()  # pylint: disable=protected-access
            data = {k: tf.io.serialize_tensor(v).numpy() for k, v in state.items()}
        except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError) as e:
            first = str(e).strip().splitlines()[0]
            raise IteratorNotSaveable(f"{self.name}: {first}") from None
        if set(data) != {_STATE_KEY}:
            raise IteratorNotSaveable(f"{self.name}: an iterator state of {sorted(data)}")
        # whole or not at all: a temporary name, then a rename
        pf.makedirs(os.path.dirname(prefix))
        pf.write_atomic(prefix + STATE_SUFFIX, zlib.compress(data[_STATE_KEY], 6))
        return prefix

    def restore(self, prefix: str) -> None:
        """Moves a freshly built iterator (same task and arguments) to the saved position
        (`PREFIX.tfdata.zz`, or the `tf.train.Checkpoint` files of earlier versions)."""
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        from etils import epath  # pylint: disable=g-import-not-at-top

        try:
            packed = epath.Path(prefix + STATE_SUFFIX)
            if packed.exists():
                state = tf.io.parse_tensor(zlib.decompress(packed.read_bytes()), tf.variant)
                self._it._restore_from_tensors({_STATE_KEY: state})  # pylint: disable=protected-access
            else:
                tf.train.Checkpoint(iterator=self._it).read(prefix).assert_consumed()
        except (tf.errors.OpError, AssertionError, ValueError, zlib.error) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{prefix}: cannot restore the input position of {self.name} "
                             f"(was it saved by a run with other tasks, batch size or "
                             f"sequence length?): {first}") from None

    def close(self) -> None:
        self._it = None


# Open iterators, closed at exit: a tf.data iterator whose pipeline calls back into python
# (numpy_function, from_generator) can deadlock if it is first destroyed during interpreter
# finalization, when its worker threads can no longer take the GIL.
_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def _close_live_iterators() -> None:
    for it in list(_LIVE):
        it.close()


def _batched_dataset(name: str, batch_size: int, sequence_length: int, seed: int,
                     shard_index: int, num_shards: int):
    """The batched tf.data pipeline behind `make_batch_iterator` (imports TF and seqio)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    try:  # keep TF off the accelerators: JAX owns them
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # already initialised; nothing to do
        pass
    # Grappler re-optimizes every tf.data function whenever an iterator instantiates it: about
    # ten functions per Task, so a 77-task mixture ran ~800 optimizations before its first
    # batches (a quarter to a third of that start-up's CPU time), for no measurable gain on
    # these small functions. It is turned off process-wide (TF only serves the input pipeline
    # here). Like the device list above, TF reads it when its eager context starts (normally
    # at the first pipeline of a process) and ignores later changes. Batches do not depend on it.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.data import converters, registry  # pylint: disable=g-import-not-at-top

    provider = registry.get_provider(name)
    kind = registry.provider_kind(provider)
    shard_info = seqio.ShardInfo(shard_index, num_shards) if num_shards > 1 else None
    ds = seqio.get_dataset(
        provider,
        task_feature_lengths=converters.task_feature_lengths(kind, sequence_length),
        feature_converter=kind.converter(),
        dataset_split="train",
        shuffle=True,
        num_epochs=None,
        shard_info=shard_info,
        seed=seed,
        batch_size=batch_size,
        verbose=False,
    )
    options = tf.data.Options()
    options.deterministic = True
    # The autotuner's model has a node per dataset op of every Task (~1000 for a 77-task
    # mixture) and re-optimizes it in the background, most often during the start-up, where it
    # took about a quarter of the CPU time. Without it, AUTOTUNE maps use a fixed parallelism
    # (the core count, at most 16); the steady-state throughput of the demo mixtures measured
    # the same or better. Batches do not depend on it (`deterministic`).
    options.autotune.enabled = False
    # The file sources call python (`BlockReader.read` in a numpy_function) with the block
    # number as their only input; tf.data cannot see that they are pure functions of it
    # and would refuse to checkpoint them. Their state is the counter, which is saved.
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
    # Prepared data (every Task reads a prepared corpus: no shuffle buffer, sources that read
    # block b as a pure function of b) saves its position symbolically: each dataset op saves
    # where its input stood for the next element it returns, not the elements it holds, and a
    # restore reads those again. The state is a few integers per op (12 KB for a two-language
    # mixture at 32 x 64 against 1.39 MB with the elements); raw files keep the full state (a
    # small raw Task is cached in memory by seqio, which tf.data cannot save symbolically).
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    options.experimental_symbolic_checkpoint = all(registry.prepared_root(t) for t in tasks)
    return ds.with_options(options)
