"""The league base the package ships (tasks/demo_data/league_base, `python -m xlm_jax.league
--ship_base`): it is the base today's league/base.gin describes (its settings record equals
the one the league computes now, so a change of the base's configuration fails here until the
base is trained and shipped again), its parameters are the ones its held-out figures were
measured on, and the demo continues from it instead of training a base."""
import argparse
import os

import gin
import pytest

from xlm_jax import demo
from xlm_jax.league import runner
from xlm_jax.league import plan
from xlm_jax.league import score as league_score
from xlm_jax.train import gin_utils

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

SHIPPED = gin_utils.shipped_path(runner.SHIPPED_BASE)


def _settings(steps=runner.DEFAULT_BASE_STEPS):
    return runner.base_settings(plan.LeagueConfig(), steps)[0]


def test_the_shipped_base_is_the_base_of_todays_league_configuration():
    assert SHIPPED is not None, f"{runner.SHIPPED_BASE} is missing"
    record = league_score.read_json(os.path.join(SHIPPED, runner.SHIPPED_RECORD))
    assert record == _settings().to_json(), (
        "league/base.gin (or the league's base settings) changed since the base was shipped: "
        "train and ship it again with `python -m xlm_jax.league --ship_base "
        f"{runner.SHIPPED_BASE}` (docs/league.md)")
    assert runner.shipped_base(_settings()) == SHIPPED
    assert runner.shipped_base(_settings(steps=10)) is None  # another base: not this one


def test_the_shipped_parameters_are_the_league_base_model():
    """The shipped directory loads as the model league/base.gin builds (the same config, every
    parameter of its encoder and masked-LM head), with the demo corpus's tokenizer."""
    import jax

    from xlm_jax.encoder import load_encoder
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.accelerator import pod_memory

    gin.clear_config()
    try:
        gin_utils.parse(["league/base.gin"], ["TRAIN_STEPS = 1"], check_required=False)
        want = pod_memory.train_bindings()["model"]  # loop.train's model as gin builds it
    finally:
        gin.clear_config()
    enc = load_encoder(SHIPPED)
    assert enc.config == want
    import flax.linen as nn

    shapes = nn.meta.unbox(jax.eval_shape(lambda: Transformer(want, with_mlm_head=True).init(
        jax.random.PRNGKey(0), jax.numpy.ones((1, 8), jax.numpy.int32)))["params"])
    assert jax.tree_util.tree_map(lambda x: x.shape, shapes) == jax.tree_util.tree_map(
        lambda x: x.shape, enc.params)
    assert enc.config.vocab_size == enc.tokenizer.vocab_size == 8002  # the demo tokenizer


@pytest.mark.slow
def test_its_parameters_are_the_ones_its_figures_were_measured_on():
    """The held-out masked-LM check (deterministic: fixed positions, no dropout) on the
    shipped parameters reproduces the loss and accuracy recorded beside them (about a minute
    on 2 CPU cores: `make test-slow`)."""
    scores = league_score.read_json(os.path.join(SHIPPED, runner.SHIPPED_SCORES))
    config = plan.LeagueConfig()
    mlm = league_score.masked_lm_heldout(SHIPPED, runner.tatoeba_dir(config),
                                         runner._seq_len(SHIPPED), config.languages)
    assert mlm.targets == scores["mlm"]["targets"]
    assert mlm.loss == pytest.approx(scores["mlm"]["loss"], abs=1e-4)
    assert mlm.accuracy == pytest.approx(scores["mlm"]["accuracy"], abs=1e-6)
    assert scores["retrieval_acc1"] > 0 and scores["steps"] == runner.DEFAULT_BASE_STEPS


def test_the_demo_continues_from_the_shipped_base_unless_told_otherwise(monkeypatch):
    """Default flags: the shipped base, nothing trained. --train_base or --base_dir: the
    league's own base step (`runner.ensure_base`, here recorded instead of run)."""
    trained = []
    monkeypatch.setattr(runner, "ensure_base", lambda d, c, s: trained.append(d) or d)
    config = plan.LeagueConfig()
    flags = lambda **kw: argparse.Namespace(**{"base_dir": None, "train_base": False, **kw})  # noqa: E731
    assert demo.resolve_base(flags(), config, _settings()) == SHIPPED and not trained
    assert demo.resolve_base(flags(train_base=True), config, _settings()) == trained[-1]
    assert demo.resolve_base(flags(base_dir="/tmp/mine"), config, _settings()) == "/tmp/mine"
    assert demo.resolve_base(flags(), config, _settings(steps=10)) == trained[-1]
    assert len(trained) == 3


