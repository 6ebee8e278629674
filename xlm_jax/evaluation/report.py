"""The demo's report: a before/after retrieval table and one PNG (loss curves + acc@1 bars).

    python -m xlm_jax.evaluation.report --model_dir DIR --before before.json \
        --after after.json --out report.png

`model_dir/metrics.jsonl` is the trainer's metrics log, one JSON object per line such as
`{"step": 10, "split": "train", "mmlm/loss": 5.1, "tlm/loss": 5.3, "loss": 10.4, ...}`; every
key ending in `loss` is drawn against `step` (splits other than `train` are labelled with their
split). `before.json`/`after.json` are written by `python -m xlm_jax.evaluation.retrieval`.
The table's numbers are acc@1 in percent, averaged over both directions (xx->eng, eng->xx);
the average row is the results' own average over languages and directions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import numpy as np
from etils import epath

from xlm_jax import cli_help
from xlm_jax.evaluation.retrieval import RetrievalResult

METRICS_FILE = "metrics.jsonl"  # xlm_jax.model_dir.METRICS_FILE (not imported: it needs jax)


@dataclasses.dataclass(frozen=True)
class LossCurve:
    """One loss series of the metrics log: its label (`key`, or `split: key`) and points."""

    label: str
    steps: list[int]
    values: list[float]


def find_metrics_files(model_dir: str) -> list[str]:
    """`model_dir/metrics.jsonl`, else the per-run `metrics.<time>.jsonl` files the trainer
    writes where it cannot append (object stores), oldest first."""
    root = epath.Path(model_dir)  # local or gs://, as xlm_jax.model_dir.resolve gives
    path = os.fspath(root / METRICS_FILE)
    if (root / METRICS_FILE).is_file():
        return [path]
    runs = sorted(os.fspath(p) for p in root.glob("metrics.*.jsonl")) if root.is_dir() else []
    if runs:
        return runs
    raise FileNotFoundError(f"{path}: metrics log not found (the trainer writes {METRICS_FILE} "
                            "into its model_dir)")


def read_loss_curves(paths: str | list[str]) -> list[LossCurve]:
    """Every key ending in `loss` of one or more metrics.jsonl files, per split, by step.

    Blank lines are skipped; a line that is not a JSON object with an integer `step` is an
    error naming the file and line. A step logged twice (a resumed run) keeps its last value.
    Non-finite values (a diverged step) are kept out of the curve rather than breaking the
    plot's scale.
    """
    series: dict[tuple[str, str], dict[int, float]] = {}
    for path in [paths] if isinstance(paths, str) else paths:
        if not epath.Path(path).is_file():
            raise FileNotFoundError(f"{path}: metrics log not found")
        _read_metrics_file(path, series)
    curves = []
    for (split, key), points in sorted(series.items(), key=lambda kv: (kv[0][0] != "train", kv[0])):
        steps = sorted(points)
        label = key if split == "train" else f"{split}: {key}"
        curves.append(LossCurve(label, steps, [points[s] for s in steps]))
    return curves


def _read_metrics_file(path: str, series: dict[tuple[str, str], dict[int, float]]) -> None:
    with epath.Path(path).open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {row!r:.60}")
            step = row.get("step")
            if isinstance(step, bool) or not (isinstance(step, int) or (
                    isinstance(step, float) and step.is_integer())):
                raise ValueError(f"{path}:{lineno}: missing or non-integer 'step' ({step!r})")
            split = str(row.get("split", "train"))
            for key, value in row.items():
                if not key.endswith("loss") or isinstance(value, bool):
                    continue
                if not isinstance(value, (int, float)):
                    raise ValueError(f"{path}:{lineno}: {key}={value!r} is not a number")
                if math.isfinite(value):
                    series.setdefault((split, key), {})[int(step)] = float(value)


@dataclasses.dataclass(frozen=True)
class ReportRow:
    """One language's acc@1 (fraction, mean of both directions); None where not evaluated."""

    language: str
    before: float | None
    after: float | None

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


