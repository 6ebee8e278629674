"""One device check that fits a short accelerator window, within a time budget.

  python -m xlm_jax.accelerator.check --budget_s 420 [--size base] [--only STEP,STEP]
      [--json OUT] [--markdown OUT]

Runs, in order of value, each step in a process of its own (so that one that hangs or runs
out of memory costs only its own time), and stops before the budget runs out:

  env          versions, devices, the chip's peak rates
  smoke        `accelerator.smoke` at the size's dims with 2 layers: the Pallas attention
               kernels against XLA, plain and with XLM-E's gated bias
  kernels      `accelerator.kernel_sweep`: each attention kernel (forward, dk/dv, dq) timed
               alone over tiles, warps and stages at a base step's shape, plain and with
               the gated bias, within its own share of the budget (`SWEEP_BUDGET_S`)
  mmlm         `accelerator.bench` on runs/xlmr_base_mmlm.gin, with one step profiled
               (the profile summary: time by kind of kernel) and the cost model's
               prediction for the very executable measured (its HLO, dumped by XLA)
  xlme, infoxlm, ernie_m, veco   the same for each objective's run file (each profiled:
               the one GPU point of XLM-E, 234.6 ms against 129 predicted, had no trace to
               say where the difference goes)
  mmlm_tuned, xlme_tuned   mmlm and xlme again with the kernel sweep's best launches (plain
               for mmlm, gated-bias for xlme: `--gin.loop.model_config.attention_launch`);
               skipped when no `kernels` step before them found a best launch for each
               kernel, or when those launches together were the default, failed, or were
               not faster than the default (`tuned_launches`)
  mmlm_b64     the MMLM step at twice the batch
  transformers transformers' XLMRobertaForMaskedLM on the MMLM rows (PyTorch), the ratio

A step starts only when the budget left covers its estimated time (`ESTIMATE_S`, our
figures: a base compile on an H100 takes about a minute); its process gets what is left (less
a few seconds to write the results) and is killed past it. After every step the JSON and the
markdown are rewritten (through a temporary file and a rename): `complete` is false until the
last step is done, so a window that closes early leaves every finished row readable.
`--size tiny` runs the same steps at the tiny size and small shapes (what the tests run on a
CPU; its smoke, with Pallas interpreted, needs minutes there). Exit status: 0 when no step
failed (a skipped step, or one the budget cut short, has its reason in its row); 1 when a step
failed; 2 on a bad flag, or a budget below the first step's estimate (nothing written).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help

SIZES = ("tiny", "base")
STEPS = ("env", "smoke", "kernels", "mmlm", "xlme", "mmlm_tuned", "xlme_tuned", "infoxlm",
         "ernie_m", "veco", "mmlm_b64", "transformers")
RUN_FILES = {"mmlm": ["runs/xlmr_base_mmlm.gin"], "mmlm_b64": ["runs/xlmr_base_mmlm.gin"],
             "mmlm_tuned": ["runs/xlmr_base_mmlm.gin"], "xlme_tuned": ["runs/xlme_base.gin"],
             "transformers": ["runs/xlmr_base_mmlm.gin"], "xlme": ["runs/xlme_base.gin"],
             "infoxlm": ["runs/infoxlm_base.gin"], "ernie_m": ["runs/ernie_m_base.gin"],
             "veco": ["runs/veco_large.gin", "models/base.gin"]}
# Seconds each step needs at least (our estimates: start-up, compile, a few steps), by size.
ESTIMATE_S = {"tiny": {"env": 5, "smoke": 150, "kernels": 30, "transformers": 30,
                       "default": 20},
              "base": {"env": 10, "smoke": 120, "kernels": 60, "xlme": 120, "xlme_tuned": 120,
                       "veco": 150, "transformers": 60, "default": 75}}
# The kernel sweep's own budget (it stops starting rows past it, then reports what it has)
# and its problem, by size (our choices: the tiny one runs interpreted on a CPU in seconds).
SWEEP_BUDGET_S = {"tiny": 60.0, "base": 150.0}
SWEEP_ARGS = {"tiny": ["--shape", "2,64,2,16", "--dtype", "float32", "--iters", "1",
                       "--launches", "16x16w4s3,32x16w4s3"],
              "base": ["--shape", "32,512,12,64", "--dtype", "bfloat16"]}
PROFILED = ("mmlm", "xlme", "infoxlm", "ernie_m", "veco", "mmlm_tuned", "xlme_tuned")
TUNED = {"mmlm_tuned": "none", "xlme_tuned": "gated"}  # the sweep's bias variant each reads
SHAPES = {"tiny": (8, 64), "base": (32, 512)}  # (rows, tokens) per objective (8: any of
# 1, 2, 4 or 8 devices divides it, the tests' 8 fake CPU devices too)
RESERVE_S = 5.0  # kept back from the budget to write the results
# device_kind -> the cost model's chip (xlm_jax.accelerator.cost.chips)
_CHIPS = ((r"\bh100", "h100"), (r"\bh200", "h200"), (r"\bb200", "b200"),
          (r"tpu v5 lite|v5e", "v5e"), (r"tpu v5p?$", "v5p"), (r"tpu v4", "v4"),
          (r"tpu v6", "v6e"))


@dataclasses.dataclass
class Row:
    """One step's outcome: "ok", "failed", "cut" (killed when the budget ran out) or
    "skipped" (not started: the budget left was below its estimate), with why and the
    figures."""

    step: str
    status: str
    seconds: float = 0.0
    reason: str = ""
    result: dict[str, Any] = dataclasses.field(default_factory=dict)


def chip_of(device_kind: str) -> str | None:
    """The cost model's chip for a jax device kind, or None (a CPU, an unknown card)."""
    low = device_kind.lower()
    for pattern, chip in _CHIPS:
        if re.search(pattern, low):
            return chip
    return None


