"""BTMLM's masked-LM perplexity against the pseudo-token proportion on the embedded demo.

    python docs/experiments/btmlm_proportion.py --out /tmp/btmlm_prop [--steps 200]
        [--proportions 0.05 0.1 0.15 0.2] [--seed 0]

Each run is `python -m xlm_jax.train --gin_file=demo/ernie_m.gin` (MMLM + TLM + CAMLM + BTMLM)
with `BTMLM_PROPORTION` set; the perplexity is exp of BTMLM's stage-2 loss (mean CE over the
masked source tokens) averaged over the logged steps of the last quarter of the run. The
ERNIE-M paper's Fig. 6 varies the proportion from 5% to 20%; this script writes
`btmlm_proportion.png` and `btmlm_proportion.json` into `--out`. Runs whose metrics exist are
not re-run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(out: str, proportion: float, steps: int, seed: int) -> float:
    d = os.path.join(out, f"p{proportion:g}_seed{seed}")
    metrics = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(metrics) or '"step": %d,' % steps not in open(metrics).read():
        cmd = [sys.executable, "-m", "xlm_jax.train", "--gin_file=demo/ernie_m.gin",
               f"--model_dir={d}", f"--gin.BTMLM_PROPORTION={proportion}",
               f"--gin.TRAIN_STEPS={steps}", f"--gin.loop.train.seed={seed}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics)]
    late = [r["btmlm/loss"] for r in rows
            if r.get("split") == "train" and r["step"] > 0.75 * steps and "btmlm/loss" in r]
    return math.exp(sum(late) / len(late))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proportions", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2])
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ppl = {prop: run(a.out, prop, a.steps, a.seed) for prop in a.proportions}
    for prop, value in ppl.items():
        print(f"proportion {prop:.2f}: BTMLM perplexity {value:.1f}")
    with open(os.path.join(a.out, "btmlm_proportion.json"), "w") as f:
        json.dump({"steps": a.steps, "seed": a.seed,
                   "perplexity": {str(k): v for k, v in ppl.items()}}, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot([100 * k for k in ppl], list(ppl.values()), marker="o")
    ax.set_xlabel("pseudo-tokens (% of source length)")
    ax.set_ylabel("BTMLM masked-LM perplexity")
    ax.set_title(f"demo corpus, {a.steps} steps, seed {a.seed}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "btmlm_proportion.png"), dpi=120)
    print(f"wrote {os.path.join(a.out, 'btmlm_proportion.png')}")


if __name__ == "__main__":
    main()
