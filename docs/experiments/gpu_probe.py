"""One exploratory pass on a GPU host: where a base step's time goes, and what the
alternatives of issue "speed on the chip" cost there, measured part by part.

Run on the GPU host from the repository root (docs/performance.md, "GPU"):

    python docs/experiments/gpu_probe.py --out OUT --deadline_s 360

Parts, in order of value, each printed (and appended to OUT/probe.jsonl) as it finishes; a part
that would start after the deadline is skipped:
  env      versions, device, nvidia-smi
  matmul   the 8192^3 bf16 product (the ceiling the MFU is read against)
  dropout  one hidden-dropout application on [32, 512, 768] bf16, by mask generator
  attn     attention forward + backward at [32, 512, 12, 64] bf16, by backend / block size
  step     `bench` on runs/xlmr_base_mmlm.gin at 32 x 512 with a profile trace and the
           optimised HLO dumped (both copied to OUT for reading on a CPU)
  xlme     XLM-E's base step: trace, lower, compile and first step timed apart
  variants the base step with every dropout off and cuDNN attention; at batch 64
On a CPU it runs with tiny shapes (--tiny) so that the script itself can be tested.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback

T0 = time.perf_counter()


def _emit(out: str, part: str, **row) -> None:
    row = {"part": part, "t_s": round(time.perf_counter() - T0, 1), **row}
    print(json.dumps(row), flush=True)
    with open(os.path.join(out, "probe.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _time(fn, *args, iters: int = 10) -> float:
    """Median ms of `fn(*args)` after one warm-up call (compile excluded)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def part_env(out: str, tiny: bool) -> None:
    import jax
    import jaxlib

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.sm,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True) \
        if shutil.which("nvidia-smi") else None
    _emit(out, "env", jax=jax.__version__, jaxlib=jaxlib.__version__,
          devices=[str(d) for d in jax.devices()], kind=jax.devices()[0].device_kind,
          smi=smi.stdout.strip() if smi else None, python=sys.version.split()[0])


def part_matmul(out: str, tiny: bool) -> None:
    import jax
    import jax.numpy as jnp

    n = 512 if tiny else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    ms = _time(jax.jit(jnp.matmul), a, b)
    _emit(out, "matmul", n=n, ms=ms, tflops=2 * n ** 3 / ms / 1e9)


def _hash_keep(seed, shape, keep_prob):
    """Counter-hash dropout bits (attention_dropout's fmix chain) over row and flat index."""
    import jax.numpy as jnp

    from xlm_jax.models import attention_dropout as ad

    b = shape[0]
    rows = jnp.arange(b, dtype=jnp.int32).reshape((b,) + (1,) * (len(shape) - 1))
    n = 1
    for s in shape[1:]:
        n *= s
    idx = jnp.arange(n, dtype=jnp.int32).reshape((1,) + shape[1:])
    h = ad.fmix(seed ^ ad.fmix(rows * ad._GOLDEN + 1))
    h = ad.fmix(h + idx * ad._M2)
    return (h & ((1 << 24) - 1)) < int(keep_prob * (1 << 24))


def part_dropout(out: str, tiny: bool) -> None:
    import jax
    import jax.numpy as jnp

    from xlm_jax.models import common

    shape = (4, 64, 32) if tiny else (32, 512, 768)
    x = jax.random.normal(jax.random.key(0), shape, jnp.bfloat16)
    rows = jnp.arange(shape[0], dtype=jnp.int32)
    kp = 0.9

    def apply(keep, x):
        return jax.lax.select(keep, x / kp, jnp.zeros_like(x))

    variants = {
        "threefry per-row (keep_mask, today)": lambda k, x: apply(
            common.keep_mask(k, kp, x.shape, rows), x),
        "threefry whole": lambda k, x: apply(jax.random.bernoulli(k, kp, x.shape), x),
        "counter hash per-row": lambda k, x: apply(_hash_keep(jnp.int32(7), x.shape, kp), x),
    }
    keys = {"threefry per-row (keep_mask, today)": jax.random.key(1),
            "threefry whole": jax.random.key(1),
            "counter hash per-row": jax.random.key(1)}
    for impl in ("rbg", "unsafe_rbg"):
        variants[f"{impl} per-row"] = lambda k, x: apply(common.keep_mask(k, kp, x.shape, rows), x)
        variants[f"{impl} whole"] = lambda k, x: apply(jax.random.bernoulli(k, kp, x.shape), x)
        keys[f"{impl} per-row"] = keys[f"{impl} whole"] = jax.random.key(1, impl=impl)
    base = _time(jax.jit(lambda x: x * 2), x)
    for name, fn in variants.items():
        try:
            ms = _time(jax.jit(fn), keys[name], x)
            _emit(out, "dropout", variant=name, shape=list(shape), ms=ms,
                  bytes_floor_ms=base)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            _emit(out, "dropout", variant=name, error=f"{type(e).__name__}: {e}"[:300])


