"""VECO initialisation vs random initialisation for translation on the embedded demo.

    python docs/experiments/veco_translation.py --out /tmp/veco_mt [--veco_dir DIR]
        [--langs de fr] [--seeds 0 1] [--steps 600]

First pre-trains the demo VECO model (`python -m xlm_jax.train --gin_file=demo/veco.gin`) unless
`--veco_dir` names one; then, per language xx, seed and initialisation, fine-tunes
`demo/veco_translate.gin` on `demo_veco_parallel_en_xx` for `--steps` steps and scores en -> xx
on the held-out `tatoeba.xx-eng` file with sacreBLEU. Prints BLEU mean +- std over seeds per
language and initialisation (the VECO paper's Table 4 direction: VECO initialisation beats
random), and the teacher-forced accuracy and NLL of each run's last training step. Runs
whose `bleu.json` exists are not re-run. Measured figures: docs/NOTES.md, "VECO".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TATOEBA = "tasks/demo_data/tatoeba"


def run_dir(out: str, lang: str, seed: int, init: str | None) -> str:
    return os.path.join(out, f"{lang}_{'veco' if init else 'random'}_seed{seed}")


def last_train_metrics(d: str) -> dict[str, float]:
    """The teacher-forced token accuracy and NLL of the run's last logged training step."""
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    last = [r for r in rows if r.get("split") == "train"][-1]
    return {"accuracy": last["translate/accuracy"], "nll": last["translate/nll"]}


def run(out: str, lang: str, seed: int, init: str | None, steps: int) -> float:
    d = run_dir(out, lang, seed, init)
    bleu = os.path.join(d, "bleu.json")
    if not os.path.exists(bleu):
        cmd = [sys.executable, "-m", "xlm_jax.translate", "--gin_file=demo/veco_translate.gin",
               f"--model_dir={d}", f"--gin.PAIR_TASK='demo_veco_parallel_en_{lang}'",
               f"--gin.TARGET_LANG='{lang}'",
               f"--gin.SOURCE_FILE='{TATOEBA}/tatoeba.{lang}-eng.eng'",
               f"--gin.TARGET_FILE='{TATOEBA}/tatoeba.{lang}-eng.{lang}'",
               f"--gin.TRAIN_STEPS={steps}", f"--gin.loop.train.seed={seed}"]
        if init:
            cmd.append(f"--init_from={init}")
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.load(open(bleu))["bleu"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--veco_dir", default=None)
    p.add_argument("--langs", nargs="+", default=["de", "fr"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=600)
    a = p.parse_args()
    veco = a.veco_dir or os.path.join(a.out, "veco_pretrain")
    if not a.veco_dir and not os.path.exists(os.path.join(veco, "checkpoints")):
        subprocess.run([sys.executable, "-m", "xlm_jax.train", "--gin_file=demo/veco.gin",
                        f"--model_dir={veco}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows, summary = [], {}
    for lang in a.langs:  # language-major, each seed's pair of runs together
        for s in a.seeds:
            for init in (veco, None):
                run(a.out, lang, s, init, a.steps)
    for lang in a.langs:
        for init in (veco, None):
            scores = [run(a.out, lang, s, init, a.steps) for s in a.seeds]
            tf = [last_train_metrics(run_dir(a.out, lang, s, init)) for s in a.seeds]
            name = "VECO" if init else "random"
            summary[f"{lang}/{name}"] = {"bleu": scores, "train": tf}

            def ms(xs: list[float], scale: float = 1.0) -> str:
                sd = statistics.stdev(xs) * scale if len(xs) > 1 else 0.0
                return f"{statistics.mean(xs) * scale:.2f} +- {sd:.2f}"

            rows.append(f"| en-{lang} | {name} | {ms(scores)} | "
                        f"{', '.join(f'{x:.2f}' for x in scores)} | "
                        f"{ms([m['accuracy'] for m in tf], 100)} | {ms([m['nll'] for m in tf])} |")
    print(f"sacreBLEU on the held-out file, en -> xx, {a.steps} fine-tuning steps, seeds "
          f"{a.seeds}; teacher-forced token accuracy (%) and NLL of the last training step")
    print("| pair | initialisation | BLEU mean +- std | per seed | train accuracy | train NLL |"
          "\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"steps": a.steps, "seeds": a.seeds, "results": summary}, f, indent=2)


if __name__ == "__main__":
    main()
