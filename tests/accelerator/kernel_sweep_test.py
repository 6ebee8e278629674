"""`python -m xlm_jax.accelerator.kernel_sweep`: each attention kernel timed alone over
launches, on this CPU (interpreted: the times say nothing, the bookkeeping is what is
checked) — rows checked against the default launch's outputs, a wrong launch caught and never
best, the budget, bad flags."""
from __future__ import annotations

import json

import pytest

from xlm_jax.accelerator import kernel_sweep
from xlm_jax.models import fused_attention, kernel_launch

TINY = ["--shape", "2,64,2,16", "--dtype", "float32", "--iters", "1"]


def _run(tmp_path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "sweep.json"
    code = kernel_sweep.main([*TINY, "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_every_kernel_at_every_launch_checked_and_the_fastest_correct_one_chosen(tmp_path,
                                                                                 capsys):
    code, data = _run(tmp_path, "--bias", "gated", "--launches", "16x16w4s3,32x16w4s3")
    assert code == 0 and data["complete"] is True
    rows = data["rows"]
    assert [(r["kernel"], r["launch"]) for r in rows] == [
        (k, launch) for launch in ("16x16w4s3", "32x16w4s3") for k in fused_attention.KERNELS]
    assert all(r["status"] == "ok" and 0 <= r["error"] <= kernel_sweep.TOLERANCE["float32"]
               for r in rows), rows
    for kernel in fused_attention.KERNELS:
        mine = [r for r in rows if r["kernel"] == kernel]
        assert data["best"]["gated"][kernel] == min(mine, key=lambda r: r["ms"])["launch"]
    (combined,) = data["combined"]
    assert combined["bias"] == "gated" and combined["default_ms"] > 0 and combined["best_ms"] > 0
    assert combined["launch"] == data["launch_text"]["gated"]
    assert combined["default_launch"] == kernel_launch.text(fused_attention.GPU_LAUNCH)
    out = capsys.readouterr().out
    assert "interpreted on a CPU" in out and "best (gated): forward " in out


def test_a_launch_with_wrong_outputs_is_caught_and_never_best(tmp_path, monkeypatch):
    real = fused_attention.run_kernel

    def broken(inputs, kernel, launch, **kw):  # a dq kernel that drops part of its tile
        out = real(inputs, kernel, launch, **kw)
        if kernel == "dq" and launch.block_q == 32:
            return (out[0] * 1.01, *out[1:])
        return out

    monkeypatch.setattr(fused_attention, "run_kernel", broken)
    code, data = _run(tmp_path, "--bias", "none", "--launches", "16x16w4s3,32x16w4s3")
    assert code == 1
    status = {(r["kernel"], r["launch"]): r["status"] for r in data["rows"]}
    assert status.pop(("dq", "32x16w4s3")) == "wrong" and set(status.values()) == {"ok"}
    wrong = [r for r in data["rows"] if r["status"] == "wrong"][0]
    assert 5e-3 < wrong["error"] < 2e-2 and "above 0.0001" in wrong["reason"]
    assert data["best"]["none"]["dq"] == "16x16w4s3"


def test_the_budget_stops_the_sweep_and_says_so(tmp_path, capsys):
    code, data = _run(tmp_path, "--budget_s", "0", "--launches", "16x16w4s3")
    assert code == 0 and data["complete"] is False and data["rows"] == []
    assert "budget: stopped after 0 of 6 rows" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--launches", "64x64"], "'64x64' is not BQxBKwWARPSsSTAGES"),
    (["--bias", "causal"], "--bias 'causal'"),
    (["--dtype", "int8"], "--dtype 'int8'"),
])
def test_bad_flags_are_one_line_errors(args, message, capsys):
    assert kernel_sweep.main([*TINY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_flops_per_kernel_match_the_rates_measured_on_a_gpu():
    """docs/performance.md's H200 rates of the MMLM step's kernels at [32, 512, 12, 64]:
    forward 0.345 ms = 75 TFLOP/s, dk/dv 0.256 ms = 202, dq 0.199 ms = 194 (matmul FLOPs
    counted as 2, 4 and 3 products of 2·B·H·T²·Dh)."""
    p = kernel_sweep.Problem(32, 512, 12, 64, "bfloat16", 0.1, "none")
    rates = {k: p.flops(k) / ms / 1e9 for k, ms in (("forward", 0.345), ("dkv", 0.256),
                                                       ("dq", 0.199))}
    assert rates == pytest.approx({"forward": 75, "dkv": 202, "dq": 194}, rel=0.01)
    assert kernel_sweep.gpu_launches()[0] == "64x64w4s3"  # the current setting first
    assert len(set(kernel_sweep.gpu_launches())) == 40


def test_a_launch_the_compiler_refuses_is_a_row_not_a_failed_sweep(tmp_path, monkeypatch):
    real = fused_attention.run_kernel

    def refusing(inputs, kernel, launch, **kw):  # as Triton refuses a tile too big for SMEM
        if launch.block_k == 32:
            raise RuntimeError("out of resource: shared memory, Required: 262144\nmore")
        return real(inputs, kernel, launch, **kw)

    monkeypatch.setattr(fused_attention, "run_kernel", refusing)
    code, data = _run(tmp_path, "--bias", "none", "--launches", "16x16w4s3,16x32w4s3")
    assert code == 0
    failed = [r for r in data["rows"] if r["status"] == "failed"]
    assert len(failed) == 3 and all(r["launch"] == "16x32w4s3" for r in failed)
    assert failed[0]["reason"] == "RuntimeError: out of resource: shared memory, Required: 262144"
    assert set(data["best"]["none"].values()) == {"16x16w4s3"}
    def broken(*args, **kw):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(fused_attention, "run_kernel", broken)
    code, data = _run(tmp_path, "--bias", "none", "--launches", "16x16w4s3")
    assert code == 1 and {r["status"] for r in data["rows"]} == {"failed"}  # nothing ran at all