def part_attn(out: str, tiny: bool) -> None:
    import jax
    import jax.numpy as jnp

    from xlm_jax.models import attention, fused_attention

    b, t, h, d = (2, 128, 2, 64) if tiny else (32, 512, 12, 64)
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.random.normal(kk, (b, t, h, d), jnp.bfloat16) for kk in ks[:3])
    flops = 4 * b * h * t * t * d * 3.5  # fwd 2 matmuls + bwd 5 (recompute) ~ 3.5x fwd

    def loss_of(call):
        def f(q, k, v):
            return jnp.sum(call(q, k, v).astype(jnp.float32))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    cases = []
    for rate in (0.1, 0.0):
        cases.append((f"xla rate={rate}", lambda q, k, v, r=rate: attention.dot_product_attention(
            q, k, v, backend="xla", dropout_rate=r, dropout_rng=jax.random.key(3),
            deterministic=r == 0)))
    if not tiny:
        cases.append(("cudnn rate=0", lambda q, k, v: attention.dot_product_attention(
            q, k, v, backend="cudnn")))
    for bq, bk, warps, stages in ((128, 128, 4, 2), (64, 64, 4, 2), (128, 64, 4, 2),
                                  (64, 128, 4, 2), (128, 128, 8, 2), (64, 64, 4, 3),
                                  (128, 64, 8, 3)):
        for rate in (0.1, 0.0):
            if tiny and (bq, bk, warps, stages) != (64, 64, 4, 2):
                continue
            cases.append((f"pallas bq={bq} bk={bk} warps={warps} stages={stages} rate={rate}",
                          (bq, bk, warps, stages, rate)))
    for name, call in cases:
        try:
            if isinstance(call, tuple):
                bq, bk, warps, stages, rate = call
                launch = fused_attention.KernelLaunch.uniform(
                    fused_attention.Launch(bq, bk, warps, stages))
                fn = loss_of(lambda q, k, v, launch=launch, rate=rate:
                             fused_attention.flash_attention(
                                 q, k, v, dropout_rate=rate,
                                 dropout_rng=jax.random.key(3) if rate else None,
                                 launch=launch))
            else:
                fn = loss_of(call)
            ms = _time(fn, q, k, v, iters=3 if tiny else 10)
            _emit(out, "attn", variant=name, shape=[b, t, h, d], ms=ms,
                  tflops=flops / ms / 1e9)
        except Exception as e:  # noqa: BLE001
            _emit(out, "attn", variant=name, error=f"{type(e).__name__}: {e}"[:300])


def _slow_compile_line(line: str) -> bool:
    """A JAX_LOG_COMPILES line ("Finished ... in X sec") of a phase that took a second or more."""
    m = re.search(r"Finished (.*) in ([0-9.]+) sec", line)
    return bool(m) and float(m.group(2)) >= 1.0


HARD_STOP_S = 400.0  # set by --hard_stop_s: no child runs past it


def _bench(out: str, part: str, args: list[str], env: dict[str, str] | None = None,
           timeout: float = 240) -> str:
    timeout = max(10.0, min(timeout, HARD_STOP_S - (time.perf_counter() - T0)))
    cmd = [sys.executable, "-m", "xlm_jax.accelerator.bench", *args]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        text = p.stdout + p.stderr
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        text = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")) \
            + ((e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or ""))
        rc = "timeout"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if ln.startswith(("xlm_jax", "device", "note", "profile", "  ",
                                                 "error", "Traceback")) or "Error" in ln
            or _slow_compile_line(ln)]
    _emit(out, part, args=args, env=env or {}, rc=rc, wall_s=round(time.perf_counter() - t, 1),
          lines=keep[-60:])
    with open(os.path.join(out, f"{part}.log"), "a") as f:
        f.write(" ".join(args) + "\n" + text + "\n")
    return text