def tuned_launches(kernels: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """From a `kernels` step's result: the launch text a tuned step uses, by bias variant,
    and why a variant gets none. The sweep picks each kernel's best launch alone; its
    `combined` row then times forward + backward with those launches against the default.
    A variant whose best launches are the default, failed together, or were not faster
    together is not tuned: its tuned step would measure the untuned step again, and a short
    window is better spent elsewhere. A variant without a combined row (the sweep's budget
    ended first) keeps the per-kernel best."""
    launches = dict(kernels.get("launch_text") or {})
    why_not: dict[str, str] = {}
    for c in kernels.get("combined") or []:
        bias, launch = c.get("bias"), c.get("launch")
        if launches.get(bias) != launch:
            continue
        if launch == c.get("default_launch"):
            why_not[bias] = f"the sweep's best launch is the default ({launch})"
        elif "error" in c:
            why_not[bias] = f"the sweep's best launches failed together: {c['error']}"
        elif c.get("best_ms", 0.0) >= c.get("default_ms", 0.0):
            why_not[bias] = (f"the sweep's best launches together ({launch}) took "
                             f"{c['best_ms']} ms against the default's {c['default_ms']} ms")
        else:
            continue
        del launches[bias]
    return launches, why_not


def _env_code() -> str:
    return ("import json, sys, jax, jaxlib, flax, optax\n"
            "d = jax.devices()\n"
            "out = {'python': sys.version.split()[0], 'jax': jax.__version__, "
            "'jaxlib': jaxlib.__version__, 'flax': flax.__version__, "
            "'optax': optax.__version__, 'platform': d[0].platform, "
            "'device_kind': d[0].device_kind, 'devices': len(d)}\n"
            "from importlib import metadata\n"
            "for name in ('torch', 'transformers', 'gin-config', 'orbax-checkpoint', "
            "'tensorboard'):\n"
            " try:\n  out[name] = metadata.version(name)\n"
            " except metadata.PackageNotFoundError:\n  out[name] = None\n"
            "print('CHECK_JSON ' + json.dumps(out))\n")


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None
         ) -> tuple[int | str, str]:
    """(exit status or "timeout", stdout + stderr) of a child process, killed at `timeout`."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONUNBUFFERED": "1",
                                "XLA_PYTHON_CLIENT_PREALLOCATE": "false", **(env or {})})
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                       for x in (e.stdout, e.stderr))
        return "timeout", text


def _bench_args(step: str, size: str, launch: str = "") -> list[str]:
    rows, tokens = SHAPES[size]
    if step == "mmlm_b64":
        rows *= 2
    args = [f"--gin_file={f}" for f in RUN_FILES[step]]
    args += ["--batch_size", str(rows), "--seq_len", str(tokens),
             "--steps", "2" if size == "tiny" else "10"]
    if size == "tiny":
        args += ["--gin.SIZE='tiny'", "--gin.loop.model_config.dtype='float32'"]
    if launch:
        args.append(f"--gin.loop.model_config.attention_launch='{launch}'")
    return args


def _kept_lines(text: str) -> list[str]:
    keep = ("xlm_jax", "torch/HF", "ratio", "device:", "note:", "profile", "  ", "error",
            "step compiled", "compile")
    return [ln for ln in text.splitlines() if ln.startswith(keep)][-40:]


def _bench_result(text: str) -> dict[str, Any]:
    """The figures of a bench run's printed lines."""
    out: dict[str, Any] = {}
    m = re.search(r"xlm_jax\s*: step\s+([0-9.]+) ms\s+tokens/s\s+([0-9.]+)\s+model TFLOP/s\s+"
                  r"([0-9.]+)\s+MFU (\S+)", text)
    if m:
        out.update(step_ms=float(m.group(1)), tokens_per_s=float(m.group(2)),
                   model_tflops=float(m.group(3)),
                   mfu=float(m.group(4).rstrip("%")) / 100 if m.group(4).endswith("%")
                   else None)
    m = re.search(r"torch/HF : step\s+([0-9.]+) ms\s+tokens/s\s+([0-9.]+)", text)
    if m:
        out.update(torch_step_ms=float(m.group(1)), torch_tokens_per_s=float(m.group(2)))
    m = re.search(r"ratio\s*: .*= ([0-9.]+)", text)
    if m:
        out["ratio_to_transformers"] = float(m.group(1))
    return out


