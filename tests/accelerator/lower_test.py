"""`python -m xlm_jax.accelerator.lower`: the trainer's sharded step lowered for CUDA and TPU from a
CPU.

Each run goes through the CLI's `main` in a fresh process (the CLI sets up its own fake
devices); the runs of `make test` that lower share one process (`tests/testlib/lower_many.py`:
one interpreter and jax start-up instead of twelve), the bad-input runs and those of
`make test-slow` get a process each. At reduced width (`--width 128`: the run file's depth, 4
heads; 8 x 256) one run file per objective family runs in `make test`; every run file runs in
`make test-slow`. What is asserted: the fused kernels are in the
lowered step (Triton calls on CUDA), their q/k/v operands are per-device shards (batch / data,
heads / tensor), and no float ``[..., T, T]`` array (logits, probabilities, a materialised
bias) exists anywhere in forward or backward.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ["runs/xlmr_base_mmlm.gin", "runs/infoxlm_base.gin", "runs/xlme_base.gin",
            "runs/ernie_m_base.gin", "runs/veco_small.gin"]
ALL = sorted(os.path.relpath(p, os.path.join(REPO, "gin_configs"))
             for p in glob.glob(os.path.join(REPO, "gin_configs", "runs", "**", "*.gin"),
                                recursive=True))
B, T = 8, 256


def _cli_env() -> dict[str, str]:
    """This environment without the suite's XLA_FLAGS: the CLI asks for its own devices."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def _lower(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.lower", *args],
                          capture_output=True, text=True, cwd=REPO, env=_cli_env(), timeout=600)


# The families at depth 2 (every layer lowers to the same kernels; each unrolled layer adds
# lowering time): XLM-E's generator (GENERATOR_LAYERS, 4 of 12) keeps 1 of 2 and InfoXLM's
# universal layer (XLCO_LAYER, 8 of 12) moves to 1 of 2.
SHALLOW = ("--depth", "2")
FAMILY_LAYERS = {"infoxlm": ("--gin.XLCO_LAYER=1",), "xlme": ("--gin.GENERATOR_LAYERS=1",)}


def _args(run_file: str, platform: str, backend: str, *extra: str) -> list[str]:
    return [f"--gin_file={run_file}", "--platform", platform, "--width", "128", "--batch_size",
            str(B), "--seq_len", str(T), "--mesh", "data=2,tensor=2", "--attention_backend",
            backend, *extra]


def _summary(run_file: str, platform: str, backend: str, *extra: str) -> dict:
    done = _lower(*_args(run_file, platform, backend, *extra))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _family_args(run_file: str, platform: str) -> list[str]:
    family = os.path.basename(run_file).split("_")[0]
    return _args(run_file, platform, "pallas", *SHALLOW, *FAMILY_LAYERS.get(family, ()))


XLA_CONTROL = _args("runs/xlmr_base_mmlm.gin", "cuda", "xla")
CUDNN = _args("runs/xlmr_base_mmlm.gin", "cuda", "cudnn", "--attention_dropout", "0",
              "--gin.loop.model_config.dtype='bfloat16'")


