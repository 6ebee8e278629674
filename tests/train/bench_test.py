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
    assert ("model: 4L d=128 V=8002; dtype float32; attention xla; objectives/step: mmlm; "
            "global batch 4 x 16") in out, out
    ours = re.search(r"xlm_jax\s*: step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    torch_line = re.search(r"torch/HF : step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    assert ours and torch_line, out
    # tokens/s x step time = tokens per step: at most the 4 x 16 slots (padding excluded) for
    # ours, exactly 4 x 16 for the unpadded transformers batch
    our_tokens = float(ours[1]) / 1000 * float(ours[2])
    assert 0.5 * 64 <= our_tokens <= 64 * 1.01, out
    assert abs(float(torch_line[1]) / 1000 * float(torch_line[2]) - 64) < 0.5, out


XSPACE = """
planes {
  id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "XLA Modules" events { metadata_id: 9 offset_ps: 0 duration_ps: 9000000 } }
  lines {
    id: 2 name: "XLA Ops"
    events { metadata_id: 1 offset_ps: 0 duration_ps: 3000000 }
    events { metadata_id: 2 offset_ps: 3000000 duration_ps: 1000000 }
    events { metadata_id: 1 offset_ps: 4000000 duration_ps: 3000000 }
    events { metadata_id: 3 offset_ps: 7000000 duration_ps: 2000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "cublas_gemm.3" } }
  event_metadata { key: 2 value { id: 2 name: "loop_add_fusion" } }
  event_metadata { key: 3 value { id: 3 name: "cudnn-fmha.1" } }
  event_metadata { key: 9 value { id: 9 name: "jit_train_step" } }
}
planes { id: 2 name: "/host:CPU" }
"""


def test_profile_summary_adds_up_device_op_time(tmp_path):
    """A GPU trace written by hand (XSpace text proto): per-step times by op kind and by op."""
    from jax.profiler import ProfileData

    from xlm_jax.bench import summarize_profile

    run = tmp_path / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    (run / "host.xplane.pb").write_bytes(ProfileData.text_proto_to_serialized_xspace(XSPACE))
    out = summarize_profile(str(tmp_path), steps=2)
    # ops: gemm 6 us, fusion 1 us, cuDNN 2 us = 9 us over 2 steps (the module line is not an op)
    assert "device op time per step 0.0 ms" in out, out  # 4.5 us per step
    lines = out.splitlines()
    kinds = {ln.split()[0]: ln for ln in lines[1:4]}
    assert "66.7%" in kinds["matmul"] and "22.2%" in kinds["attention"]
    assert "11.1%" in kinds["fusion"], out
    assert lines[5].endswith("cublas_gemm.3") and "66.7%" in lines[5]
    empty = tmp_path / "none"
    empty.mkdir()
    assert "no trace found" in summarize_profile(str(empty), 1)
