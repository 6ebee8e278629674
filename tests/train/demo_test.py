"""`python -m xlm_jax.demo` end to end, as `make demo` runs it (demo/infoxlm.gin continued from
the league base beside MMLM continued), on a shortened schedule: a 1 x 32 model (a league
settings file the test writes), a 4-step base in a directory of the test's, 4 steps of the
paper's recipe, three Tatoeba languages copied from the demo's held-out split, from a working
directory outside the repository. Checks the table, the three JSON files, the PNG, both runs'
steps and that the control got the paper run's FLOPs."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.testlib import cli_run

LANGS = ("de", "fr", "nl")
SMALL = """
import xlm_jax.league.plan
LeagueConfig.shared_bindings = [
    'NUM_LAYERS = 1', 'HIDDEN_SIZE = 32', 'NUM_HEADS = 2', 'MLP_DIM = 64', 'SEQ_LEN = 32',
    'BATCH_SIZE = 8']
"""


@pytest.mark.slow  # a few minutes on 2 cores: three trainings' start-up and three retrievals
def test_demo_runs_end_to_end_and_writes_its_table_json_and_png(tmp_path):
    tatoeba = tmp_path / "tatoeba"
    tatoeba.mkdir()
    src = os.path.join(cli_run.ROOT, "tasks", "demo_data", "tatoeba")
    for lang in LANGS:
        for side in (lang, "eng"):
            name = f"tatoeba.{lang}-eng.{side}"
            shutil.copy(os.path.join(src, name), tatoeba / name)
    (tmp_path / "small.gin").write_text(SMALL)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    base_dir = tmp_path / "base"
    r = subprocess.run([sys.executable, "-m", "xlm_jax.demo", "--model_dir=out",
                        "--gin.TRAIN_STEPS=4", f"--tatoeba_dir={tatoeba}",
                        "--gin.loop.train.evaluators=[]",  # its in-loop eval: every 28 steps
                        "--gin.XLCO_LAYER=1", "--gin.XLCO_QUEUE_SIZE=16",
                        f"--league_gin={tmp_path / 'small.gin'}", f"--base_dir={base_dir}",
                        "--base_steps=4"],
                       cwd=cwd, env=cli_run.env(PYTHONPATH=cli_run.ROOT), capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = cwd / "out"  # a relative --model_dir is the working directory's
    # the terminal: each run's progress and end lines as they come, no line over 160
    assert re.search(r"^  paper: train 4/4 ", r.stdout, re.M), r.stdout
    assert re.search(r"^  control: done: \d+ steps in ", r.stdout, re.M), r.stdout
    echoed = [l for l in r.stdout.splitlines() if l.startswith(("  paper: ", "  control: "))]
    assert echoed and max(map(len, echoed)) <= 160

    row = r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)\s+[\d.]+$"
    table = {m.group(1): tuple(float(m.group(k)) for k in range(2, 6))
             for m in re.finditer(row, r.stdout, re.M)}
    assert set(table) == {*LANGS, "average"}
    for base, control, paper, delta in table.values():
        assert abs(paper - control - delta) <= 0.11  # the printed delta (rounded to 0.1)
    results = {name: json.loads((out / f"retrieval_{name}.json").read_text())
               for name in ("base", "control", "after")}
    for column, name in enumerate(("base", "control", "after")):
        assert set(results[name]["per_language"]) == set(LANGS)
        assert abs(100 * results[name]["average"] - table["average"][column]) <= 0.051  # %
    assert results["base"]["checkpoint"] == str(base_dir / "model")
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rows = [json.loads(line) for line in open(out / "model" / "metrics.jsonl")]
    steps = [row["step"] for row in rows if row["split"] == "train"]
    assert steps[-1] == 4 and steps == sorted(set(steps))  # the last step is always logged
    # both runs continued the base; the control trained whole steps within the paper's FLOPs
    for run in ("model", "control"):
        ops = (out / run / "operative_config.gin").read_text().replace("\\\n", "")
        assert f"init_from = '{base_dir / 'model'}'" in " ".join(ops.split())
    paper = re.search(r"^paper: .*?, 4 steps \(([\d.e-]+) TFLOP\)", r.stdout, re.M)
    control = re.search(r"^control: .*?, (\d+) steps \(([\d.e-]+) TFLOP\)", r.stdout, re.M)
    assert paper and control, r.stdout
    assert float(control.group(2)) <= float(paper.group(1)) * 1.01  # printed to 3 digits
    control_steps = int(control.group(1))
    assert max(int(s) for s in os.listdir(out / "control" / "checkpoints")) == control_steps
    assert json.loads((base_dir / "base_settings.json").read_text())["steps"] == 4
