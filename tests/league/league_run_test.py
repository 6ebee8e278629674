"""`python -m xlm_jax.league` run for real (minutes: marked slow, `make test-slow`).

- A two-recipe, one-seed league at a tiny budget (league/tiny.gin: a 1 x 32 model on the
  trainer's synthetic streams, scored on two held-out languages and a 6-step fine-tuning), from
  a working directory outside the repository: league.json's structure and values against what
  each cell's own files say and against numpy.
- The same league killed with SIGKILL while a cell trains, then the same command: it finishes,
  leaves no trainer behind, and its league.json equals the uninterrupted one in every numeric
  field but the wall-clock seconds.
- Every recipe starts from the base: its step-0 checkpoint (`save_initial`) holds the base's
  parameters wherever the shapes agree, and the new modules as the recipe says (a zero language
  table, a generator copied from the base, an XLCo key encoder equal to the loaded encoder).
"""
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.testlib.cli_run import ROOT, env

ARGS = ["--gin_file=league/tiny.gin", "--recipes=mmlm,xlm", "--seeds=1", "--base_steps=4",
        "--budget_tflop=0.0008"]
WALL_CLOCK = ("train_seconds", "score_seconds")


def _command(out):
    return [sys.executable, "-m", "xlm_jax.league", *ARGS, f"--out={out}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted league, run from a directory outside the repository."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    r = subprocess.run(_command("out"), cwd=cwd, env=env(PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return cwd / "out"


@pytest.mark.slow
def test_a_two_recipe_league_end_to_end(reference):
    out = reference
    league = json.loads((out / "league.json").read_text())
    settings = json.loads((out / "league_settings.json").read_text())
    assert league["settings"] == settings and settings["recipes"] == ["mmlm", "xlm"]
    assert settings["budget_tflop"] == 0.0008 and settings["seeds"] == [0]
    assert league["complete"] and league["control"] == "mmlm"
    base = league["base"]
    assert base["steps"] == 4 and base["model_dir"] == str(out / "base" / "model")
    mlm = base["mlm"]
    assert 0 <= mlm["accuracy"] < 1 and 0 < mlm["most_frequent_rate"] < 1
    assert mlm["uses_context"] == (mlm["loss"] < mlm["unigram_entropy"]
                                   and mlm["accuracy"] > mlm["most_frequent_rate"])
    budget = 0.0008
    for name, recipe in league["recipes"].items():
        assert recipe["seeds_done"] == recipe["seeds_planned"] == 1
        (cell,) = recipe["cells"]
        model_dir = cell["model_dir"]
        assert os.path.isabs(model_dir) and model_dir == str(out / "cells" / name / "seed_0" /
                                                             "model")
        # trained exactly the planned steps from the base
        steps = sorted(int(s) for s in os.listdir(os.path.join(model_dir, "checkpoints")))
        assert steps[-1] == cell["steps"] == recipe["steps"]
        ops = open(os.path.join(model_dir, "operative_config.gin")).read().replace("\\\n", "")
        assert f"init_from = '{out / 'base' / 'model'}'" in " ".join(ops.split())
        # the budget: steps x tokens x FLOPs per token, within one step of it
        flops = cell["steps"] * cell["tokens_per_step"] * cell["flops_per_token"] / 1e12
        assert cell["train_tflop"] == pytest.approx(flops, rel=1e-12)
        one_step = cell["tokens_per_step"] * cell["flops_per_token"] / 1e12
        assert budget - one_step < cell["train_tflop"] <= budget
        # retrieval: the best layer of the curve, as the cell's own retrieval.json has it
        curve = cell["retrieval_per_layer"]
        assert set(curve) == {"0", "1"}
        assert cell["retrieval_acc1"] == max(curve.values()) == curve[str(
            cell["retrieval_layer"])]
        saved = json.loads((out / "cells" / name / "seed_0" / "retrieval.json").read_text())
        assert saved["acc1"] == cell["retrieval_acc1"]
        # transfer: recomputed from the fine-tuning's own results.json
        results = json.loads((out / "cells" / name / "seed_0" / "transfer" /
                              "results.json").read_text())
        means = {lang: v["mean"] for lang, v in results["languages"].items()}
        others = [v for lang, v in means.items() if lang != "en"]
        assert len(others) == 30 and results["seeds"] == [1]
        assert cell["transfer_avg"] == pytest.approx(np.mean(others), rel=1e-12)
        assert cell["transfer_gap"] == pytest.approx(means["en"] - np.mean(others), rel=1e-12)
        # one seed: the mean is the cell, the spread 0
        assert recipe["mean"]["retrieval_acc1"] == cell["retrieval_acc1"]
        assert recipe["std"]["transfer_avg"] == 0.0
        assert cell["train_seconds"] > 0 and cell["score_seconds"] > 0
    md = (out / "league.md").read_text()
    assert "| mmlm | 1/1 |" in md and "| xlm | 1/1 |" in md and "Partial" not in md
    assert (out / "league.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _numbers(tree, path=""):
    """{path: value} of every number (and None) of a JSON tree, wall-clock seconds left out."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k not in WALL_CLOCK:
                out.update(_numbers(v, f"{path}/{k}"))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.update(_numbers(v, f"{path}/{i}"))
    elif tree is None or isinstance(tree, (int, float)) and not isinstance(tree, bool):
        out[path] = tree
    return out


def _trainers_of(out):
    """Processes whose command line names `out` (a trainer or fine-tuning of this league)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(out).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_kill_9_then_the_same_command_finishes_with_the_same_league(reference, tmp_path):
    cwd = tmp_path
    out = cwd / "out"
    proc = subprocess.Popen(_command("out"), cwd=cwd, env=env(PYTHONPATH=ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill while mmlm's cell trains (10 steps, a checkpoint every 2): after its step 4
    marker = out / "cells" / "mmlm" / "seed_0" / "model" / "checkpoints" / "4"
    deadline = time.time() + 900
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert marker.exists() and proc.poll() is None, "the league ended before the kill"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "cells" / "mmlm" / "seed_0" / "score.json").exists()
    for _ in range(50):  # the trainer child dies with the league (PR_SET_PDEATHSIG)
        if not _trainers_of(out):
            break
        time.sleep(0.1)
    assert not _trainers_of(out)
    r = subprocess.run(_command("out"), cwd=cwd, env=env(PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in (out / "cells" / "mmlm" / "seed_0" / "train.log").read_text()
    got = _numbers(json.loads((out / "league.json").read_text()))
    want = _numbers(json.loads((reference / "league.json").read_text()))
    assert got.keys() == want.keys()
    diff = {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    assert not diff, diff


def _state(model_dir, step):
    import jax
    import orbax.checkpoint as ocp

    from xlm_jax import model_dir as md

    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(md.trainer_state_dir(model_dir, step))
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}


@pytest.mark.slow
@pytest.mark.usefixtures("gin_isolated")  # it parses league gin files in this process
def test_every_recipe_starts_from_the_base(tmp_path):
    """Each recipe's step-0 state after `init_from` the base (trained in-process, 1 step)."""
    import gin

    from xlm_jax.league import plan as league_plan
    from xlm_jax.train import gin_utils, loop

    gin.clear_config()
    gin_utils.parse(["league/tiny.gin"], [])
    config = league_plan.league_config()

    def train(files, bindings, model_dir):
        gin.clear_config()
        try:
            gin_utils.parse(files, [*bindings, "TRAIN_STEPS = 1", "loop.train.num_devices = 1",
                                    "loop.train.save_initial = True"])
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                loop.train(str(model_dir))
        finally:
            gin.clear_config()

    base_dir = tmp_path / "base"
    train(config.base_gin, [*config.base_bindings_all(), "loop.train.seed = 123"], base_dir)
    base = {k[len("['params']['encoder']"):]: v for k, v in _state(base_dir, 1).items()
            if k.startswith("['params']['encoder']")}
    assert len(base) > 20
    for recipe in league_plan.RECIPES:
        model_dir = tmp_path / recipe
        train(config.recipe_gin(recipe), [*config.bindings_for(recipe),
                                          f"loop.train.init_from = '{base_dir}'"], model_dir)
        state = _state(model_dir, 0)
        enc = {k[len("['params']['encoder']"):]: v for k, v in state.items()
               if k.startswith("['params']['encoder']")}
        loaded = [k for k in enc if k in base]
        assert len(loaded) == len(base), (recipe, set(base) - set(enc))
        for k in loaded:
            np.testing.assert_array_equal(enc[k], base[k], err_msg=f"{recipe} {k}")
        new = sorted(set(enc) - set(base))
        if recipe == "ernie_m":
            assert new == ["['embeddings']['lang_embeddings']['embedding']"]
            assert not np.any(enc[new[0]])  # zeros: the base's function at step 0
        elif recipe == "veco":
            assert new and all("cross_attention" in k for k in new)
        elif recipe in ("xlme", "xlme_no_trtd"):
            assert not new, (recipe, new)  # the gated bias is the base's (league/common.gin)
            assert any("gated_bias" in k for k in enc) and any("rel_pos" in k for k in enc)
            gen = {k[len("['params']['objectives']['generator']"):]: v for k, v in state.items()
                   if k.startswith("['params']['objectives']['generator']")}
            copied = [k for k in gen if k in base]
            assert "['layers_0']['mlp']['output']['kernel']" in copied
            assert "['mlm_head']['dense']['kernel']" in copied
            assert "['rel_pos']['rel_embedding']" in copied
            for k in copied:
                np.testing.assert_array_equal(gen[k], base[k], err_msg=f"{recipe} generator {k}")
        else:
            assert not new, (recipe, new)
        if recipe == "infoxlm":  # the momentum encoder starts at the loaded weights
            key = {k[len("['obj_state']['xlco']['key_params']['encoder']"):]: v
                   for k, v in state.items()
                   if k.startswith("['obj_state']['xlco']['key_params']['encoder']")}
            assert key.keys() == enc.keys()
            for k in key:
                np.testing.assert_array_equal(key[k], enc[k])
        assert math.isfinite(float(np.sum(enc["['final_norm']['scale']"])))
