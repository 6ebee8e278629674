"""Prepared data: a registered task's corpora tokenised once into sharded random-access files,
which every training process reads its own share of (docs/scaling.md, "Multi-host data").

- preparing: `prepare` (the CLI, on Apache Beam), `prepare_worker` (one work unit),
  `corpus_units` (cutting corpus files into units), `prepare_console` (the terminal),
  `prepare_lock` (one preparation at a time per directory);
- the files: `shard_files` (shards, plans, manifests, `CorpusRecords`), `shard_index` (the
  index's header and checks), `remote_reads` (ranged reads on gs:// with retries), `verify`
  (the CLI that checks a preparation);
- reading: `prepared_source` (a prepared corpus as a seqio source, in a global shuffle,
  `index_shuffle`), `choice` (raw or prepared: chosen where a run builds its datasets).

This package keeps the names of the module it replaces (0.2's `xlm_jax.data.prepared`).
"""
from xlm_jax.data.prepared.choice import default_dir, register_from, use
from xlm_jax.data.prepared.prepared_source import (PreparedTask, load_task, record_numbers,
                                                    source)

__all__ = ["PreparedTask", "load_task", "record_numbers", "source", "use", "default_dir",
           "register_from"]
