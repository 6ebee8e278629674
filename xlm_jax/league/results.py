"""The objective league's outputs: league.json, league.md (the table) and league.png.

`league_json` gathers the base's scores and every finished cell's (xlm_jax/league/runner.py), with
each recipe's mean and standard deviation over its seeds (numpy's `std`, ddof 0, as
`xlm_jax.finetune`'s results); `write_all` writes the three files (atomically: a kill leaves
the previous version). Rewritten after every cell, so a running league always has a partial
table. `claims_table` tests the papers' claims (`CLAIMS`) each against its matching baseline
recipe: the difference of the seed means, its spread and Welch's t-test over the seeds.
"""
from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlm_jax.league import plan

@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper's claim that the league can test: `recipe` beats `baseline` (both continued
    from the base with the same training FLOPs) on each of `metrics` (a cell field such as
    "transfer_avg", or "retrieval_layer:K" for retrieval at layer K). `source` names the
    paper's table and rows; `confounds` what else differs between the two recipes."""
    text: str
    source: str
    recipe: str
    baseline: str
    metrics: tuple[str, ...]
    confounds: str


# The claims of the papers that the league's recipes test, each against the recipe that lacks
# only what the claim is about (the pairing is our choice; the sources are the papers').
CLAIMS: tuple[Claim, ...] = (
    Claim("TLM adds to MMLM", "XLM (Conneau & Lample 2019) Table 1, MLM vs MLM + TLM; "
          "InfoXLM Table 7, row -TLM", "xlm", "mmlm", ("transfer_avg", "retrieval_acc1"),
          "equal FLOPs: xlm takes half mmlm's steps (a TLM batch beside each MMLM batch) and "
          "reads the parallel pairs mmlm never sees"),
    Claim("XLCo adds to MMLM + TLM", "InfoXLM Table 7, INFOXLM15 vs row -XLCo", "infoxlm",
          "xlm", ("transfer_avg", "retrieval_acc1", "retrieval_layer:3"),
          "equal FLOPs: 84 vs 120 steps; XLCo reads the mixup stream's pairs besides; "
          "everything else as xlm (league/infoxlm.gin); layer 3 is XLCo's universal layer"),
    Claim("TRTD adds to MRTD", "XLM-E Table 2, XLM-E vs row -TRTD", "xlme", "xlme_no_trtd",
          ("transfer_avg", "retrieval_acc1"),
          "equal FLOPs: 98 vs 196 steps; TRTD reads the parallel pairs"),
    Claim("CAMLM + BTMLM add to MMLM + TLM", "ERNIE-M Table 6, exp5 vs exp2", "ernie_m", "xlm",
          ("transfer_avg", "retrieval_acc1"),
          "equal FLOPs: 53 vs 120 steps; ERNIE-M adds a language-embedding table, new at "
          "the continuation, and BTMLM's generated pairs"),
    Claim("VECO's encoder transfers better than an MLM encoder", "VECO Table 2, VECO vs XLM-R",
          "veco", "mmlm", ("transfer_avg", "retrieval_acc1"),
          "equal FLOPs: 44 vs 240 steps; VECO adds cross-attention (new at the continuation), "
          "TLM and the parallel pairs; the paper's XLM-R differs in data and steps too"),
)

# Welch's t-test at this level calls a difference significant (our choice, stated in the table)
SIGNIFICANCE = 0.05

# The per-seed numbers summarised as mean and std for every recipe.
SUMMARISED = ("train_tflop", "retrieval_acc1", "transfer_avg", "transfer_en", "transfer_gap",
              "train_seconds", "score_seconds")


