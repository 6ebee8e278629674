"""Where a demo model's retrieval goes: the word table and layer 0 of its checkpoints.

    python docs/experiments/embedding_drift.py --model_dir DIR --steps 0,100,500

For each checkpoint step of a trainer model_dir, prints
- the word table's mean row norm, the mean pairwise cosine of 2000 random rows and the norm of
  the table's mean row (a direction shared by every token shows as a cosine above 0);
- the absolute position table's mean row norm, when the model has one;
- Tatoeba-style acc@1 on the demo's held-out split (mean of both directions, averaged over its
  languages) for: layer 0 and the last layer as the demo scores them (mean pooling); the bag of
  word vectors alone (the table rows of the sentence's pieces, averaged; no positions, no
  `<s>`/`</s>`); that bag and layer 0 each centred on its language's mean vector.

Centring removes a direction common to one side's sentences; if retrieval comes back with it,
the trained model lost the lexical signal to a shared offset, otherwise to the table's learned
structure. This is a diagnostic, not an evaluation protocol: the demo and the library score
retrieval without centring.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from xlm_jax.encoder import load_encoder  # noqa: E402
from xlm_jax.evaluation import retrieval  # noqa: E402


def both_ways(a: np.ndarray, b: np.ndarray) -> float:
    """acc@1 (%) averaged over a -> b and b -> a, as the library's `LanguageScore.mean`."""
    score = retrieval.LanguageScore(retrieval.retrieval_accuracy(a, b),
                                    retrieval.retrieval_accuracy(b, a), len(a))
    return 100.0 * score.mean


def centred(v: np.ndarray) -> np.ndarray:
    return v - v.mean(axis=0, keepdims=True)


def table_stats(table: np.ndarray, rows: int = 2000, seed: int = 0) -> dict[str, float]:
    """Mean row norm, mean pairwise cosine of `rows` random rows, norm of the mean row."""
    pick = np.random.default_rng(seed).choice(len(table), min(rows, len(table)), replace=False)
    unit = table[pick] / np.linalg.norm(table[pick], axis=1, keepdims=True)
    cos = (unit @ unit.T)[np.triu_indices(len(pick), 1)].mean()
    return {"row_norm": float(np.linalg.norm(table, axis=1).mean()), "mean_cos": float(cos),
            "mean_row_norm": float(np.linalg.norm(table.mean(axis=0)))}


def checkpoint_report(model_dir: str, step: int, tatoeba_dir: str) -> str:
    enc = load_encoder(model_dir, step=step)
    emb = enc.params["embeddings"]
    table = np.asarray(emb["word_embeddings"]["embedding"], np.float32)
    pos = emb.get("position_embeddings")
    stats = table_stats(table)
    last = enc.config.num_layers

    def bag(sentences: list[str]) -> np.ndarray:
        out = np.zeros((len(sentences), table.shape[1]), np.float32)
        for i, s in enumerate(sentences):
            ids = enc.tokenizer.encode(s)
            if len(ids):
                out[i] = table[ids].mean(axis=0)
        return out

    scores: dict[str, list[float]] = {k: [] for k in (
        "layer0", f"layer{last}", "bag", "bag_centred", "layer0_centred")}
    for lang in retrieval.find_languages(tatoeba_dir):
        pair = retrieval.read_pair(tatoeba_dir, lang)
        src = retrieval.embed_layers(enc, pair.src, [0, last])
        eng = retrieval.embed_layers(enc, pair.eng, [0, last])
        scores["layer0"].append(both_ways(src[0], eng[0]))
        scores[f"layer{last}"].append(both_ways(src[1], eng[1]))
        bs, be = bag(pair.src), bag(pair.eng)
        scores["bag"].append(both_ways(bs, be))
        scores["bag_centred"].append(both_ways(centred(bs), centred(be)))
        scores["layer0_centred"].append(both_ways(centred(src[0]), centred(eng[0])))
    pos_norm = ("-" if pos is None else
                f"{np.linalg.norm(np.asarray(pos['embedding'], np.float32), axis=1).mean():.3f}")
    return (f"step {step}: table row norm {stats['row_norm']:.3f}, mean cosine "
            f"{stats['mean_cos']:.3f}, |mean row| {stats['mean_row_norm']:.3f}; position row "
            f"norm {pos_norm}; acc@1 " + ", ".join(
                f"{k} {np.mean(v):.2f}" for k, v in scores.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True)
    p.add_argument("--steps", required=True, help="comma-separated checkpoint steps")
    p.add_argument("--tatoeba_dir", default=os.path.join(ROOT, "tasks/demo_data/tatoeba"))
    args = p.parse_args(argv)
    for step in (int(s) for s in args.steps.split(",")):
        print(checkpoint_report(args.model_dir, step, args.tatoeba_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
