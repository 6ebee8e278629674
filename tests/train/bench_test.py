"""`python -m xlm_jax.bench` with a shipped run file: synthetic batches on a machine without
TensorFlow (accelerator hosts have jax only), figures consistent with the shapes it reports."""
import os
import re
import subprocess
import sys

import pytest

# Runs the benchmark CLI as on a jax-only host: tensorflow/seqio look uninstalled.
NO_TF = """
import sys
for name in ('tensorflow', 'seqio', 'tensorflow_datasets'):
    sys.modules[name] = None  # import fails, importlib.util.find_spec says "not installed"
from xlm_jax.bench import main
sys.exit(main(sys.argv[1:]))
"""


def test_bench_runs_a_shipped_run_file_without_tensorflow():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    r = subprocess.run(
        [sys.executable, "-c", NO_TF, "--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "3",
         "--batch_size", "4", "--seq_len", "16",
         "--gin.loop.model_config.size='tiny'"],
        capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})  # one CPU device
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = r.stdout
    assert "model: 4L d=128 V=8002; objectives/step: mmlm; global batch 4 x 16" in out, out
    ours = re.search(r"xlm_jax\s*: step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    torch_line = re.search(r"torch/HF : step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    assert ours and torch_line, out
    # tokens/s x step time = tokens per step: at most the 4 x 16 slots (padding excluded) for
    # ours, exactly 4 x 16 for the unpadded transformers batch
    our_tokens = float(ours[1]) / 1000 * float(ours[2])
    assert 0.5 * 64 <= our_tokens <= 64 * 1.01, out
    assert abs(float(torch_line[1]) / 1000 * float(torch_line[2]) - 64) < 0.5, out