def part_step(out: str, tiny: bool) -> None:
    dump = "/tmp/xla_dump"
    prof = "/tmp/probe_prof"
    shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(prof, ignore_errors=True)
    size = ["--gin.SIZE='tiny'", "--gin.loop.model_config.dtype='float32'"] if tiny else []
    shape = ["--batch_size", "4", "--seq_len", "64"] if tiny else \
        ["--batch_size", "32", "--seq_len", "512"]
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text" \
        " --xla_dump_hlo_module_re=.*train.*"
    _bench(out, "step", ["--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "5", *shape,
                         "--no_torch", "--profile_dir", prof, *size],
           env={"XLA_FLAGS": flags.strip()})
    traces = glob.glob(os.path.join(prof, "plugins", "profile", "*", "*.xplane.pb"))
    for i, tr in enumerate(traces[:2]):
        with open(tr, "rb") as src, gzip.open(os.path.join(out, f"step_{i}.xplane.pb.gz"),
                                              "wb") as dst:
            shutil.copyfileobj(src, dst)
    hlo = sorted(glob.glob(os.path.join(dump, "*after_optimizations.txt")),
                 key=os.path.getsize, reverse=True)[:3]
    extra = sorted(glob.glob(os.path.join(dump, "*after_optimizations*buffer-assignment*")),
                   key=os.path.getsize, reverse=True)[:1]
    with tarfile.open(os.path.join(out, "step_hlo.tar.gz"), "w:gz") as tf:
        for f in hlo + extra:
            tf.add(f, arcname=os.path.basename(f))
    _emit(out, "step-files", traces=[os.path.getsize(t) for t in traces], hlo=hlo)


def part_xlme(out: str, tiny: bool) -> None:
    size = ["--gin.SIZE='tiny'", "--gin.loop.model_config.dtype='float32'"] if tiny else []
    shape = ["--batch_size", "4", "--seq_len", "64"] if tiny else \
        ["--batch_size", "32", "--seq_len", "512"]
    _bench(out, "xlme", ["--gin_file=runs/xlme_base.gin", "--steps", "3", *shape, "--no_torch",
                         *size], env={"JAX_LOG_COMPILES": "1"}, timeout=170)


def part_variants(out: str, tiny: bool) -> None:
    if tiny:
        return
    base = ["--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "5", "--seq_len", "512", "--no_torch"]
    _bench(out, "variants", [*base, "--batch_size", "32", "--gin.loop.model_config.overrides="
                             "{'attention_backend': 'cudnn', 'attention_dropout_rate': 0.0, "
                             "'dropout_rate': 0.0}"])
    _bench(out, "variants", [*base, "--batch_size", "32"], env={"JAX_DEFAULT_PRNG_IMPL": "rbg"})
    _bench(out, "variants", [*base, "--batch_size", "64"])


PARTS = {"env": part_env, "matmul": part_matmul, "dropout": part_dropout, "attn": part_attn,
         "step": part_step, "xlme": part_xlme, "variants": part_variants}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--deadline_s", type=float, default=360)
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--hard_stop_s", type=float, default=400)
    p.add_argument("--tiny", action="store_true")
    a = p.parse_args()
    global HARD_STOP_S
    HARD_STOP_S = a.hard_stop_s
    os.makedirs(a.out, exist_ok=True)
    for name in a.parts.split(","):
        if time.perf_counter() - T0 > a.deadline_s:
            _emit(a.out, name, skipped="deadline")
            continue
        try:
            PARTS[name](a.out, a.tiny)
        except Exception as e:  # noqa: BLE001
            _emit(a.out, name, error=f"{type(e).__name__}: {e}"[:500],
                  tb=traceback.format_exc()[-1500:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