def _predict(dump: str, chip: str | None, seq_len: int, result: dict[str, Any]) -> dict[str, Any]:
    """The cost model's prediction for the train step's HLO that XLA dumped, beside the
    measured step (the model FLOPs are the measured run's, so the MFUs compare)."""
    files = sorted(glob.glob(os.path.join(dump, "*train_step*after_optimizations.txt")),
                   key=os.path.getsize)
    if not files:
        return {"prediction": "n/a: no optimised HLO of the train step was dumped"}
    if chip is None:
        return {"prediction": "n/a: no cost figures for this device"}
    from xlm_jax.accelerator.cost import chips, model

    with open(files[-1]) as f:
        report = model.analyze(f.read(), chips.chip_for(chip), seq_len)
    out = {"predicted_step_ms": round(report.predicted_s * 1e3, 2),
           "predicted_by_kind_ms": {k: round(v * 1e3, 2) for k, v in report.by_kind().items()}}
    if result.get("model_tflops") and result.get("step_ms"):
        flops = result["model_tflops"] * 1e12 * result["step_ms"] / 1e3  # per step
        out["predicted_mfu"] = flops / report.predicted_s / chips.chip_for(chip).bf16_flops
        out["measured_over_predicted"] = result["step_ms"] / (report.predicted_s * 1e3)
    return out


