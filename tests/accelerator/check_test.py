"""`python -m xlm_jax.accelerator.check`: the budgeted device check, on this CPU at the tiny
size — the rows it writes for the steps it ran and skipped, its partial results, its bad
input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.testlib.xla_flags import xla_flags
from xlm_jax.accelerator import check


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The check on one CPU device (its benches would otherwise shard the tiny step over the
    suite's 8 fake devices, several times slower)."""
    return subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.check", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "XLA_FLAGS": xla_flags(1)})


def test_runs_what_fits_the_budget_and_says_why_the_rest_was_skipped(tmp_path):
    out, md = tmp_path / "check.json", tmp_path / "check.md"
    start = time.perf_counter()
    done = _cli("--budget_s", "160", "--size", "tiny", "--only", "env,mmlm,smoke,kernels",
                "--json", str(out), "--markdown", str(md))
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    assert wall < 180  # the budget and the interpreter's start-up
    data = json.loads(out.read_text())
    assert data["complete"] is True
    rows = {r["step"]: r for r in data["rows"]}
    assert list(rows) == ["env", "mmlm", "smoke", "kernels"]
    kernels = rows["kernels"]  # the sweep's two tiny launches, each kernel, plain and gated
    assert kernels["status"] == "ok" and kernels["result"]["complete"] is True, kernels
    assert kernels["result"]["rows"] == 12
    assert {b: sorted(k) for b, k in kernels["result"]["best"].items()} == {
        b: ["dkv", "dq", "forward"] for b in ("none", "gated")}
    assert [c["bias"] for c in kernels["result"]["combined"]] == ["none", "gated"]
    assert sum(ln.startswith("| gated | dq |") for ln in kernels["result"]["lines"]) == 2
    assert rows["env"]["status"] == "ok" and rows["env"]["result"]["platform"] == "cpu"
    assert rows["env"]["result"]["cost_chip"] is None
    mmlm = rows["mmlm"]
    assert mmlm["status"] == "ok", mmlm
    assert mmlm["result"]["step_ms"] > 0 and mmlm["result"]["tokens_per_s"] > 0
    # a CPU has no cost figures: said, not guessed
    assert mmlm["result"]["prediction"].startswith("n/a")
    # the tiny smoke (Pallas interpreted) needs minutes: skipped with its reason
    assert rows["smoke"]["status"] == "skipped"
    assert "budget" in rows["smoke"]["reason"] and "needs about" in rows["smoke"]["reason"]
    assert "| mmlm | ok |" in md.read_text()


