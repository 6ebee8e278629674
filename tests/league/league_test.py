"""The objective league's pieces (`python -m xlm_jax.league`), in seconds: the budget sized by the
trainer's FLOP count, the one-line refusals of bad input (nothing written), the statistics of
league.json against numpy, the held-out masked-LM check against a direct computation, the XLM-E
generator copied from the base, and the help. The league run end to end, its resume after
kill -9 and each recipe's loading of the base are in tests/league/league_run_test.py (slow)."""
import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.testlib.cli_run import ROOT, env
from xlm_jax.league import __main__ as league_cli
from xlm_jax.league import plan as league_plan
from xlm_jax.league import results as league_results
from xlm_jax.league import runner
from xlm_jax.league import score as league_score
from xlm_jax.league import xlme_generator
from xlm_jax.train import gin_utils

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

TINY = "league/tiny.gin"
TATOEBA = os.path.join(ROOT, "tasks", "demo_data", "tatoeba")


def _tiny_config():
    gin.clear_config()
    try:
        gin_utils.parse([TINY], [])
        return league_plan.league_config()
    finally:
        gin.clear_config()


def _league(*args, cwd):
    return subprocess.run([sys.executable, "-m", "xlm_jax.league", f"--gin_file={TINY}", *args],
                          cwd=cwd, env=env(PYTHONPATH=ROOT), capture_output=True, text=True,
                          timeout=300)


def test_the_budget_buys_whole_steps_by_the_trainers_flop_count(tmp_path):
    config = _tiny_config()
    budget = 0.002
    p = runner.make_plan(config, league_plan.RECIPES, 2, 4, budget, str(tmp_path))
    assert [(c.recipe, c.seed) for c in p.cells[:2]] == [("mmlm", 0), ("xlm", 0)]  # seed-major
    assert len(p.cells) == 2 * len(league_plan.RECIPES)
    for cell in p.cells:
        cost = cell.cost
        cycle_flops = cost.cycle * cost.flops_per_token * cost.tokens_per_step
        assert cell.steps == cost.cycle * math.floor(budget * 1e12 / cycle_flops)
        assert cell.steps % cost.cycle == 0 and cell.steps >= cost.cycle
        assert cell.train_tflop == pytest.approx(
            cell.steps * cost.tokens_per_step * cost.flops_per_token / 1e12, rel=1e-12)
        assert budget - cycle_flops / 1e12 < cell.train_tflop <= budget
    assert {c.recipe: c.cost.cycle for c in p.cells}["veco"] == 2  # VECO alternates phases
    # An independent count for MMLM (the formula of xlm_jax/train/step_flops.py, written out): per
    # token and layer 2(4d^2 + 2df) + 4Td, plus 2 x 2d for XLM-E's two gates (q.u, q.v: every
    # league model has the gated bias), x 3 for forward + backward, and the head 2(d^2 + dV)
    # at the prediction slots (floor(0.15 T) + 1 per row); the 1 x 32 tiny model, T = 32.
    d, f, t, v, slots = 32, 64, 32, 8002, int(0.15 * 32) + 1
    per_row = 3 * (t * (2 * (4 * d * d + 2 * d * f) + 4 * t * d + 4 * d)
                   + slots * 2 * (d * d + d * v))
    mmlm = next(c for c in p.cells if c.recipe == "mmlm")
    assert mmlm.cost.flops_per_token == pytest.approx(per_row / t, rel=1e-12)
    assert mmlm.cost.tokens_per_step == 8 * 32  # BATCH_SIZE rows of SEQ_LEN, one stream
    # each recipe's cost exceeds MMLM's: its extra streams and passes pay their way
    per_step = {c.recipe: c.cost.flops_per_step for c in p.cells}
    assert per_step["xlm"] == pytest.approx(2 * per_step["mmlm"])  # MMLM + TLM, same rows
    assert all(per_step[r] > per_step["mmlm"] for r in league_plan.RECIPES if r != "mmlm")


