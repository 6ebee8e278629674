"""The objective league's outputs: league.json, league.md (the table) and league.png.

`league_json` gathers the base's scores and every finished cell's (xlm_jax/league.py), with each
recipe's mean and standard deviation over its seeds (numpy's `std`, ddof 0, as
`xlm_jax.finetune`'s results); `write_all` writes the three files (atomically: a kill leaves
the previous version). Rewritten after every cell, so a running league always has a partial
table.
"""
from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlm_jax import league_plan as plan

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
    if not league["complete"]:
        lines += ["Partial: the league is still running (or was stopped); the same command "
                  "resumes it.", ""]
    return "\n".join(lines)


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
    from xlm_jax.league_score import write_json_atomic

    write_json_atomic(os.path.join(out, "league.json"), league)
    tmp = os.path.join(out, f"league.md.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(markdown(league))
    os.replace(tmp, os.path.join(out, "league.md"))
    plot(league, os.path.join(out, "league.png"))
