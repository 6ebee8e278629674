"""What each objective declares as "not learning" (`Objective.health_checks`): every check
reads a metric the objective reports (and its gate a metric it reports too), so no check
waits forever on a misspelt name; RTD's majority rate is 1 - the replaced share of the tokens,
computed from accuracy, precision and recall; XLCo's chance counts its negatives. How the
trainer evaluates them: tests/train/health_test.py."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (HEALTH_CONDITIONS, HealthCheck, Objective, ROW_IDS,
                                     WeightedObjective, init_params, report)
from xlm_jax.objectives.ernie_m import BackTranslationMLM, CrossAttentionMLM
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.objectives.translation import Translation
from xlm_jax.objectives.veco import VariableMLM
from xlm_jax.objectives.xlco import XLCo
from xlm_jax.objectives.xlme import ReplacedTokenDetection

V, T = 64, 16
CFG = get_config("tiny", vocab_size=V, num_layers=1, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 num_languages=4)
NET = Transformer(CFG)
NET_X = Transformer(CFG.replace(cross_attention=True))  # VECO's and Translation's stack

OBJECTIVES = {
    "mmlm": lambda: MaskedLM(NET, max_predictions=4),
    "tlm": lambda: MaskedLM(NET, name="tlm", kind="pair", max_predictions=4),
    "mrtd": lambda: ReplacedTokenDetection(NET, generator_layers=1, max_predictions=4),
    "trtd": lambda: ReplacedTokenDetection(NET, name="trtd", kind="pair", generator_layers=1,
                                           max_predictions=4),
    "xlco": lambda: XLCo(NET, queue_size=8, max_predictions=4),
    "xlco_in_batch": lambda: XLCo(NET, queue_size=0, in_batch_negatives=True, kind="split_pair",
                                  max_predictions=4),
    "camlm": lambda: CrossAttentionMLM(NET, max_predictions=4),
    "btmlm": lambda: BackTranslationMLM(NET, languages=["en", "de", "fr", "ja"],
                                        target_languages=["de"], max_predictions=4,
                                        start_step=3),
    "veco": lambda: VariableMLM(NET_X, mask_prob=0.15, max_predictions=4),
    "translate": lambda: Translation(NET_X, decoder_layers=1, languages=None),
}


def _reported(obj: Objective) -> set[str]:
    """The names the trainer reports for `obj` (unprefixed), traced without computing."""
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, T, V, obj.kind, seed=0).items()}

    def run():
        boxed = init_params(obj.model, [WeightedObjective(obj)], T, jax.random.PRNGKey(0))
        params, state = nn.meta.unbox(boxed), nn.meta.unbox(obj.init_state(boxed))
        prepared = obj.prepare(batch, jax.random.PRNGKey(1))
        prepared[ROW_IDS] = jnp.arange(2, dtype=jnp.int32)
        out = obj.loss(params, prepared, jax.random.PRNGKey(2), state)
        return report(obj, out.losses, out.metrics, obj.counts(prepared))
    return set(jax.eval_shape(run))


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_check_reads_a_metric_the_objective_reports(name):
    obj = OBJECTIVES[name]()
    checks = obj.health_checks()
    assert checks, f"{name} declares no health check"
    reported = _reported(obj)
    for c in checks:
        assert c.metric in reported, (c.metric, sorted(reported))
        assert c.ready is None or c.ready in reported, (c.ready, sorted(reported))
        assert c.condition in HEALTH_CONDITIONS and c.meaning and c.knob
    # every masked LM (and the decoder) is held to the floor on an accuracy
    assert any(c.condition == "below_floor" for c in checks) or name.startswith("xlco")


def test_btmlm_and_xlco_gate_their_checks():
    btmlm = OBJECTIVES["btmlm"]()
    assert {c.after_updates for c in btmlm.health_checks()} == {3}
    assert {c.ready for c in OBJECTIVES["xlco"]().health_checks()} == {"queue_fill"}
    assert {c.ready for c in OBJECTIVES["xlco_in_batch"]().health_checks()} == {None}


@pytest.mark.parametrize("seed", range(4))
def test_rtd_majority_rate_is_one_minus_the_replaced_share(seed):
    """Random labels and predictions over 500 tokens: the rate from the three metrics is
    exactly the accuracy of answering 'original' everywhere."""
    rng = np.random.default_rng(seed)
    labels = rng.random(500) < rng.uniform(0.05, 0.3)
    predicted = np.where(rng.random(500) < 0.7, labels, rng.random(500) < 0.2)
    tp = np.sum(predicted & labels)
    metrics = {"rtd_accuracy": np.mean(predicted == labels),
               "rtd_precision": tp / max(np.sum(predicted), 1),
               "rtd_recall": tp / max(np.sum(labels), 1)}
    check = {c.metric: c for c in OBJECTIVES["mrtd"]().health_checks()}["rtd_accuracy"]
    assert check.condition == "near_baseline"
    assert check.baseline(metrics) == pytest.approx(1.0 - np.mean(labels), abs=1e-9)


def test_rtd_majority_rate_without_a_true_positive_is_a_bound_below():
    """No true positive (precision = recall = 0): the rate read is the accuracy itself, so
    the check holds, as it must: the accuracy is below the majority rate by the false
    positives."""
    check = {c.metric: c for c in OBJECTIVES["mrtd"]().health_checks()}["rtd_accuracy"]
    got = check.baseline({"rtd_accuracy": 0.8, "rtd_precision": 0.0, "rtd_recall": 0.0})
    assert got == pytest.approx(0.8)
    # a perfect detector leaves no replaced share to read: no reference, no verdict
    assert check.baseline({"rtd_accuracy": 1.0, "rtd_precision": 1.0, "rtd_recall": 1.0}) is None


def test_xlco_chance_counts_the_queue_and_the_in_batch_negatives():
    def chance(obj):
        return {c.metric: c for c in obj.health_checks()}["accuracy"].baseline
    assert chance(OBJECTIVES["xlco"]())({"count": 32.0}) == pytest.approx(1 / 9)
    assert chance(XLCo(NET, queue_size=8, in_batch_negatives=True))(
        {"count": 32.0}) == pytest.approx(1 / 40)
    assert chance(OBJECTIVES["xlco_in_batch"]())({"count": 32.0}) == pytest.approx(1 / 32)


def test_a_check_names_a_known_condition_and_its_baseline():
    with pytest.raises(ValueError, match="condition='flat' must be one of near_zero"):
        HealthCheck("loss", "flat", "m", "k")
    with pytest.raises(ValueError, match="condition='near_chance' needs baseline"):
        HealthCheck("accuracy", "near_chance", "m", "k")
    with pytest.raises(ValueError, match="condition='near_zero' takes no baseline"):
        HealthCheck("recall", "near_zero", "m", "k", baseline=lambda m: 0.0)
