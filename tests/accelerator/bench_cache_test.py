"""`python -m xlm_jax.accelerator.bench --compilation_cache_dir DIR` twice on the same run file:
the first run compiles the train step and writes it to DIR, the second loads it from there and
says so (the `compile` line and the JSON's `cache_hit`). A check that the hit is reported, not a
speed test: both compile times are printed, not compared."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.testlib.xla_flags import xla_flags

BENCH = ["-m", "xlm_jax.accelerator.bench", "--gin_file=runs/xlmr_base_mmlm.gin", "--steps", "1",
         "--batch_size", "2", "--seq_len", "16", "--no_torch", "--gin.SIZE='tiny'",
         "--gin.loop.model_config.dtype='float32'"]


def test_a_second_bench_run_loads_the_step_from_the_cache_the_first_wrote(tmp_path):
    cache = str(tmp_path / "cache")
    env = {**os.environ, "XLA_FLAGS": xla_flags(1),  # one CPU device
           # every compile is written, however fast: whether it is cached is not the question
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    runs = []
    for name in ("first", "second"):
        out = str(tmp_path / f"{name}.json")
        r = subprocess.run([sys.executable, *BENCH, f"--compilation_cache_dir={cache}",
                            "--json", out], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        line = re.search(r"^compile  : ([\d.]+) s .*$", r.stdout, re.M)
        assert line, r.stdout
        result = json.load(open(out))
        assert result["compile_s"] == pytest.approx(float(line[1]), abs=0.051)  # printed .1f
        runs.append((line[0], result))
    (first_line, first), (second_line, second) = runs
    print(f"\nfirst run : {first_line}\nsecond run: {second_line}")
    assert first["compilation_cache_dir"] == second["compilation_cache_dir"] == cache
    assert first["cache_hit"] is False
    assert "written to the persistent compilation cache" in first_line
    assert second["cache_hit"] is True and "persistent compilation cache hit" in second_line
    assert 0 < second["compile_xla_s"] <= second["compile_s"]
    assert any(name.startswith("jit_train_step-") for name in os.listdir(cache))
