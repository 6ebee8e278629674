"""One process of a multi-process read of a prepared task, for
tests/data/prepared_processes_test.py:

  python tests/testlib/prepared_reader.py --corpus ROOT --prepared DIR --task T --out F.npz
      [--coordinator localhost:PORT --num_processes 2 --process_id I]
      [--steps 6] [--save_at 3 --state_dir D [--park_after_save]] [--restore_at 3]
      [--input_shards V]

Joins `jax.distributed` when asked, registers the corpus's tasks over the prepared directory
the way the trainer does (`train.streams.import_modules`), and reads as the trainer reads:
`train.streams.make_stream` (process index and count from jax; V input shards, by default one
per process), positions saved and restored at the trainer's paths (`train.data_state.prefix`,
one per input shard). Writes to F.npz the documents its
process's source gives first (`docs`, `doc_lengths`) and every batch it read (`step_S_KEY`).
After a save it writes F.npz.saved; `--park_after_save` then sleeps, for the test to SIGKILL every process at once
(a process that killed itself would make jax's coordination service abort the others, maybe
before they saved).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SEED, GLOBAL_BATCH, SEQ_LEN, DOCS = 11, 8, 32, 24


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--corpus", "--prepared", "--task", "--out", "--state_dir"):
        ap.add_argument(flag)
    ap.add_argument("--coordinator")
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save_at", type=int, default=0)
    ap.add_argument("--restore_at", type=int, default=0)
    ap.add_argument("--input_shards", type=int)
    ap.add_argument("--park_after_save", action="store_true")
    args = ap.parse_args()

    import jax  # pylint: disable=g-import-not-at-top

    if args.num_processes > 1:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    sys.path.insert(0, args.corpus)
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.train import data_state, streams  # pylint: disable=g-import-not-at-top

    streams.import_modules(["prep_tasks"], args.prepared, [args.task])
    p, n = jax.process_index(), jax.process_count()
    out: dict[str, np.ndarray] = {}
    member = seqio.TaskRegistry.get(seqio.MixtureRegistry.get(args.task).tasks[0].name
                                    if args.task in seqio.MixtureRegistry.names() else args.task)
    docs = member.source.get_dataset(shuffle=True, seed=SEED,
                                     shard_info=seqio.ShardInfo(p, n)).take(DOCS)
    tokens = [d["tokens"] for d in docs.as_numpy_iterator()]
    out["docs"], out["doc_lengths"] = np.concatenate(tokens), np.array([len(t) for t in tokens])
    out["process"] = np.array([p, n])

    stream = streams.make_stream(args.task, GLOBAL_BATCH, SEQ_LEN, SEED, 0, 8002,
                                 input_shards=args.input_shards)
    shards = args.input_shards or n
    out["shards"] = np.array(stream.shards)
    start = 0
    if args.restore_at:
        stream.restore(lambda v: data_state.prefix(args.state_dir, args.restore_at, "mlm", v,
                                                   shards))
        start = args.restore_at
    for step in range(start, args.steps):
        for key, value in next(stream).items():
            out[f"step_{step}_{key}"] = value
        if args.save_at == step + 1:
            stream.save(lambda v: data_state.prefix(args.state_dir, step + 1, "mlm", v, shards))
            with open(args.out + ".saved", "w"):  # the save has returned
                pass
            while args.park_after_save:
                time.sleep(60)
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()