def test_the_shipped_retrieval_result_is_what_the_base_scores_today():
    """`retrieval.json` beside the base (the demo's base column, read instead of scored) is
    what `retrieval.evaluate` gives the shipped parameters today, as the demo scores them, on
    six of its languages in six scripts (a language's scores depend on its own files only; all
    30 would cost ~20 s here): each layer's per-language scores within one sentence, each
    sentence's hits within one per direction (another CPU's float rounding may move a near tie;
    on the machine that shipped it they are equal), and the demo takes it
    (`demo.shipped_base_result`)."""
    import numpy as np

    from xlm_jax.encoder import load_encoder
    from xlm_jax.evaluation import retrieval

    tatoeba = runner.tatoeba_dir(plan.LeagueConfig())
    stored = demo.shipped_base_result(SHIPPED, tatoeba, "all")
    assert stored is not None, (f"{runner.SHIPPED_RETRIEVAL} is missing beside the base or "
                                "was scored otherwise than the demo scores")
    assert sorted(stored.per_language) == retrieval.find_languages(tatoeba)
    langs = ["ar", "de", "hi", "ja", "ru", "sw"]
    fresh = retrieval.evaluate(load_encoder(SHIPPED), tatoeba, layers="all", languages=langs)
    for layer, scores in fresh.per_layer_language.items():
        for lang, score in scores.items():
            mine = stored.per_layer_language[layer][lang]
            assert mine.num_pairs == score.num_pairs
            for a, b in ((mine.src_to_eng, score.src_to_eng), (mine.eng_to_src, score.eng_to_src)):
                assert abs(a - b) * score.num_pairs <= 1 + 1e-9, (layer, lang)
    for lang in langs:  # the reported layer's hits, which the demo's bootstrap resamples
        for a, b in zip(stored.per_language[lang].hits,
                        fresh.per_layer_language[stored.reported_layer][lang].hits):
            assert int(np.sum(a != b)) <= 1, lang
    assert demo.shipped_base_result(SHIPPED, tatoeba, 0) is None  # --layer 0: scored again


def test_ship_base_writes_the_retrieval_result_the_demo_reads(tmp_path):
    """`runner.ship_base` with a Tatoeba folder writes `retrieval.json` beside the shipped
    parameters: the demo's scoring of them (equal to `retrieval.evaluate` of the shipped
    copy, hits included), which `demo.shipped_base_result` takes for that folder only."""
    import shutil

    import numpy as np

    from xlm_jax.encoder import load_encoder
    from xlm_jax.evaluation import retrieval

    base_dir = tmp_path / "base"
    shutil.copytree(SHIPPED, base_dir / "model")  # a trained base's model dir, as ship_base reads
    tatoeba = tmp_path / "tatoeba"
    tatoeba.mkdir()
    source = runner.tatoeba_dir(plan.LeagueConfig())
    for lang in ("de", "ja"):
        for side in (lang, "eng"):
            name = f"tatoeba.{lang}-eng.{side}"
            lines = open(os.path.join(source, name), encoding="utf-8").read().splitlines()[:24]
            (tatoeba / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = runner.ship_base(str(base_dir), str(tmp_path / "shipped"), str(tatoeba))
    stored = demo.shipped_base_result(out, str(tatoeba), "all")
    assert stored is not None and stored.checkpoint == runner.SHIPPED_BASE
    fresh = retrieval.evaluate(load_encoder(out), str(tatoeba), layers="all")
    assert stored.per_layer == fresh.per_layer and stored.per_language == fresh.per_language
    for lang in ("de", "ja"):
        for a, b in zip(stored.per_language[lang].hits, fresh.per_language[lang].hits):
            np.testing.assert_array_equal(a, b)
    assert demo.shipped_base_result(out, source, "all") is None  # scored on other files