def test_a_budget_below_the_first_step_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "check.json"
    done = _cli("--budget_s", "3", "--size", "tiny", "--json", str(out), timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "--budget_s 3" in done.stderr and "env" in done.stderr
    assert not out.exists()
    bad = _cli("--budget_s", "60", "--only", "env,warp", timeout=60)
    assert bad.returncode == 2 and "warp" in bad.stderr


def test_results_are_rewritten_after_each_step(tmp_path, monkeypatch):
    """A window that closes mid-check leaves the finished rows readable, marked incomplete."""
    out = tmp_path / "check.json"
    seen = []

    def fake_step(step: str, size: str, timeout: float, keep=None, launch="") -> check.Row:
        if seen:  # the second step: the machine goes away
            raise KeyboardInterrupt
        seen.append(step)
        return check.Row(step, "ok", 1.0, result={"step_ms": 5.0})

    monkeypatch.setattr(check, "run_step", fake_step)
    with pytest.raises(KeyboardInterrupt):
        check.main(["--budget_s", "600", "--size", "tiny", "--only", "env,mmlm",
                    "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["complete"] is False and [r["step"] for r in data["rows"]] == ["env"]
    assert not list(tmp_path.glob(".check-*"))  # no temporary file left behind


def test_a_failed_step_fails_the_check_and_a_cut_one_does_not(monkeypatch, tmp_path):
    statuses = iter(["cut", "failed"])

    def fake_step(step: str, size: str, timeout: float, keep=None, launch="") -> check.Row:
        return check.Row(step, next(statuses), 1.0, reason="x")

    monkeypatch.setattr(check, "run_step", fake_step)
    assert check.main(["--budget_s", "600", "--size", "tiny", "--only", "env"]) == 0
    assert check.main(["--budget_s", "600", "--size", "tiny", "--only", "env"]) == 1


@pytest.mark.parametrize("kind, chip", [("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA H200", "h200"), ("NVIDIA GH200", None),
                                        ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"),
                                        ("TPU v4", "v4"), ("cpu", None)])
def test_device_kinds_map_to_the_cost_models_chips(kind, chip):
    assert check.chip_of(kind) == chip


def test_tuned_steps_run_with_the_sweeps_best_launch_or_say_why_not(tmp_path, monkeypatch):
    """mmlm_tuned / xlme_tuned bench their run file with the kernels step's best launch of
    their bias variant (plain / gated) as `--gin.loop.model_config.attention_launch`."""
    calls = []
    best = {"none": "forward=128x64w8s3,dkv=64x64w4s3,dq=64x64w4s3"}  # gated: not found

    def fake_step(step: str, size: str, timeout: float, keep=None, launch="") -> check.Row:
        calls.append((step, launch))
        result = {"launch_text": best} if step == "kernels" else {"step_ms": 5.0}
        return check.Row(step, "ok", 1.0, result=result)

    monkeypatch.setattr(check, "run_step", fake_step)
    out = tmp_path / "check.json"
    assert check.main(["--budget_s", "900", "--size", "tiny", "--only",
                       "env,mmlm_tuned,kernels,mmlm_tuned,xlme_tuned", "--json", str(out)]) == 0
    assert calls == [("env", ""), ("kernels", ""), ("mmlm_tuned", best["none"])]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["step"], r["status"]) for r in rows] == [
        ("env", "ok"), ("mmlm_tuned", "skipped"), ("kernels", "ok"), ("mmlm_tuned", "ok"),
        ("xlme_tuned", "skipped")]
    assert rows[3]["result"]["attention_launch"] == best["none"]
    assert "no launch: no kernels step before it measured" in rows[1]["reason"]
    assert "(gated bias)" in rows[4]["reason"]
    assert check._bench_args("mmlm_tuned", "tiny", best["none"])[-1] == (
        f"--gin.loop.model_config.attention_launch='{best['none']}'")


_DEFAULT = "forward=64x64w4s3,dkv=64x64w4s3,dq=64x64w4s3"


@pytest.mark.parametrize("combined, used, why", [
    ({"default_ms": 2.0, "best_ms": 1.5}, True, None),  # faster together: tuned
    ({"default_ms": 2.0, "best_ms": 2.0}, False, "took 2.0 ms against the default's 2.0 ms"),
    ({"default_ms": 1.5, "best_ms": 2.1}, False, "took 2.1 ms against the default's 1.5 ms"),
    ({"error": "ValueError: too much shared memory"}, False,
     "failed together: ValueError: too much shared memory"),
    ({"default_ms": 2.0, "best_ms": 1.9, "launch": _DEFAULT}, False,
     f"the sweep's best launch is the default ({_DEFAULT})"),
    (None, True, None),  # no combined row (the sweep's budget ended): the per-kernel best
])
def test_a_tuned_step_uses_the_sweeps_launches_only_when_they_were_faster_together(
        combined, used, why):
    best = "forward=128x64w8s3,dkv=64x64w4s3,dq=64x64w4s3"
    launch = (combined or {}).get("launch", best)
    rows = [] if combined is None else [
        {"bias": "gated", "launch": launch, "default_launch": _DEFAULT, **combined},
        {"bias": "none", "launch": "another", "default_ms": 1.0, "best_ms": 9.0}]  # not ours
    launches, why_not = check.tuned_launches(
        {"launch_text": {"gated": launch}, "combined": rows})
    assert launches == ({"gated": launch} if used else {})
    assert (why is None) == ("gated" not in why_not)
    if why is not None:
        assert why in why_not["gated"]


def test_a_tuned_step_not_worth_its_time_is_skipped_with_the_sweeps_figures(tmp_path,
                                                                            monkeypatch):
    """The kernels step's best gated launches were slower together than the default (as the
    tiny CPU sweep measured once: 2.14 against 1.51 ms): xlme_tuned is skipped, saying so,
    and the window goes on to the next step."""
    calls = []
    kernels = {"launch_text": {"gated": "forward=32x16w4s3,dkv=32x16w4s3,dq=32x16w4s3"},
               "combined": [{"bias": "gated", "launch": "forward=32x16w4s3,dkv=32x16w4s3,"
                             "dq=32x16w4s3", "default_launch": _DEFAULT,
                             "default_ms": 1.5136, "best_ms": 2.1377}]}

    def fake_step(step: str, size: str, timeout: float, keep=None, launch="") -> check.Row:
        calls.append((step, launch))
        return check.Row(step, "ok", 1.0, result=kernels if step == "kernels" else {})

    monkeypatch.setattr(check, "run_step", fake_step)
    out = tmp_path / "check.json"
    assert check.main(["--budget_s", "900", "--size", "tiny", "--only",
                       "kernels,xlme_tuned,xlme", "--json", str(out)]) == 0
    assert calls == [("kernels", ""), ("xlme", "")]
    row = json.loads(out.read_text())["rows"][1]
    assert (row["step"], row["status"]) == ("xlme_tuned", "skipped")
    assert row["reason"] == ("no launch: the sweep's best launches together (forward=32x16w4s3,"
                             "dkv=32x16w4s3,dq=32x16w4s3) took 2.1377 ms against the "
                             "default's 1.5136 ms")