def run_step(step: str, size: str, timeout: float, keep: str | None = None,
             launch: str = "") -> Row:
    """Runs one step in its own process within `timeout` seconds; `keep`: a folder where a
    bench step's HLO dump and profile trace are kept (else they are deleted); `launch`: the
    attention kernels' launch text of a tuned step."""
    start = time.perf_counter()
    py = sys.executable
    if step == "env":
        code, text = _run([py, "-c", _env_code()], timeout)
        row = Row(step, "ok" if code == 0 else "failed")
        m = re.search(r"CHECK_JSON (.*)", text)
        row.result = json.loads(m.group(1)) if m else {"output": text[-500:]}
    elif step == "kernels":
        fd, out = tempfile.mkstemp(prefix="xlm_jax_check_kernels_", suffix=".json")
        os.close(fd)
        try:
            budget = max(1.0, min(SWEEP_BUDGET_S[size], timeout - 20))
            code, text = _run([py, "-m", "xlm_jax.accelerator.kernel_sweep", *SWEEP_ARGS[size],
                               "--budget_s", str(budget), "--json", out], timeout)
            row = Row(step, "ok" if code == 0 else ("timeout" if code == "timeout"
                                                    else "failed"))
            with open(out) as f:
                data = json.load(f) if os.path.getsize(out) else {}
        finally:
            os.unlink(out)
        row.result = {key: data.get(key) for key in ("best", "combined", "complete",
                                                       "launch_text")}
        row.result["rows"] = len(data.get("rows", []))
        row.result["lines"] = [ln for ln in text.splitlines()
                               if ln.startswith(("|", "best", "combined", "budget", "device"))]
    elif step == "smoke":
        rows, tokens = SHAPES[size]
        code, text = _run([py, "-m", "xlm_jax.accelerator.smoke", "--sizes", size,
                           "--num_layers", "2", "--steps", "2", "--batch_size", str(min(rows, 8)),
                           "--seq_len", str(tokens), "--backends", "xla,pallas"], timeout)
        row = Row(step, "ok" if code == 0 else ("timeout" if code == "timeout" else "failed"))
        row.result = {"table": [ln for ln in text.splitlines() if ln.startswith("|")]}
    else:
        args = _bench_args(step, size, launch)
        if step != "transformers":
            args.append("--no_torch")
        dump = tempfile.mkdtemp(prefix="xlm_jax_check_hlo_")
        prof = tempfile.mkdtemp(prefix="xlm_jax_check_prof_")
        if step in PROFILED:
            args += ["--profile_dir", prof]
        env = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
                             " --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*"
                             ).strip()}
        try:
            code, text = _run([py, "-m", "xlm_jax.accelerator.bench", *args], timeout, env)
            row = Row(step, "ok" if code == 0 else ("timeout" if code == "timeout"
                                                    else "failed"))
            row.result = _bench_result(text)
            kind = re.search(r"^device: \d+ x (.*) \((\w+)\);", text, re.M)
            chip = chip_of(kind.group(1)) if kind else None
            if code == 0 and step != "transformers":
                row.result.update(_predict(dump, chip, SHAPES[size][1], row.result))
            row.result["lines"] = _kept_lines(text)
        finally:
            if keep:
                for name, folder in (("hlo", dump), ("profile", prof)):
                    if os.listdir(folder):
                        shutil.move(folder, os.path.join(keep, f"{step}_{name}"))
            shutil.rmtree(dump, ignore_errors=True)
            shutil.rmtree(prof, ignore_errors=True)
    if row.status == "timeout":  # the budget cut it: not a failure of the device or code
        row.status = "cut"
        row.reason = (f"killed at the budget after {time.perf_counter() - start:.0f} s; "
                      f"last line: {(text.strip().splitlines() or ['no output'])[-1][:200]}")
    elif row.status != "ok":
        row.reason = (text.strip().splitlines() or ["no output"])[-1][:300]
    row.seconds = round(time.perf_counter() - start, 1)
    return row