def report_rows(before: RetrievalResult, after: RetrievalResult) -> list[ReportRow]:
    """Per-language rows (union of both results' languages, sorted) plus an `average` row."""
    langs = sorted(set(before.per_language) | set(after.per_language))
    rows = [ReportRow(lang,
                      before.per_language[lang].mean if lang in before.per_language else None,
                      after.per_language[lang].mean if lang in after.per_language else None)
            for lang in langs]
    rows.append(ReportRow("average", before.average, after.average))
    return rows


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def format_table(before: RetrievalResult, after: RetrievalResult) -> str:
    """A fixed-width table of acc@1 (%) before, after and the change, per language."""
    rows = report_rows(before, after)
    width = max(8, *(len(r.language) for r in rows))
    lines = [f"Tatoeba acc@1 (%), mean of xx->eng and eng->xx "
             f"(before: layer {before.reported_layer}, after: layer {after.reported_layer})",
             f"{'language':<{width}}  {'before':>7}  {'after':>7}  {'delta':>7}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        if r.language == "average":
            lines.append("-" * len(lines[1]))
        lines.append(f"{r.language:<{width}}  {_pct(r.before):>7}  {_pct(r.after):>7}  "
                     f"{_pct(r.delta, signed=True):>7}")
    return "\n".join(lines)


def plot_report(curves: list[LossCurve], before: RetrievalResult, after: RetrievalResult,
                out_png: str, title: str | None = None) -> str:
    """Writes the two-panel PNG: loss curves (left) and acc@1 bars before vs after (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = report_rows(before, after)
    acc_width = max(6.0, 0.32 * len(rows))  # room for ~30 language pairs of bars
    fig = Figure(figsize=(6.0 + acc_width, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax_loss, ax_acc = fig.subplots(1, 2, width_ratios=[6.0, acc_width])
    for c in curves:
        ax_loss.plot(c.steps, c.values, lw=1.8 if c.label == "loss" else 1.1,
                     marker="." if len(c.steps) < 30 else None, label=c.label)
    if not curves:
        ax_loss.text(0.5, 0.5, "no loss values in the metrics log", ha="center",
                     transform=ax_loss.transAxes)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("training loss")
    ax_loss.grid(alpha=0.3)
    if curves:
        ax_loss.legend(fontsize=8)

    x = np.arange(len(rows))
    b = [100 * (r.before or 0.0) for r in rows]
    a = [100 * (r.after or 0.0) for r in rows]
    ax_acc.bar(x - 0.2, b, 0.4, label=f"before (layer {before.reported_layer})", color="#9aa7b8")
    ax_acc.bar(x + 0.2, a, 0.4, label=f"after (layer {after.reported_layer})", color="#2a6fdb")
    for xi, r in zip(x, rows):
        if r.after is not None and len(rows) <= 12:
            ax_acc.text(xi + 0.2, 100 * r.after + 1, f"{100 * r.after:.0f}", ha="center",
                        fontsize=7)
    ax_acc.set_xticks(x)
    ax_acc.set_xticklabels([r.language for r in rows], rotation=90 if len(rows) > 8 else 0,
                           fontweight=None)
    ax_acc.get_xticklabels()[-1].set_fontweight("bold")  # the average
    ax_acc.set_ylabel("Tatoeba acc@1 (%)")
    ax_acc.set_ylim(0, 105)
    ax_acc.set_title("retrieval before vs after pre-training")
    ax_acc.grid(axis="y", alpha=0.3)
    ax_acc.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, format="png")
    return out_png


def write_report(model_dir: str, before: RetrievalResult, after: RetrievalResult,
                 out_png: str) -> str:
    """Writes `out_png` (loss curves from `model_dir/metrics.jsonl` + before/after acc@1 bars)
    and returns the printable before/after table."""
    curves = read_loss_curves(find_metrics_files(model_dir))
    name = os.path.basename(os.path.abspath(model_dir))
    plot_report(curves, before, after, out_png, title=f"model_dir: {name}")
    return format_table(before, after)


def main(argv: list[str] | None = None) -> int:
    p = cli_help.Parser(prog="python -m xlm_jax.evaluation.report",
                        description=__doc__.split("\n\n")[1],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", required=True, help=f"trainer model_dir with {METRICS_FILE}")
    p.add_argument("--before", required=True, help="retrieval JSON of the untrained model")
    p.add_argument("--after", required=True, help="retrieval JSON of the trained model")
    p.add_argument("--out", required=True, help="output PNG")
    args = p.parse_args(argv)
    try:
        before = RetrievalResult.load(args.before)
        after = RetrievalResult.load(args.after)
        table = write_report(args.model_dir, before, after, args.out)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    print(f"report -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
