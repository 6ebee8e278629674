"""`demo.in_loop_result`: the demo takes the paper's row from the run's own last Tatoeba eval
(`evaluators.TatoebaRetrieval`'s result file) only when that eval scored exactly what the
demo's own scoring would (every language, every layer, the same files and defaults, the last
step, each sentence's hits); otherwise it scores the checkpoint itself. That the in-loop
result equals a second scoring of the checkpoint is tests/train/periodic_eval_test.py's."""
import json
import os

import numpy as np
import pytest

from xlm_jax import demo
from xlm_jax.evaluation import retrieval
from xlm_jax.train import evaluators

HITS = {"de": ([1, 0, 1, 0], [1, 1, 0, 0]), "fr": ([0, 0, 1, 1], [1, 1, 1, 0])}


def _tatoeba(root):
    path = os.path.join(root, "tatoeba")
    os.makedirs(path)
    for lang in HITS:
        for side in (lang, "eng"):
            with open(os.path.join(path, f"tatoeba.{lang}-eng.{side}"), "w") as f:
                f.write("".join(f"{side} {i}\n" for i in range(4)))
    return path


def _write(train_dir, step, tatoeba, drop_hits=False, scored_step=None, **changed):
    scores = {lang: retrieval.LanguageScore(float(np.mean(f)), float(np.mean(b)), 4,
                                            hits=(np.array(f, bool), np.array(b, bool)))
              for lang, (f, b) in HITS.items()}
    result = retrieval.RetrievalResult("all", 0, scores, {0: scores, 1: scores},
                                       step=step if scored_step is None else scored_step)
    data = result.to_json()
    if drop_hits:
        for entry in data["per_language"].values():
            del entry["hits"]
    data["settings"] = {"tatoeba_dir": tatoeba, "languages": sorted(HITS), "layers": "all",
                        "pool": "mean", "max_sentences": None, "max_length": None,
                        "batch_size": 64, **changed}
    path = evaluators.result_path(train_dir, "retrieval", step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def test_the_last_eval_of_the_same_scoring_is_reused_with_its_hits(tmp_path):
    tatoeba, train_dir = _tatoeba(str(tmp_path)), str(tmp_path / "model")
    path = _write(train_dir, 84, os.path.abspath(tatoeba))
    found = demo.in_loop_result(train_dir, 84, tatoeba, "all")
    assert found is not None and found[0] == path
    result = found[1]
    assert result.step == 84 and result.checkpoint == train_dir
    for lang, (f, b) in HITS.items():
        np.testing.assert_array_equal(result.per_language[lang].hits[0], np.array(f, bool))
        np.testing.assert_array_equal(result.per_language[lang].hits[1], np.array(b, bool))
    # the paired bootstrap of the demo's table runs on it
    assert retrieval.paired_bootstrap(result, result, resamples=10).average == 0


@pytest.mark.parametrize("case", ["other_step", "demo_layer", "layers", "pool", "max_sentences",
                                  "max_length", "batch_size", "languages", "other_dir",
                                  "no_hits", "no_file"])
def test_anything_else_is_scored_again(tmp_path, case):
    tatoeba, train_dir = _tatoeba(str(tmp_path)), str(tmp_path / "model")
    other = os.path.join(str(tmp_path), "other")
    changed = {"layers": {"layers": 2}, "pool": {"pool": "cls"},
               "max_sentences": {"max_sentences": 3}, "max_length": {"max_length": 16},
               "batch_size": {"batch_size": 16}, "languages": {"languages": ["de"]},
               "other_dir": {"tatoeba_dir": other}}.get(case, {})
    if case != "no_file":
        _write(train_dir, 84, os.path.abspath(tatoeba), drop_hits=case == "no_hits",
               scored_step=83 if case == "other_step" else None, **changed)
    layer = 0 if case == "demo_layer" else "all"
    assert demo.in_loop_result(train_dir, 84, tatoeba, layer) is None