def write_atomic(path: str, text: str) -> None:
    """`text` at `path` through a temporary file and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".check-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def markdown(rows: Sequence[Row], settings: dict[str, Any]) -> str:
    lines = [f"accelerator check: size {settings['size']}, budget {settings['budget_s']} s",
             "", "| step | status | s | step ms | MFU | predicted ms | predicted MFU | "
             "measured / predicted | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r.result.get

        def f(x: Any, spec: str) -> str:
            return "—" if x is None else format(x, spec)

        lines.append(f"| {r.step} | {r.status} | {r.seconds} | {f(g('step_ms'), '.1f')} | "
                     f"{f(g('mfu'), '.1%')} | {f(g('predicted_step_ms'), '.1f')} | "
                     f"{f(g('predicted_mfu'), '.1%')} | "
                     f"{f(g('measured_over_predicted'), '.2f')} | {r.reason} |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.check", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget_s", type=float, required=True,
                   help="seconds for the whole check (steps that would not fit are skipped)")
    p.add_argument("--size", default="base", help=f"model size: {', '.join(SIZES)}")
    p.add_argument("--only", default=None,
                   help=f"comma-separated steps, in this order (default: all: {','.join(STEPS)})")
    p.add_argument("--json", default=None, help="write the rows here (rewritten after each step)")
    p.add_argument("--markdown", default=None, help="write the table here (likewise)")
    p.add_argument("--keep", default=None,
                   help="keep each bench step's optimised HLO and profile trace in this folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    steps = STEPS if args.only is None else tuple(s.strip() for s in args.only.split(","))
    bad = [s for s in steps if s not in STEPS]
    if args.size not in SIZES or bad or not steps:
        what = (f"--size {args.size!r}: not one of {', '.join(SIZES)}" if args.size not in SIZES
                else f"--only {args.only!r}: not steps of {', '.join(STEPS)}")
        print(f"error: {what}", file=sys.stderr)
        return 2
    estimates = ESTIMATE_S[args.size]
    first = estimates.get(steps[0], estimates["default"])
    if args.budget_s < first + RESERVE_S:
        print(f"error: --budget_s {args.budget_s:g}: below the first step's estimate "
              f"({steps[0]}: {first + RESERVE_S:g} s with the results' reserve)",
              file=sys.stderr)
        return 2
    settings = {"size": args.size, "budget_s": args.budget_s, "steps": list(steps)}
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    rows: list[Row] = []
    tuned: dict[str, str] = {}  # the kernel sweep's best launch text by bias variant
    not_tuned: dict[str, str] = {}  # why a bias variant has no tuned launch
    started = time.perf_counter()

    def save(complete: bool) -> None:
        data = {"settings": settings, "complete": complete,
                "rows": [dataclasses.asdict(r) for r in rows]}
        if args.json:
            write_atomic(args.json, json.dumps(data, indent=1))
        if args.markdown:
            write_atomic(args.markdown, markdown(rows, settings))

    for step in steps:
        left = args.budget_s - (time.perf_counter() - started) - RESERVE_S
        need = estimates.get(step, estimates["default"])
        launch = tuned.get(TUNED.get(step, ""), "")
        if step in TUNED and not launch:
            rows.append(Row(step, "skipped", reason="no launch: " + not_tuned.get(
                TUNED[step], f"no kernels step before it measured a best launch of each "
                f"kernel ({TUNED[step]} bias)")))
        elif left < need:
            rows.append(Row(step, "skipped", reason=f"budget: {max(left, 0):.0f} s left, the "
                            f"step needs about {need} s"))
        else:
            row = run_step(step, args.size, left, args.keep, launch)
            if step == "kernels":
                launches, why_not = tuned_launches(row.result)
                tuned.update(launches)
                not_tuned.update(why_not)
            if step in TUNED:
                row.result["attention_launch"] = launch
            rows.append(row)
            if step == "env" and row.status == "ok":
                row.result["cost_chip"] = chip_of(row.result.get("device_kind", ""))
        print(f"{rows[-1].step}: {rows[-1].status} ({rows[-1].seconds} s)"
              f"{'' if not rows[-1].reason else ': ' + rows[-1].reason}", flush=True)
        save(complete=False)
    save(complete=True)
    print(markdown(rows, settings))
    return 1 if any(r.status == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
