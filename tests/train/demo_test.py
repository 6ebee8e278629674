"""`python -m xlm_jax.demo` end to end, as `make demo` runs it, on a shortened schedule: a
few steps, three Tatoeba languages (copied from the demo's held-out split), from a working
directory outside the repository. Checks its table, its two JSON files and its PNG."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.testlib import cli_run

LANGS = ("de", "fr", "nl")


@pytest.mark.slow  # about 3 minutes on 2 cores: training start-up and four retrieval passes
def test_demo_runs_end_to_end_and_writes_its_table_json_and_png(tmp_path):
    tatoeba = tmp_path / "tatoeba"
    tatoeba.mkdir()
    src = os.path.join(cli_run.ROOT, "tasks", "demo_data", "tatoeba")
    for lang in LANGS:
        for side in (lang, "eng"):
            name = f"tatoeba.{lang}-eng.{side}"
            shutil.copy(os.path.join(src, name), tatoeba / name)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "xlm_jax.demo", "--model_dir=out",
                        "--gin.TRAIN_STEPS=4", f"--tatoeba_dir={tatoeba}",
                        "--gin.loop.train.retrieval=None"],  # its in-loop eval is every 100 steps
                       cwd=cwd, env=cli_run.env(PYTHONPATH=cli_run.ROOT), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = cwd / "out"  # a relative --model_dir is the working directory's

    table = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
             for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)$", r.stdout,
                                  re.M)}
    assert set(table) == {*LANGS, "average"}
    for before, after, delta in table.values():
        assert abs(after - before - delta) <= 0.11  # the printed delta (rounded to 0.1)
    results = {name: json.loads((out / f"retrieval_{name}.json").read_text())
               for name in ("before", "after")}
    assert results["before"]["step"] == 0 and results["after"]["step"] is None  # the latest
    for name, column in (("before", 0), ("after", 1)):
        assert set(results[name]["per_language"]) == set(LANGS)
        assert abs(100 * results[name]["average"] - table["average"][column]) <= 0.051  # %
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rows = [json.loads(line) for line in open(out / "model" / "metrics.jsonl")]
    steps = [row["step"] for row in rows if row["split"] == "train"]
    assert steps[-1] == 4 and steps == sorted(set(steps))  # the last step is always logged
