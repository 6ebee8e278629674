"""`python -m xlm_jax.accelerator.bench` with a shipped run file: synthetic batches on a machine
without TensorFlow (accelerator hosts have jax only), figures consistent with the shapes it
reports."""
import os
import re
import subprocess
import sys

import pytest

from tests.testlib.xla_flags import xla_flags

# Runs the benchmark CLI as on a jax-only host: tensorflow/seqio look uninstalled.
NO_TF = """
import sys
for name in ('tensorflow', 'seqio', 'tensorflow_datasets'):
    sys.modules[name] = None  # import fails, importlib.util.find_spec says "not installed"
from xlm_jax.accelerator.bench import main
sys.exit(main(sys.argv[1:]))
"""


def test_bench_runs_a_shipped_run_file_without_tensorflow():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    r = subprocess.run(
        [sys.executable, "-c", NO_TF, "--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "3",
         "--batch_size", "4", "--seq_len", "16",
         "--gin.loop.model_config.size='tiny'", "--gin.loop.model_config.dtype='float32'"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "XLA_FLAGS": xla_flags(1)})  # one CPU device
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = r.stdout
    # the run file asks for `auto` (the platform's fused kernels; on a CPU the XLA path)
    assert ("model: 4L d=128 V=8002; dtype float32; attention auto; objectives/step: mmlm; "
            "global batch 4 x 16") in out, out
    ours = re.search(r"xlm_jax\s*: step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    torch_line = re.search(r"torch/HF : step\s+([\d.]+) ms\s+tokens/s\s+([\d.]+)", out)
    assert ours and torch_line, out
    # tokens/s x step time = tokens per step: at most the 4 x 16 slots (padding excluded) for
    # ours, exactly 4 x 16 for the unpadded transformers batch
    our_tokens = float(ours[1]) / 1000 * float(ours[2])
    assert 0.5 * 64 <= our_tokens <= 64 * 1.01, out
    # transformers gets the synthetic monolingual rows at the same shapes, padding included,
    # and counts their non-pad tokens as we do
    from xlm_jax.data.synthetic import synthetic_batch

    rows = synthetic_batch(4, 16, 8002, "mono", seed=0)["input_ids"]
    assert 0 < (rows != 1).sum() < 64
    assert abs(float(torch_line[1]) / 1000 * float(torch_line[2]) - (rows != 1).sum()) < 0.5, out
    ratio = re.search(r"xlm_jax / transformers tokens/s = ([\d.]+)", out)
    assert ratio and float(ratio[1]) == pytest.approx(float(ours[2]) / float(torch_line[2]),
                                                    rel=0.01), out


def test_prediction_slots_follow_the_run_files_rule():
    """The bench resizes MAX_PREDICTIONS with --seq_len by the rule the run files state."""
    from xlm_jax.accelerator.bench import prediction_slots

    assert prediction_slots(0.15, 512) == 80  # runs/*: floor(0.15 x 512) + 1 = 77 -> 80
    assert prediction_slots(0.25, 128) == 40  # runs/veco_large.gin's MAX_PREDICTIONS_BI
    for rate, t in ((0.15, 128), (0.15, 16), (0.25, 512), (0.15, 1000)):
        n = prediction_slots(rate, t)
        assert n % 8 == 0 and int(rate * t) + 1 <= n < int(rate * t) + 9


def test_table_runs_each_row_in_its_own_process_and_reports_failures(tmp_path, monkeypatch):
    """`--table` on one real row (tiny model, two sizes named by gin files) and one broken row:
    the JSON holds consistent figures for the first and the error line for the second, the
    markdown has one line per row, and the exit code says a row failed."""
    import json

    from xlm_jax.accelerator import bench

    runs = (("MMLM", {"base": ["runs/xlmr_base_mmlm.gin"]}),
            ("broken", {"base": ["runs/no_such_run_file.gin"]}))
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))  # each row's process: one CPU device
    code = bench.run_table(["base"], 2, 2, 16, False, ["loop.model_config.size = 'tiny'"],
                           str(tmp_path / "t.json"), str(tmp_path / "t.md"), runs=runs)
    assert code == 1
    rows = json.loads((tmp_path / "t.json").read_text())
    assert [r["objective"] for r in rows] == ["MMLM", "broken"]
    ok, bad = rows
    assert ok["objectives"] == ["mmlm"] and (ok["batch_size"], ok["seq_len"]) == (2, 16)
    assert ok["model"] == "4L d=128 V=8002"
    assert ok["tokens_per_second"] * ok["step_ms"] / 1000 == pytest.approx(
        ok["tokens_per_step"], rel=1e-6)
    assert 0.5 * 32 <= ok["tokens_per_step"] <= 32
    assert "no_such_run_file.gin" in bad["error"]
    md = (tmp_path / "t.md").read_text().splitlines()
    assert len(md) == 4 and md[2].startswith("| MMLM | base | mmlm |")
    assert md[3].startswith("| broken | base | failed: ") and md[3].count("|") == md[0].count("|")


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


