"""A paper's ablations on the embedded demo, N seeds each.

    python docs/experiments/demo_ablation.py --paper xlme --out /tmp/xlme_abl [--seeds 0 1 2]
    python docs/experiments/demo_ablation.py --paper ernie_m --out /tmp/ernie_abl [--steps 300]

XLM-E: full, without TRTD, without the gated bias. ERNIE-M (its Table 6 mixtures): MMLM,
MMLM + TLM, MMLM + CAMLM, MMLM + CAMLM + BTMLM, all four.
Each run is `python -m xlm_jax.demo --gin_file=demo/PAPER.gin` with the variant's bindings and
`loop.train.seed`; this script reads the runs' retrieval JSONs and prints, per variant, the
Tatoeba-style acc@1 (mean of both directions, averaged over the 30 demo languages) at the best
layer and at every layer, mean +- std over seeds, with the untrained (step 0) model of the
same seed beside it. Runs whose `retrieval_after.json` exists are not re-run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_MODEL = ("{'vocab_size': 8002, 'num_layers': 2, 'hidden_size': 64, 'mlp_dim': 256, "
              "'num_heads': 4, 'ln_style': 'pre', 'dropout_rate': 0.0, 'position_type': %r}")


def _mixture(*names: str) -> list[str]:
    return ["loop.train.objectives = {" + ", ".join(
        f"'{n}': @{n}/loop.ObjectiveSpec()" for n in names) + "}"]


VARIANTS = {
    "xlme": {
        "xlme": [],
        "no_trtd": _mixture("mrtd"),
        "no_gated_bias": [f"loop.model_config.overrides = {DEMO_MODEL % 'absolute'}"],
    },
    "ernie_m": {
        "mmlm": _mixture("mmlm"),
        "mmlm_tlm": _mixture("mmlm", "tlm"),
        "mmlm_camlm": _mixture("mmlm", "camlm"),
        "mmlm_camlm_btmlm": _mixture("mmlm", "camlm", "btmlm"),
        "full": [],
    },
}


def run(out: str, paper: str, variant: str, seed: int, steps: int) -> dict:
    d = os.path.join(out, f"{variant}_seed{seed}")
    after = os.path.join(d, "retrieval_after.json")
    if not os.path.exists(after):
        binds = VARIANTS[paper][variant] + [f"loop.train.seed = {seed}", f"TRAIN_STEPS = {steps}"]
        cmd = [sys.executable, "-m", "xlm_jax.demo", f"--gin_file=demo/{paper}.gin",
               f"--model_dir={d}"] + [f"--gin_bindings={b}" for b in binds]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return {k: json.load(open(os.path.join(d, f"retrieval_{k}.json"))) for k in ("before", "after")}


def fmt(xs: list[float]) -> str:
    return f"{statistics.mean(xs):5.1f} +- {statistics.stdev(xs) if len(xs) > 1 else 0.0:3.1f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--paper", choices=sorted(VARIANTS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--variants", nargs="+", default=None)
    a = p.parse_args()
    rows, summary = [], {}
    variants = a.variants or list(VARIANTS[a.paper])
    for s in a.seeds:  # seed-major: a stopped sweep leaves whole seeds
        for v in variants:
            run(a.out, a.paper, v, s, a.steps)
    for v in variants:
        res = [run(a.out, a.paper, v, s, a.steps) for s in a.seeds]
        best = [100 * r["after"]["per_layer"][str(r["after"]["best_layer"])] for r in res]
        before = [100 * max(r["before"]["per_layer"].values()) for r in res]
        layers = sorted(res[0]["after"]["per_layer"], key=int)
        sweep = {ly: [100 * r["after"]["per_layer"][ly] for r in res] for ly in layers}
        summary[v] = {"best": best, "before_best": before, "sweep": sweep,
                      "best_layers": [r["after"]["best_layer"] for r in res]}
        rows.append(f"| {v} | {fmt(before)} | {fmt(best)} (layers {summary[v]['best_layers']}) | "
                    + " | ".join(fmt(sweep[ly]) for ly in layers) + " |")
    print(f"acc@1 (%), mean +- std over seeds {a.seeds}, {a.steps} steps")
    print("| variant | step 0 (best layer) | trained (best layer) | "
          + " | ".join(f"layer {ly}" for ly in layers) + " |")
    print("|---|---|---|" + "---|" * len(layers))
    print("\n".join(rows))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