@pytest.fixture(scope="module")
def lowered() -> dict[tuple[str, ...], dict]:
    """{argv: the CLI's returncode, stdout, stderr} of every lowering of `make test`, run in
    one fresh process."""
    runs = [_family_args(f, p) for f in FAMILIES for p in ("cuda", "tpu")] + [XLA_CONTROL, CUDNN]
    done = subprocess.run([sys.executable, os.path.join(REPO, "tests", "testlib",
                                                        "lower_many.py"), json.dumps(runs)],
                          capture_output=True, text=True, cwd=REPO, env=_cli_env(),
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return {tuple(r["argv"]): r for r in json.loads(done.stdout.splitlines()[-1])}


def _lowered_summary(lowered: dict, argv: list[str]) -> dict:
    run = lowered[tuple(argv)]
    assert run["returncode"] == 0, run["stderr"][-2000:]
    return json.loads(run["stdout"])


KERNELS = {"cuda": "triton", "tpu": "mosaic_tpu"}


def _check_pallas(s: dict, platform: str) -> None:
    calls = s["fused_attention_calls"]
    assert calls and {c["kind"] for c in calls} == {KERNELS[platform]}
    heads = int(s["model"].split("heads=")[1])
    for c in calls:  # q: Triton [B/data, T, H/tensor, Dh], Mosaic TPU [B/data, H/tensor, T, Dh]
        dims = [int(x) for x in c["operands"][0].split("x")[:3]]
        rows, length, h = dims if platform == "cuda" else (dims[0], dims[2], dims[1])
        assert h == heads // 2 and length >= T and rows * 2 in (B, 2 * B), c["operands"][0]
    assert s["square_tensor_count"]["float"] == 0, s["square_tensors"]
    # masks too are evaluated per tile (TokenMask): nothing T x T at all
    assert s["square_tensor_count"]["int_or_bool"] == 0, s["square_tensors"]


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("run_file", FAMILIES)
def test_each_family_lowers_with_pallas_per_shard(lowered, run_file, platform):
    _check_pallas(_lowered_summary(lowered, _family_args(run_file, platform)), platform)


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("run_file", sorted(set(ALL) - set(FAMILIES)))
def test_every_run_file_lowers_with_pallas_per_shard(run_file, platform):
    _check_pallas(_summary(run_file, platform, "pallas"), platform)


def test_xla_backend_materialises_what_pallas_does_not(lowered):
    """The control: the same step on the XLA path has float [.., T, T] arrays (so the count
    that is 0 above can see them)."""
    s = _lowered_summary(lowered, XLA_CONTROL)
    assert s["square_tensor_count"]["float"] > 10 and not s["fused_attention_calls"]


def test_cudnn_lowers_per_shard_without_dropout(lowered):
    s = _lowered_summary(lowered, CUDNN)
    calls = s["fused_attention_calls"]
    assert calls and {c["kind"] for c in calls} == {"cudnn"}
    assert all(c["operands"][0].startswith(f"{B // 2}x{T}x2x") for c in calls)
    assert s["assumed_cudnn_version"] > 0
    # padding as sequence lengths: no bias operand (no dbias), lengths per shard's rows
    # (forward: q, k, v, lengths; backward: q, k, v, logsumexp, o, do, lengths; no bias)
    assert all("Bias" not in c["target"] and c["operands"][-2:] == [f"{B // 2}xi32"] * 2
               and not any(f"x{T}x{T}x" in op for op in c["operands"]) for c in calls), calls
    assert {c["target"] for c in calls} == {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"}
    assert s["square_tensor_count"] == {"float": 0, "int_or_bool": 0}, s["square_tensors"]


@pytest.mark.parametrize("args,needle", [
    (["--platform", "rocm"], "--platform 'rocm': expected one of cuda, tpu"),
    (["--platform", "cuda", "--mesh", "data=3"], "3 batch shards do not divide"),
    (["--platform", "cuda", "--mesh", "tensor=3"], "--mesh tensor=3 does not divide"),
    (["--platform", "cuda", "--mesh", "pipe=2"], "--mesh 'pipe=2'"),
    (["--platform", "cuda", "--attention_backend", "flash"], "--attention_backend 'flash'"),
    (["--platform", "cuda", "--depth", "0"], "--depth 0: must be positive"),
    (["--platform", "cuda", "--attention_backend", "cudnn"],
     "backend 'cudnn' cannot run this call on gpu"),
    (["--platform", "cuda", "--gin.loop.model_config.size='huge'"],
     "unknown model size 'huge'"),
])
def test_bad_input_is_one_line_naming_the_flag_and_value(args, needle):
    done = _lower("--gin_file=runs/xlmr_base_mmlm.gin", "--size", "tiny", "--batch_size", "8",
                  "--seq_len", "64", *args)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], done.stderr[-1500:]
