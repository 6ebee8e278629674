"""`xlm_jax.accelerator.compile` for GPU nodes: compile-only H100s from the CUDA plugin (`make
test-slow`).

The plugin (jax-cuda12-plugin + jax-cuda12-pjrt, no CUDA libraries) is installed beside the
test environment by `make test-slow` and put on the tool's PYTHONPATH here
(`XLM_JAX_CUDA_COMPILE`); each compile runs in a process of its own. What is asserted: the
step compiles for 4 x H100 with the Triton flash-attention kernels in it (counted), its
arguments equal the state and batch shards computed from the shardings, and the tool holds
the total against the card's memory (XLA:GPU does not): an oversized batch exits 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `make test-slow` names the folder relative to the repository root (.venv/cuda_compile): made
# absolute here, so that the tool finds the plugin wherever the subprocess resolves it.
PLUGIN = (os.path.abspath(os.environ["XLM_JAX_CUDA_COMPILE"])
          if os.environ.get("XLM_JAX_CUDA_COMPILE") else None)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not PLUGIN, reason="XLM_JAX_CUDA_COMPILE (the CUDA plugin's "
                                 "folder, `make test-slow` installs it) is not set")]


def _compile(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([PLUGIN, REPO])
    proc = subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.compile", *args,
                           "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def test_reduced_mmlm_step_compiles_for_h100_with_triton_kernels(tmp_path):
    proc, r = _compile(tmp_path, "--gin_file=runs/xlmr_base_mmlm.gin", "--target", "h100:1x1x4",
                       "--size", "tiny", "--depth", "1", "--batch_size", "8", "--seq_len", "128",
                       "--attention_backend", "pallas")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert r["custom_calls"] == {"__gpu$xla.gpu.triton": 3}
    assert r["memory_per_device_bytes"]["argument"] == r["argument_bytes_from_shapes"]
    assert r["device_memory_bytes"] == int(80e9 * 0.9)  # the card x our launch scripts' share
    assert r["flops_per_device"]["xla"] is None  # XLA:GPU gives no cost analysis here


def test_xlme_base_compiles_for_4_h100(tmp_path):
    proc, r = _compile(tmp_path, "--gin_file=runs/xlme_base.gin", "--target", "h100:1x1x4",
                       "--mesh", "data=2,tensor=2", "--batch_size", "8", "--seq_len", "512")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert r["custom_calls"].get("__gpu$xla.gpu.triton", 0) > 0
    assert r["memory_per_device_bytes"]["total"] < r["device_memory_bytes"]


def test_an_oversized_gpu_step_does_not_fit_although_xla_compiles_it(tmp_path):
    proc, r = _compile(tmp_path, "--gin_file=runs/xlmr_base_mmlm.gin", "--target", "h100:1x1x4",
                       "--size", "tiny", "--depth", "1", "--batch_size", "262144", "--seq_len",
                       "256")  # 155 GB a device (65,536 rows: 47 GB since the step keeps less)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "error" not in r and r["fits"] is False  # compiled, held against the card by us
    assert r["memory_per_device_bytes"]["total"] > r["device_memory_bytes"]
    last = proc.stderr.strip().splitlines()[-1]
    assert "does not fit" in last and "first knob: rematerialise every layer" in last


def test_a_step_triton_cannot_compile_exits_1_with_the_compilers_line(tmp_path):
    # one head of 4096 dimensions: the flash kernel's blocks exceed an H100's shared memory
    proc, r = _compile(tmp_path, "--gin_file=runs/xlmr_base_mmlm.gin", "--target", "h100:1x1x4",
                       "--size", "tiny", "--batch_size", "8", "--seq_len", "128",
                       "--attention_backend", "pallas", "--no_collectives",
                       "--gin.loop.model_config.overrides={'num_layers': 1, 'hidden_size': "
                       "4096, 'num_heads': 1, 'mlp_dim': 256}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "does not compile:" in last, last
    assert r["fits"] is False and r["error"]
