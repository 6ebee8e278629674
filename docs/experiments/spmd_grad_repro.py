"""Minimal reproducer: jit(grad) with out_shardings returns wrong gradients on CPU SPMD.

Why it is here: with the MLM head's d x d projection (`embed_proj`) sharded over `tensor`, the
trainer's gradients were wrong until the head constrained that projection's output
(tests/train/trainer_test.py runs both layouts). This script is the same failure in 20 lines,
without flax or the library, for an upstream report:

    python docs/experiments/spmd_grad_repro.py

w [32, 32] on P('fsdp', 'tensor'), e [256, 32] on P('tensor', 'fsdp'), x [8, 6, 32] with the
batch on ('data', 'fsdp'), loss = sum(logsumexp((x @ w) @ e.T)). The gradient w.r.t. w computed
under jit with `out_shardings=P('fsdp', 'tensor')` differs from the single-device one by as much
as the gradient itself; without `out_shardings`, or with a 2-D x, it matches to 1e-6. Shardy
and GSPMD (`jax_use_shardy_partitioner=False`) give the same wrong numbers (jax 0.10.2, 8 host
CPU devices). Constraining the intermediate `x @ w` to P(('data', 'fsdp'), None, None) with
`jax.lax.with_sharding_constraint` makes it right to 5e-7, which is how the MLM head avoids it.
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
rng = np.random.RandomState(0)
w = rng.normal(0, .2, (32, 32)).astype(np.float32)
e = rng.normal(0, .2, (256, 32)).astype(np.float32)
x = rng.normal(0, 1, (8, 6, 32)).astype(np.float32)


def loss(w, e, x):
    return jax.nn.logsumexp((x @ w) @ e.T, -1).sum()


def spec(*axes):
    return NamedSharding(mesh, P(*axes))


ins = (spec("fsdp", "tensor"), spec("tensor", "fsdp"), spec(("data", "fsdp"), None, None))
ref = np.asarray(jax.jit(jax.grad(loss))(w, e, x))
worst = 0.0
for name, kw in (("without out_shardings", {}),
                 ("with out_shardings", {"out_shardings": spec("fsdp", "tensor")})):
    got = np.asarray(jax.jit(jax.grad(loss), in_shardings=ins, **kw)(w, e, x))
    err = float(np.abs(got - ref).max())
    worst = max(worst, err)
    print(f"jax {jax.__version__}, {name}: max |grad error| {err:.3g} "
          f"(max |grad| {np.abs(ref).max():.3g})")
sys.exit(1 if worst > 1e-4 else 0)  # 1 = the bug is still there