def test_bad_input_is_one_line_naming_the_flag_and_writes_nothing(tmp_path):
    """Unknown recipe, a budget below one step of a recipe, an --out holding another league:
    exit 1, one line on stderr naming the flag and the value, nothing written."""
    config = _tiny_config()
    held = tmp_path / "held"
    runner.claim_out(runner.make_plan(config, ("mmlm", "xlm"), 1, 4, 0.0005, str(held)))
    record = (held / runner.SETTINGS_FILE).read_bytes()
    cases = [
        (["--recipes=mmlm,bogus", "--out=new1"], ["--recipes=mmlm,bogus", "'bogus'"], "new1"),
        (["--recipes=mmlm,ernie_m", "--budget_tflop=0.0002", "--out=new2"],
         ["--budget_tflop=0.0002", "ernie_m"], "new2"),
        (["--recipes=mmlm,xlm", "--base_steps=4", "--budget_tflop=0.0006", f"--out={held}"],
         ["--budget_tflop=0.0006", "--budget_tflop=0.0005"], None),
        (["--recipes=mmlm,xlme_no_trtd", "--base_steps=4", "--budget_tflop=0.0005", f"--out={held}"],
         ["--recipes=mmlm,xlme_no_trtd", "--recipes=mmlm,xlm"], None),
        (["--recipes=mmlm,xlm", "--base_steps=5", "--budget_tflop=0.0005", f"--out={held}"],
         ["--base_steps=5", "--base_steps=4"], None),
    ]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda c: _league(*c[0], cwd=tmp_path), cases))
    for (args, names, new_dir), r in zip(cases, runs):
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1, (args, r.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
        for name in names:
            assert name in lines[0], (name, lines[0])
        if new_dir:
            assert not (tmp_path / new_dir).exists()
    assert sorted(os.listdir(held)) == [runner.SETTINGS_FILE]
    assert (held / runner.SETTINGS_FILE).read_bytes() == record


def test_the_settings_record_accepts_its_own_league_and_more_seeds(tmp_path):
    config = _tiny_config()
    out = str(tmp_path / "out")
    runner.claim_out(runner.make_plan(config, ("mmlm",), 1, 4, 0.0005, out))
    runner.claim_out(runner.make_plan(config, ("mmlm",), 3, 4, 0.0005, out))  # more seeds: ok
    assert json.load(open(os.path.join(out, runner.SETTINGS_FILE)))["seeds"] == [0, 1, 2]
    import dataclasses

    other = dataclasses.replace(config, base_bindings=(*config.base_bindings, "MASK_PROB = 0.2"))
    with pytest.raises(ValueError, match=r"--gin_file/--gin \(the base's configuration\)"):
        runner.claim_out(runner.make_plan(other, ("mmlm",), 1, 4, 0.0005, out))
    other = dataclasses.replace(config, recipe_bindings={"mmlm": (
        *config.recipe_bindings["mmlm"], "MASK_PROB = 0.2")})
    with pytest.raises(ValueError, match=r"recipe mmlm's configuration"):
        runner.claim_out(runner.make_plan(other, ("mmlm",), 1, 4, 0.0005, out))


def _cell(recipe, seed, acc, avg, gap, layers):
    return runner.CellScore(
        recipe=recipe, seed=seed, model_dir=f"/m/{recipe}/{seed}", steps=10, tokens_per_step=8.0,
        flops_per_token=3.0, train_tflop=240e-12, retrieval_acc1=acc, retrieval_layer=1,
        retrieval_per_layer={str(k): v for k, v in enumerate(layers)}, transfer_avg=avg,
        transfer_en=avg + gap, transfer_gap=gap, train_seconds=60.0 + seed,
        score_seconds=5.0)


def test_league_json_means_and_stds_are_numpys(tmp_path):
    config = _tiny_config()
    p = runner.make_plan(config, ("mmlm", "xlm"), 3, 4, 0.0005, str(tmp_path))
    rng = np.random.default_rng(0)
    done = []
    for seed in range(3):
        for recipe in ("mmlm", "xlm"):
            a, t, g = rng.uniform(0, 100, 3)
            done.append(_cell(recipe, seed, a, t, g, rng.uniform(0, 100, 2)))
    done = done[:-1]  # xlm seed 2 not finished yet
    base = {"model_dir": "/m/base", "steps": 4, "retrieval_acc1": 3.0, "retrieval_layer": 0,
            "retrieval_per_layer": {"0": 3.0, "1": 2.0}, "transfer_avg": 50.0,
            "transfer_en": 50.0, "transfer_gap": 0.0, "train_seconds": 1.0,
            "mlm": {"loss": 5.0, "accuracy": 0.2, "unigram_entropy": 6.0,
                    "most_frequent_rate": 0.1, "most_frequent_token": "x",
                    "language_unigram_entropy": 4.0, "language_most_frequent_rate": 0.12,
                    "targets": 10, "tokens": 50, "sentences": 5, "uses_context": True,
                    "beyond_language": False}}
    out = league_results.league_json(p, base, done, "cmd")
    assert not out["complete"]
    for recipe, n in (("mmlm", 3), ("xlm", 2)):
        r = out["recipes"][recipe]
        cells = [c for c in done if c.recipe == recipe]
        assert r["seeds_done"] == n and r["seeds_planned"] == 3 and len(r["cells"]) == n
        for key in ("retrieval_acc1", "transfer_avg", "transfer_gap", "train_seconds"):
            values = np.array([getattr(c, key) for c in cells])
            assert r["mean"][key] == pytest.approx(values.mean(), rel=1e-12)
            assert r["std"][key] == pytest.approx(
                math.sqrt(((values - values.mean()) ** 2).mean()), rel=1e-9)
        curve = np.array([[c.retrieval_per_layer[k] for k in ("0", "1")] for c in cells])
        assert list(r["mean"]["retrieval_per_layer"].values()) == pytest.approx(
            curve.mean(0), rel=1e-12)
    league_results.write_all(str(tmp_path), out)
    md = (tmp_path / "league.md").read_text()
    m = out["recipes"]["xlm"]
    assert f"{m['mean']['retrieval_acc1']:.1f} ± {m['std']['retrieval_acc1']:.1f}" in md
    delta = m["mean"]["transfer_avg"] - out["recipes"]["mmlm"]["mean"]["transfer_avg"]
    assert f"{delta:+.1f}" in md and "Partial" in md
    assert (tmp_path / "league.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "league.json").read_text()) == json.loads(json.dumps(out))


def _bindings(recipe):
    """{(scope, configurable, parameter): repr(value)} of a league recipe as gin parses it."""
    from gin import config as gin_config

    from xlm_jax.train import gin_utils

    gin.clear_config()
    try:
        gin_utils.parse([f"league/{recipe}.gin"], ["TRAIN_STEPS = 1"], check_required=False)
        return {(scope, sel, k): repr(v) for (scope, sel), params in gin_config._CONFIG.items()
                for k, v in params.items()}
    finally:
        gin.clear_config()


def test_the_infoxlm_recipe_is_the_xlm_recipe_plus_xlco():
    """The claim "XLCo adds to MMLM + TLM" compares infoxlm with xlm: every binding of xlm is
    infoxlm's too, with the same value, and what infoxlm adds is XLCo's (its objective, its
    macros, its layer), so the difference of the two is XLCo alone."""
    xlm, infoxlm = _bindings("xlm"), _bindings("infoxlm")
    objectives = ("", "xlm_jax.train.loop.train", "objectives")
    for key, value in xlm.items():
        if key != objectives:
            assert infoxlm.get(key) == value, key
    assert infoxlm[objectives].startswith(xlm[objectives][:-1] + ", 'xlco': ")
    extra = [k for k in infoxlm if k not in xlm]
    assert extra and all("xlco" in k[0].lower() or "XLCO" in k[0] for k in extra), extra


def _welch(a, b):
    """Welch's t and two-sided p by the textbook formula (the t distribution's tail from
    the regularised incomplete beta function), independent of scipy.stats."""
    from scipy.special import betainc
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return t, float(betainc(df / 2, 0.5, df / (df + t * t)))


def test_claims_are_welch_tests_against_the_matching_baseline():
    """Each claim compares its recipe with its own baseline (infoxlm with xlm, not with the
    control), on every metric it names; t and p equal Welch's formula; a clear win holds, a
    clear loss is reversed, overlapping seeds are not shown."""
    def cells(recipe, acc, avg, layer3):
        return [dataclasses.asdict(_cell(recipe, s, a, t, 1.0, [a, 0.0, 0.0, l]))
                for s, (a, t, l) in enumerate(zip(acc, avg, layer3))]
    recipes = {
        "mmlm": {"cells": cells("mmlm", [7.0, 7.1, 7.2], [50.0, 50.5, 51.0], [1, 2, 3])},
        "xlm": {"cells": cells("xlm", [7.1, 7.0, 7.2], [51.0, 51.2, 51.1], [6.0, 6.1, 6.2])},
        "infoxlm": {"cells": cells("infoxlm", [7.6, 7.7, 7.65], [53.0, 53.1, 53.2],
                                   [5.0, 5.1, 4.9])},
    }
    results = league_results.evaluate_claims({"recipes": recipes})
    got = {(r.claim.recipe, r.metric): r for r in results}
    assert {k[0] for k in got} == {"xlm", "infoxlm"}  # the others' recipes are absent
    assert got[("infoxlm", "transfer_avg")].claim.baseline == "xlm"
    for (recipe, metric), r in got.items():
        base = r.claim.baseline
        a = league_results._seed_values(recipes[recipe]["cells"], metric)
        b = league_results._seed_values(recipes[base]["cells"], metric)
        t, p = _welch(a, b)
        assert r.t == pytest.approx(t, rel=1e-9) and r.p == pytest.approx(p, rel=1e-6)
        assert r.diff == pytest.approx(np.mean(a) - np.mean(b))
    assert got[("infoxlm", "transfer_avg")].verdict == "holds"
    assert got[("infoxlm", "retrieval_layer:3")].verdict == "reversed"  # 5.0 vs 6.1
    assert got[("xlm", "retrieval_acc1")].verdict == "not shown"  # the same seeds, reordered
    md = "\n".join(league_results.claims_table({"recipes": recipes}))
    assert "| XLCo adds to MMLM + TLM | InfoXLM Table 7" in md and "infoxlm vs xlm" in md
    assert md.count("\n| ") == len(results) + 1  # the header and one row per result


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """An xlm_jax model directory: a random 1 x 32 pre-LN model with the demo vocabulary."""
    from xlm_jax.convert import hf
    from xlm_jax.models.config import get_config
    from xlm_jax.models.transformer import Transformer

    cfg = get_config("tiny", vocab_size=8002, num_layers=1, hidden_size=32, num_heads=2,
                     mlp_dim=64, ln_style="pre")
    params = Transformer(cfg).init(jax.random.PRNGKey(3), jnp.ones((1, 8), jnp.int32))["params"]
    import flax.linen as nn

    out = str(tmp_path_factory.mktemp("model"))
    hf.save_xlm_jax(out, cfg, nn.meta.unbox(params), spm_from=os.path.join(ROOT, "tasks",
                                                                             "demo_data"))
    return out


def test_masked_lm_check_matches_a_direct_computation(tiny_model_dir):
    """The masked-LM loss/accuracy (rows bucketed by length) equal one plain pass over the
    full-width rows; the yardsticks equal a Counter over the held-out tokens."""
    from xlm_jax.encoder import load_encoder

    langs = ("de", "fr")
    got = league_score.masked_lm_heldout(tiny_model_dir, TATOEBA, 32, langs, batch_size=16)
    enc = load_encoder(tiny_model_dir)
    tok = enc.tokenizer
    rng = np.random.default_rng(0)
    special = {tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.mask_id}
    counts, nll, correct, n, sentences = collections.Counter(), 0.0, 0, 0, 0
    per_lang = collections.defaultdict(collections.Counter)
    for lang, text in league_score.heldout_sentences(TATOEBA, langs):
        ids = [tok.bos_id] + tok.encode(text)[:30] + [tok.eos_id]
        regular = [i for i, t in enumerate(ids) if t not in special]
        if not regular:
            continue
        sentences += 1
        counts.update(ids[i] for i in regular)
        per_lang[lang].update(ids[i] for i in regular)
        picked = rng.choice(regular, size=max(1, int(round(0.15 * len(regular)))),
                            replace=False)
        row = np.full((1, 32), tok.pad_id, np.int32)
        row[0, :len(ids)] = ids
        targets = row[0, picked].copy()
        row[0, picked] = tok.mask_id
        logp = jax.nn.log_softmax(jnp.asarray(enc.mlm_logits(row), jnp.float32), -1)[0]
        nll -= float(np.sum(np.asarray(logp)[picked, targets]))
        correct += int(np.sum(np.asarray(logp)[picked].argmax(-1) == targets))
        n += len(picked)
    freq = np.array(list(counts.values()), float) / sum(counts.values())
    assert got.sentences == sentences and got.targets == n
    assert got.tokens == sum(counts.values())
    assert got.loss == pytest.approx(nll / n, rel=1e-4)
    assert got.accuracy == pytest.approx(correct / n, abs=1e-9)
    assert got.unigram_entropy == pytest.approx(float(-(freq * np.log(freq)).sum()), rel=1e-12)
    assert got.most_frequent_rate == pytest.approx(freq.max(), rel=1e-12)
    total = sum(counts.values())
    lang_entropy = lang_rate = 0.0
    for c in per_lang.values():
        q = np.array(list(c.values()), float) / sum(c.values())
        lang_entropy += sum(c.values()) / total * float(-(q * np.log(q)).sum())
        lang_rate += max(c.values()) / total
    assert set(per_lang) == {"de", "fr", "en"}
    assert got.language_unigram_entropy == pytest.approx(lang_entropy, rel=1e-12)
    assert got.language_most_frequent_rate == pytest.approx(lang_rate, rel=1e-12)
    assert got.language_unigram_entropy < got.unigram_entropy  # knowing the language helps
    assert not got.uses_context  # a random model: loss ~ ln V, far above the entropy
    assert got.loss > math.log(8002) - 1.0


def test_the_xlme_generator_is_a_truncated_copy_of_the_base():
    """Every generator parameter the encoder has at the same path and shape comes from the
    encoder; the others (the gated bias a base with absolute positions lacks) keep theirs."""
    import flax.linen as nn

    from xlm_jax.models.config import get_config
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.objectives import xlme

    base = get_config("tiny", vocab_size=8002, num_layers=3, hidden_size=32, num_heads=2,
                      mlp_dim=64, ln_style="pre")
    disc = base.replace(position_type="both")
    encoder = nn.meta.unbox(Transformer(base).init(jax.random.PRNGKey(1),
                                                   jnp.ones((1, 8), jnp.int32))["params"])
    obj = xlme_generator.generator_from_encoder(
        Transformer(disc), "mrtd", rtd=lambda model, name: xlme.ReplacedTokenDetection(
            model, name, generator_layers=2))
    modules = nn.meta.unbox(obj.init_modules(jax.random.PRNGKey(2)))
    params = {"encoder": encoder, "objectives": modules}
    out = obj.adapt_pretrained(params)
    flat = lambda t: {jax.tree_util.keystr(p): np.asarray(v)  # noqa: E731
                      for p, v in jax.tree_util.tree_flatten_with_path(t)[0]}
    enc, before, after = flat(encoder), flat(modules["generator"]), flat(
        out["objectives"]["generator"])
    copied = [k for k in after if k in enc]
    assert {"['layers_0']['attention']['query']['kernel']", "['layers_1']['mlp']['output']['bias']",
            "['final_norm']['scale']", "['mlm_head']['dense']['kernel']",
            "['embeddings']['position_embeddings']['embedding']"} <= set(copied)
    assert not any(k.startswith("['layers_2']") for k in after)  # 2 of the base's 3 layers
    for k in copied:
        np.testing.assert_array_equal(after[k], enc[k])
    kept = [k for k in after if k not in enc]
    assert any("gated_bias" in k for k in kept) and any("rel_pos" in k for k in kept)
    for k in kept:
        np.testing.assert_array_equal(after[k], before[k])
    assert out["objectives"]["rtd_head"] is modules["rtd_head"]
    assert out["encoder"] is encoder


def test_help_lists_every_flag_with_its_default(capsys):
    assert league_cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag, default in (("--recipes", ",".join(league_plan.RECIPES)), ("--seeds", "3"),
                          ("--base_steps", str(runner.DEFAULT_BASE_STEPS)),
                          ("--budget_tflop", f"{runner.DEFAULT_BUDGET_TFLOP}"),
                          ("--out", "league_output")):
        assert flag in text
        assert f"(default: {default})" in " ".join(text.split()), flag
