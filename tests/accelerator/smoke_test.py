"""`python -m xlm_jax.accelerator.smoke` on the CPU: the table's rows, a mismatch and a NaN caught,
bad flags.

One module-scoped run covers xla, cudnn and pallas on the tiny model, plain and with the gated
bias, at the run files' attention dropout (0.1): xla is the reference, cudnn is unavailable on
a CPU (the library's reason in the row), pallas runs interpreted and must agree, so the run
exits 0. A second run of the same steps (compiled already: the tests' compilation cache) gets
faults injected into the pallas rows through `smoke.adjust_outputs`, the module's test hook: a
NaN loss in the plain model, hidden states 50% off in the gated one; both rows fail and the
exit status is 1.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys

import pytest

from xlm_jax.accelerator import smoke

# One layer of the tiny size: every layer runs the same kernels, and the interpreted Pallas
# kernel's compile time grows with each unrolled layer.
CPU_ARGS = ["--sizes", "tiny", "--seq_len", "32", "--batch_size", "2", "--steps", "1",
            "--num_layers", "1"]
BACKENDS = ("xla", "cudnn", "pallas")


def table_rows(out: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """{(size, gated bias, backend): {column: cell}} from the printed markdown table."""
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        rows[(cells["size"], cells["gated bias"], cells["backend"])] = cells
    return rows


def inject_faults(row: smoke.Row, outputs: smoke.StepOutputs) -> smoke.StepOutputs:
    """The pallas rows only: a NaN loss (plain model), hidden states 50% off (gated model;
    exactly, in float32)."""
    if row.backend != "pallas":
        return outputs
    if row.gated_bias:
        return dataclasses.replace(outputs, hidden=outputs.hidden.astype("float32") * 1.5)
    return dataclasses.replace(outputs, loss=outputs.loss * float("nan"))


def run_smoke(argv: list[str]) -> tuple[int, str]:
    """(exit status, stdout) of `smoke.main(argv)`."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = smoke.main(argv)
    return rc, stdout.getvalue()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """(exit status, stdout, JSON report) of the CPU run of xla, cudnn and pallas."""
    out_json = tmp_path_factory.mktemp("smoke") / "smoke.json"
    rc, out = run_smoke(CPU_ARGS + ["--backends", ",".join(BACKENDS), "--json", str(out_json)])
    return rc, out, json.loads(out_json.read_text())


def test_cpu_table_has_a_row_per_backend_and_model(cpu_run):
    rc, out, report = cpu_run
    rows = table_rows(out)
    assert sorted(rows) == sorted(("tiny", g, b) for g in ("off", "on") for b in BACKENDS)
    assert "pallas kernel runs interpreted" in out
    assert "batch 2 x 32; 1 layer; attention dropout 0.1" in out
    assert report["seq_len"] == 32 and report["dtype"] == "bfloat16"
    assert report["num_layers"] == 1
    assert report["tolerance"] == smoke.TOLERANCE
    for gated in ("off", "on"):
        ref = rows[("tiny", gated, "xla")]
        assert ref["status"] == "reference" and float(ref["compile (s)"]) > 0
        assert float(ref["step (ms)"]) > 0
        cudnn = rows[("tiny", gated, "cudnn")]
        assert cudnn["status"].startswith("unavailable: ") and "platform is cpu" in cudnn["status"]
        assert cudnn["loss"] == "—" and cudnn["step (ms)"] == "—"
        pallas = rows[("tiny", gated, "pallas")]
        assert pallas["status"] == "ok", pallas
        assert float(pallas["loss"]) == pytest.approx(float(ref["loss"]), rel=1e-3)
        for key, bound in smoke.TOLERANCE.items():
            assert float(pallas[f"{key} err"]) <= bound, (key, pallas)
        # a real comparison: the kernel and XLA round bf16 in different places
        assert float(pallas["hidden err"]) > 0 and float(pallas["grad err"]) > 0
    # the JSON says the same, and names where the largest errors are
    by_case = {(r["gated_bias"], r["backend"]): r for r in report["rows"]}
    assert by_case[(True, "pallas")]["status"] == "ok"
    assert by_case[(True, "pallas")]["worst"]["attention"].endswith("/attention")
    assert by_case[(False, "cudnn")]["status"] == "unavailable"
    assert rc == 0  # an unavailable backend is reported, not a failure


def test_injected_mismatch_and_nan_fail_the_run(cpu_run, monkeypatch):
    monkeypatch.setattr(smoke, "adjust_outputs", inject_faults)
    rc, out = run_smoke(CPU_ARGS + ["--backends", "xla,pallas"])
    rows = table_rows(out)
    assert rows[("tiny", "off", "pallas")]["status"] == "nan: non-finite loss"
    assert rows[("tiny", "on", "pallas")]["status"] == "mismatch: hidden 0.5 > 0.0625"
    assert rows[("tiny", "on", "pallas")]["hidden err"] == "5.00e-01"
    assert rows[("tiny", "on", "xla")]["status"] == "reference"
    assert rc == 1


@pytest.mark.parametrize("argv, named", [
    (["--backends", "xla,flash"], "--backends flash"),
    (["--sizes", "tiny,huge"], "--sizes huge"),
    (["--seq_len", "0"], "--seq_len 0"),
    (["--attention_dropout", "1.5"], "--attention_dropout 1.5"),
    (["--num_layers", "0"], "--num_layers 0"),
])
def test_bad_flag_is_one_line_naming_flag_and_value(capsys, argv, named):
    assert smoke.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"error: {named}:"), \
        captured.err


def test_smoke_imports_without_tensorflow():
    code = ("import sys, xlm_jax.accelerator.smoke; bad = [m for m in sys.modules "
            "if m.split('.')[0] in ('tensorflow', 'seqio')]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
