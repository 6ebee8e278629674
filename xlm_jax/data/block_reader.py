"""`BlockReader`: block `i` of a shard of a python example generator, read by position.

The file sources (`xlm_jax.data.sources`) read their corpora with python generators, so that
bad UTF-8 can be skipped and counted. `tf.data.Dataset.from_generator` would feed them to
tf.data, but its position cannot be saved. A source built as
`Dataset.counter().map(numpy_function(reader.read))` has no state but the counter, which
tf.data checkpoints with the rest of the pipeline: the input position of a run can then be
saved with its checkpoints and restored in a time that does not grow with the step.
TensorFlow is not imported here.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np


class BlockReader:
    """Block `i` of a shard of a python example generator, read by position.

    `read(i)` returns examples `[i * block, (i + 1) * block)` of shard `index` of `num` (the
    examples whose position is `index` mod `num`), each feature stacked, string vectors
    flattened with their row lengths (`KEY/len`); an empty block past the end. Successive
    calls `read(0), read(1), ...` continue one pass over the generator; any other `i` (a
    restored input position, a concurrent second iterator) starts a new pass and skips `i`
    blocks without building them. So block `i` does not depend on what was read before:
    the tf.data source built on it (`Dataset.counter().map(read)`) has no hidden state
    beyond the counter, which tf.data checkpoints (see `xlm_jax.data.pipeline`).
    """

    def __init__(self, make_examples: Callable[[], Iterator[dict[str, Any]]],
                 signature: dict[str, Any], vector_keys: Sequence[str], index: int, num: int,
                 block: int) -> None:
        self._make, self._vector_keys = make_examples, list(vector_keys)
        self._keys = list(signature)
        self._dtypes = {k: spec.dtype.as_numpy_dtype for k, spec in signature.items()}
        self._index, self._num, self._block = index, num, block
        self._blocks: Optional[Iterator[list[dict[str, Any]]]] = None
        self._next = 0
        self.restarts = 0  # passes started at a block other than 0 (restores, for tests)

    def _pass(self) -> Iterator[list[dict[str, Any]]]:
        buf, total, kept = [], 0, 0
        for i, ex in enumerate(self._make()):
            total += 1
            if i % self._num == self._index:
                buf.append(ex)
                kept += 1
                if len(buf) == self._block:
                    yield buf
                    buf = []
        if not kept and total:
            # Fewer examples than shards (a one-document corpus on a 2-host run): this shard
            # reads example `index mod total` instead of none. An empty member would end a
            # seqio Mixture (`sample_from_datasets(stop_on_empty_dataset=True)`) on this
            # host only, after a few batches; our choice is to let hosts share the example.
            buf = [ex for i, ex in enumerate(self._make()) if i == self._index % total]
        if buf:
            yield buf

    def read(self, i: Any) -> list[Any]:
        i = int(i)
        if self._blocks is None or i != self._next:
            self._blocks = self._pass()
            self.restarts += i > 0
            for _ in range(i):
                if next(self._blocks, None) is None:
                    break
        self._next = i + 1
        return self._flush(next(self._blocks, []))

    def _flush(self, buf: list[dict[str, Any]]) -> list[Any]:
        out, lens = [], []
        for k in self._keys:
            dtype = self._dtypes[k]
            if k in self._vector_keys:
                out.append(np.array([x for ex in buf for x in ex[k]], dtype=dtype))
                lens.append(np.array([len(ex[k]) for ex in buf], dtype=np.int64))
            else:
                out.append(np.array([ex[k] for ex in buf], dtype=dtype))
        return out + lens
