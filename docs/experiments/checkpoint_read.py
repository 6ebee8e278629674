"""A trainer-shaped state of XLM-R base's shapes, read whole or the encoder alone
(docs/architecture.md, "Reading a checkpoint's encoder").

    python docs/experiments/checkpoint_read.py save DIR     # encoder + Adam's two moments, ~3 GB
    python docs/experiments/checkpoint_read.py whole DIR    # orbax's whole restore
    python docs/experiments/checkpoint_read.py encoder DIR  # model_dir.restore_subtree

Each read prints its seconds, the encoder's bytes and the process's peak RSS.
"""
import resource
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from xlm_jax import model_dir as md
from xlm_jax.convert.weights import expected_shapes
from xlm_jax.models.config import get_config


def random_tree(rng: np.random.Generator) -> dict:
    """XLM-R base's parameter tree (the shapes `convert` checks), random float32."""
    tree: dict = {}
    for name, shape in expected_shapes(get_config("base")).items():
        *parents, leaf = name.split("/")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = rng.standard_normal(shape, np.float32)
    return tree


def main(how: str, path: str) -> None:
    if how == "save":
        rng = np.random.default_rng(0)
        state = {"step": np.int64(1000), "params": {"encoder": random_tree(rng), "objectives": {}},
                 "opt_state": [{"count": np.int32(1000), "mu": random_tree(rng),
                                "nu": random_tree(rng)}]}
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(path, state)
        return
    start = time.perf_counter()
    if how == "whole":
        with ocp.StandardCheckpointer() as ckptr:
            encoder = ckptr.restore(path)["params"]["encoder"]
    else:
        encoder = md.restore_subtree(path, ("params", "encoder"))
    size = sum(np.asarray(x).nbytes for x in jax.tree.leaves(encoder))
    print(f"{how}: {time.perf_counter() - start:.1f} s, encoder {size / 1e9:.2f} GB, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