def write_trace(root, xspace: str) -> str:
    """Writes an XSpace text proto where jax.profiler puts a run's trace under `root`
    (plugins/profile/RUN/HOST.xplane.pb) and returns `root` for summarize_profile."""
    from jax.profiler import ProfileData

    run = root / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    (run / "host.xplane.pb").write_bytes(ProfileData.text_proto_to_serialized_xspace(xspace))
    return str(root)


def test_profile_summary_adds_up_device_op_time(tmp_path):
    """A GPU trace written by hand (XSpace text proto): per-step times by op kind and by op."""
    from xlm_jax.accelerator.bench import summarize_profile

    out = summarize_profile(write_trace(tmp_path, XSPACE), steps=2)
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


CPU_XSPACE = """
planes {
  id: 1 name: "/host:CPU"
  lines {
    id: 1 name: "python"
    events { metadata_id: 4 offset_ps: 0 duration_ps: 90000000 }
  }
  lines {
    id: 2 name: "tf_XLAEigen/17"
    events { metadata_id: 1 offset_ps: 0 duration_ps: 8000000 }
    events { metadata_id: 2 offset_ps: 0 duration_ps: 3000000 }
    events { metadata_id: 3 offset_ps: 3000000 duration_ps: 1000000 }
  }
  lines {
    id: 3 name: "tf_XLAPjRtCpuClient/5"
    events { metadata_id: 2 offset_ps: 0 duration_ps: 3000000 }
    events { metadata_id: 5 offset_ps: 3000000 duration_ps: 1000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "ThunkExecutor::Execute" } }
  event_metadata { key: 2 value { id: 2 name: "ynn_fusion.3" } }
  event_metadata { key: 3 value { id: 3 name: "copy_bitcast_fusion.1" } }
  event_metadata { key: 4 value { id: 4 name: "$loop.py:498 _fetch" } }
  event_metadata { key: 5 value { id: 5 name: "scatter_add_fusion" } }
}
"""


def test_profile_summary_reads_xla_cpu_threads_on_a_host_trace(tmp_path):
    """A CPU run has no device plane: the XLA:CPU executor threads' op events are summed (the
    executor's wrapper events and the Python thread are not ops)."""
    from xlm_jax.accelerator.bench import summarize_profile

    out = summarize_profile(write_trace(tmp_path, CPU_XSPACE), steps=1)
    lines = out.splitlines()
    # ops: YNNPACK dot fusion 6 us (two threads), copy 1 us, scatter 1 us = 8 us
    assert "XLA:CPU op time (summed over threads) per step 0.0 ms" in lines[0], out
    kinds = {ln.split()[0]: ln for ln in lines[1:4]}
    assert "75.0%" in kinds["matmul"] and "12.5%" in kinds["copy/transpose"], out
    assert "12.5%" in kinds["gather/scatter"], out
    assert lines[5].endswith("ynn_fusion.3") and "75.0%" in lines[5], out
    assert "ThunkExecutor" not in out and "_fetch" not in out