def summarise(cells: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(mean, std) over `cells` of every `SUMMARISED` field and of each layer's retrieval;
    None where a field is missing (no transfer task) or no cell is done."""
    mean: dict[str, Any] = {}
    std: dict[str, Any] = {}
    for key in SUMMARISED:
        values = [c[key] for c in cells if c.get(key) is not None]
        mean[key] = float(np.mean(values)) if values and len(values) == len(cells) else None
        std[key] = float(np.std(values)) if values and len(values) == len(cells) else None
    layers = sorted({k for c in cells for k in c["retrieval_per_layer"]}, key=int)
    mean["retrieval_per_layer"] = {k: float(np.mean([c["retrieval_per_layer"][k]
                                                     for c in cells])) for k in layers}
    std["retrieval_per_layer"] = {k: float(np.std([c["retrieval_per_layer"][k]
                                                   for c in cells])) for k in layers}
    return mean, std


def league_json(p: Any, base: dict[str, Any], done: Sequence[Any], command: str
                ) -> dict[str, Any]:
    """What league.json holds: settings, machine, command, the base (with its masked-LM
    check), and per recipe its cost, its per-seed cells (finished ones) and their mean/std."""
    recipes: dict[str, Any] = {}
    for r in p.settings.recipes:
        planned = [c for c in p.cells if c.recipe == r]
        cells = [dataclasses.asdict(c) for c in done if c.recipe == r]
        mean, std = summarise(cells) if cells else ({}, {})
        recipes[r] = {"title": plan.RECIPE_TITLES[r], "gin_files": list(p.config.recipe_gin(r)),
                      "steps": planned[0].steps, "cycle": planned[0].cost.cycle,
                      "flops_per_token": planned[0].cost.flops_per_token,
                      "tokens_per_step": planned[0].cost.tokens_per_step,
                      "train_tflop": planned[0].train_tflop,
                      "seeds_planned": len(planned), "seeds_done": len(cells),
                      "cells": cells, "mean": mean, "std": std}
    return {"command": command,
            "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), {_device()}",
            "settings": p.settings.to_json(),
            "base": {**base, "train_tflop": p.base_cost.train_flops(base["steps"]) / 1e12,
                     "flops_per_token": p.base_cost.flops_per_token,
                     "tokens_per_step": p.base_cost.tokens_per_step},
            "control": plan.CONTROL if plan.CONTROL in recipes else None,
            "recipes": recipes,
            "complete": all(v["seeds_done"] == v["seeds_planned"] for v in recipes.values())}


def _device() -> str:
    try:
        import jax

        d = jax.devices()[0]
        return f"jax {d.platform} ({d.device_kind})"
    except Exception:  # noqa: BLE001 - informational
        return "jax device unknown"


def _pm(mean: Any, std: Any, digits: int = 1) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def markdown(league: dict[str, Any]) -> str:
    """The table: one row per recipe (means ± std over its finished seeds), the base row, the
    per-layer retrieval curves and the base's masked-LM check."""
    base, recipes = league["base"], league["recipes"]
    control = recipes.get(league.get("control") or "", {}).get("mean", {})
    lines = [f"# Objective league\n",
             f"Command: `{league['command']}`  ",
             f"Machine: {league['machine']}  ",
             f"Budget per recipe: {league['settings']['budget_tflop']:g} training TFLOP "
             f"(the trainer's count); base: {base['steps']} steps of MMLM "
             f"({base['train_tflop']:.3g} TFLOP).\n",
             "Retrieval: Tatoeba acc@1 (%), best layer, mean of both directions over the "
             "held-out languages. Transfer: the demo transfer task, English-trained, zero-shot "
             "accuracy (%) averaged over the other languages, and the gap (English minus that "
             "average), each over 3 fine-tuning seeds. Mean ± std over training seeds.\n",
             "| recipe | seeds | steps | train TFLOP | retrieval acc@1 | Δ vs control | "
             "transfer avg | Δ vs control | transfer gap | train min / seed |",
             "|---|---|---|---|---|---|---|---|---|---|",
             f"| base (MMLM, before continuing) | - | {base['steps']} | "
             f"{base['train_tflop']:.3g} | {_pm(base['retrieval_acc1'], None)} | - | "
             f"{_pm(base['transfer_avg'], None)} | - | {_pm(base['transfer_gap'], None)} | "
             f"{_minutes(base.get('train_seconds'))} |"]
    for name, r in recipes.items():
        m, s = r["mean"], r["std"]
        lines.append(
            f"| {name} | {r['seeds_done']}/{r['seeds_planned']} | {r['steps']} | "
            f"{r['train_tflop']:.3g} | {_pm(m.get('retrieval_acc1'), s.get('retrieval_acc1'))} "
            f"| {_delta(m.get('retrieval_acc1'), control.get('retrieval_acc1'), name, league)} "
            f"| {_pm(m.get('transfer_avg'), s.get('transfer_avg'))} "
            f"| {_delta(m.get('transfer_avg'), control.get('transfer_avg'), name, league)} "
            f"| {_pm(m.get('transfer_gap'), s.get('transfer_gap'))} "
            f"| {_minutes(m.get('train_seconds'))} |")
    layers = sorted({k for r in recipes.values() for k in r["mean"].get("retrieval_per_layer",
                                                                         {})}, key=int)
    lines += ["", "Retrieval acc@1 (%) per layer (0 = embeddings), mean over seeds:", "",
              "| model | " + " | ".join(f"layer {k}" for k in layers) + " |",
              "|---|" + "---|" * len(layers),
              "| base | " + " | ".join(f"{base['retrieval_per_layer'].get(k, float('nan')):.1f}"
                                      for k in layers) + " |"]
    for name, r in recipes.items():
        curve = r["mean"].get("retrieval_per_layer", {})
        if curve:
            lines.append(f"| {name} | " + " | ".join(f"{curve[k]:.1f}" for k in layers) + " |")
    mlm = base["mlm"]
    lines += ["", "The base's held-out masked LM (15% of the held-out sentences' tokens masked, "
              f"{mlm['targets']} targets in {mlm['sentences']} sentences):", "",
              "| | loss (nats) | accuracy (%) |", "|---|---|---|",
              f"| the base | {mlm['loss']:.3f} | {100 * mlm['accuracy']:.1f} |",
              f"| context-free: unigram entropy / most frequent token "
              f"({mlm['most_frequent_token']!r}) | {mlm['unigram_entropy']:.3f} | "
              f"{100 * mlm['most_frequent_rate']:.1f} |",
              f"| knowing only the language: per-language unigram entropy / most frequent | "
              f"{mlm['language_unigram_entropy']:.3f} | "
              f"{100 * mlm['language_most_frequent_rate']:.1f} |", "",
              "Uses context (loss below the unigram entropy and accuracy above the most frequent "
              f"token's rate): {'yes' if mlm['uses_context'] else 'NO'}; beyond identifying the "
              "language (both below/above the per-language yardsticks): "
              f"{'yes' if mlm.get('beyond_language') else 'NO'}.", ""]
    lines += claims_table(league)
    if not league["complete"]:
        lines += ["Partial: the league is still running (or was stopped); the same command "
                  "resumes it.", ""]
    return "\n".join(lines)


def _seed_values(cells: Sequence[dict[str, Any]], metric: str) -> list[float]:
    """One number per finished seed: a cell field, or "retrieval_layer:K"."""
    if metric.startswith("retrieval_layer:"):
        layer = metric.split(":", 1)[1]
        return [float(c["retrieval_per_layer"][layer]) for c in cells
                if layer in c.get("retrieval_per_layer", {})]
    return [float(c[metric]) for c in cells if c.get(metric) is not None]


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    """One claim on one metric: the seed means and (ddof 0) stds of recipe and baseline, the
    difference of the means, Welch's t statistic and two-sided p-value (None below two seeds
    a side), and the verdict: "holds", "reversed" (significant either way) or "not shown"."""
    claim: Claim
    metric: str
    mean: float
    std: float
    base_mean: float
    base_std: float
    seeds: tuple[int, int]
    diff: float
    t: float | None
    p: float | None
    verdict: str


def evaluate_claims(league: dict[str, Any], claims: Sequence[Claim] = CLAIMS
                ) -> list[ClaimResult]:
    """Every claim whose two recipes have finished seeds, on each of its metrics: Welch's
    unequal-variance t-test over the per-seed values (scipy's `ttest_ind`, equal_var=False),
    significant below `SIGNIFICANCE`."""
    from scipy import stats

    out = []
    recipes = league["recipes"]
    for claim in claims:
        if claim.recipe not in recipes or claim.baseline not in recipes:
            continue
        for metric in claim.metrics:
            a = _seed_values(recipes[claim.recipe]["cells"], metric)
            b = _seed_values(recipes[claim.baseline]["cells"], metric)
            if not a or not b:
                continue
            t = p = None
            if len(a) > 1 and len(b) > 1:
                res = stats.ttest_ind(a, b, equal_var=False)
                t, p = float(res.statistic), float(res.pvalue)
            diff = float(np.mean(a) - np.mean(b))
            verdict = ("not shown" if p is None or not p < SIGNIFICANCE
                       else "holds" if diff > 0 else "reversed")
            out.append(ClaimResult(claim, metric, float(np.mean(a)), float(np.std(a)),
                                   float(np.mean(b)), float(np.std(b)), (len(a), len(b)),
                                   diff, t, p, verdict))
    return out


def _metric_title(metric: str) -> str:
    if metric.startswith("retrieval_layer:"):
        return f"retrieval at layer {metric.split(':', 1)[1]}"
    return {"transfer_avg": "transfer avg", "retrieval_acc1": "retrieval (best layer)"}.get(
        metric, metric)


def claims_table(league: dict[str, Any]) -> list[str]:
    """Markdown lines: one row per claim and metric (empty when no claim can be tested)."""
    results = evaluate_claims(league)
    if not results:
        return []
    lines = ["The papers' claims, each recipe against the recipe that lacks what the claim is "
             "about, at equal training FLOPs. Mean ± std (ddof 0) over the training seeds; "
             f"Welch's two-sided t-test over the seeds (scipy, unequal variances); p < "
             f"{SIGNIFICANCE:g} is called significant. With 3 seeds a side the test sees only "
             "large effects: \"not shown\" is not \"false\".", "",
             "| claim | source | recipe vs baseline | metric | recipe | baseline | difference "
             "| Welch t, p | verdict | confounds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.claim
        test = "-" if r.p is None else f"{r.t:.2f}, {r.p:.3f}"
        lines.append(f"| {c.text} | {c.source} | {c.recipe} vs {c.baseline} "
                     f"({r.seeds[0]} vs {r.seeds[1]} seeds) | {_metric_title(r.metric)} | "
                     f"{r.mean:.2f} ± {r.std:.2f} | {r.base_mean:.2f} ± {r.base_std:.2f} | "
                     f"{r.diff:+.2f} | {test} | {r.verdict} | {c.confounds} |")
    return lines + [""]


def _delta(value: Any, control: Any, name: str, league: dict[str, Any]) -> str:
    if value is None or control is None or name == league.get("control"):
        return "-"
    return f"{value - control:+.1f}"


def _minutes(seconds: Any) -> str:
    return "-" if seconds is None or seconds != seconds else f"{seconds / 60:.1f}"


def plot(league: dict[str, Any], path: str) -> None:
    """Retrieval and transfer against training TFLOPs (the base at 0, every seed and the
    recipe's mean ± std at its continuation), and each recipe's per-layer retrieval curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, recipes = league["base"], league["recipes"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colours = plt.get_cmap("tab10")
    for panel, (key, title) in enumerate((("retrieval_acc1", "Tatoeba acc@1 (%), best layer"),
                                          ("transfer_avg", "zero-shot transfer accuracy (%)"))):
        ax = axes[panel]
        if base.get(key) is not None:
            ax.scatter([0], [base[key]], color="black", marker="s", zorder=3, label="base")
        for i, (name, r) in enumerate(recipes.items()):
            pts = [(c["train_tflop"], c[key]) for c in r["cells"] if c.get(key) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, color=colours(i), alpha=0.4, s=14)
            mx, my, sy = np.mean(xs), r["mean"].get(key), r["std"].get(key)
            if my is not None:
                ax.errorbar([mx], [my], yerr=[sy], color=colours(i), marker="o", capsize=3,
                            label=name)
                if base.get(key) is not None:
                    ax.plot([0, mx], [base[key], my], color=colours(i), alpha=0.3)
        ax.set_xlabel("training TFLOP of the continuation (the base at 0)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax = axes[2]
    layers = sorted(base["retrieval_per_layer"], key=int)
    ax.plot([int(k) for k in layers], [base["retrieval_per_layer"][k] for k in layers],
            color="black", marker="s", label="base")
    for i, (name, r) in enumerate(recipes.items()):
        curve = r["mean"].get("retrieval_per_layer", {})
        if curve:
            ks = sorted(curve, key=int)
            ax.plot([int(k) for k in ks], [curve[k] for k in ks], color=colours(i),
                    marker="o", label=name)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_title("Tatoeba acc@1 (%) per layer, mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Objective league: every recipe from one base, "
                 f"{league['settings']['budget_tflop']:g} TFLOP each")
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def write_all(out: str, league: dict[str, Any]) -> None:
    """league.json, league.md and league.png in `out`, each written atomically."""
    from xlm_jax.league.score import write_json_atomic

    write_json_atomic(os.path.join(out, "league.json"), league)
    tmp = os.path.join(out, f"league.md.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(markdown(league))
    os.replace(tmp, os.path.join(out, "league.md"))
    plot(league, os.path.join(out, "league.png"))
