"""Each objective's model-FLOP count (`Objective.flops_per_example`, `xlm_jax.train.step_flops`)
against an independent count: the FLOPs of every dot product in the jaxpr of the gradient of
its loss (2 x output size x contracted size per `dot_general`, through nested jaxprs). A pass
counted 3 x that is really under stop_gradient (or the reverse), a forgotten generator, head or
cross-attention block, all change the jaxpr's total. Also the peak table: the FLOP/s each
device kind the runtimes report maps to, and the warning for an accelerator it does not list."""
import logging
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params, objective_loss
from xlm_jax.objectives.ernie_m import BackTranslationMLM, CrossAttentionMLM
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.objectives.translation import Translation
from xlm_jax.objectives.veco import VariableMLM
from xlm_jax.objectives.xlco import XLCo
from xlm_jax.objectives.xlme import ReplacedTokenDetection
from xlm_jax.train import step_flops as flops

B, T = 2, 16
BASE = dict(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=48,
            max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)


def _dot_flops(jaxpr) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2.0 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += _dot_flops(inner)
    return total


def _measured(obj, kind):
    params = nn.meta.unbox(init_params(obj.model, [WeightedObjective(obj)], T,
                                       jax.random.PRNGKey(0)))
    state = nn.meta.unbox(obj.init_state(params)) if hasattr(obj, "queue_size") else {}
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(B, T, 64, kind, seed=0,
                                                           num_languages=3).items()}
    prep = obj.prepare(batch, jax.random.PRNGKey(1))

    counts = obj.counts(prep)

    def loss(p):
        out = obj.loss(p, prep, jax.random.PRNGKey(2), state, deterministic=True)
        return objective_loss(obj, out.losses, counts)

    return _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)


CASES = {
    "mmlm": (lambda n: MaskedLM(n, max_predictions=3), "mono", {}),
    "tlm_gated_bias": (lambda n: MaskedLM(n, "tlm", "pair", max_predictions=3), "pair",
                       {"position_type": "both"}),
    "xlme": (lambda n: ReplacedTokenDetection(n, generator_layers=1, max_predictions=3), "mono",
             {"position_type": "both"}),
    "camlm_two": (lambda n: CrossAttentionMLM(n, max_predictions=3, passes="two"), "pair",
                  {"num_languages": 4}),
    "camlm_one": (lambda n: CrossAttentionMLM(n, max_predictions=3, passes="one"), "pair",
                  {"num_languages": 4}),
    "btmlm": (lambda n: BackTranslationMLM(n, languages=None, target_languages=["a", "b"],
                                           proportion=0.2, max_predictions=3), "mono",
              {"num_languages": 4}),
    "veco": (lambda n: VariableMLM(n, max_predictions=5, mask_prob=0.25), "split_pair",
             {"cross_attention": True}),
    "translation": (lambda n: Translation(n, decoder_layers=1, languages=None), "split_pair",
                    {"cross_attention": True, "num_languages": 4}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_counted_flops_equal_the_dot_products_of_the_gradient(name):
    make, kind, extra = CASES[name]
    obj = make(Transformer(get_config("tiny", **{**BASE, **extra})))
    counted = B * obj.flops_per_example(T)
    np.testing.assert_allclose(counted, _measured(obj, kind), rtol=1e-9)


def test_xlco_counts_all_but_the_batch_dependent_scores():
    net = Transformer(get_config("tiny", **BASE))
    obj = XLCo(net, projection_dim=8, queue_size=4, in_batch_negatives=True, mask_prob=0.0)
    counted, measured = B * obj.flops_per_example(T), _measured(obj, "mixup_pair")
    scores = 2.0 * 2 * B * (B + 4) * 8  # q k^T and q queue^T, forward + d/dq
    np.testing.assert_allclose(counted + scores, measured, rtol=1e-9)


def test_mixture_flops_per_token_weighs_rows():
    net = Transformer(get_config("tiny", **BASE, cross_attention=True))
    mlm, veco = MaskedLM(net, max_predictions=3), VariableMLM(net, max_predictions=5)
    got = flops.mixture_flops_per_token([mlm, veco], T)
    want = (mlm.flops_per_example(T) + veco.flops_per_example(T)) / (3 * T)
    assert got == pytest.approx(want)
    # the one-objective MLM count is the classic per-token formula at P / T predictions
    plain = MaskedLM(Transformer(get_config("tiny", **BASE)), max_predictions=3)
    assert flops.mixture_flops_per_token([plain], T) == pytest.approx(
        flops.train_flops_per_token(plain.model.config, T, prediction_share=3 / T))


class _Device:  # what peak_flops_per_device reads of a jax.Device
    def __init__(self, device_kind, platform):
        self.device_kind, self.platform = device_kind, platform


# `jax.devices()[0].device_kind` as the runtimes report it (see flops.PEAK_BF16_FLOPS) -> peak.
KNOWN_KINDS = {
    ("TPU v4", "tpu"): 275e12,
    ("TPU v5 lite", "tpu"): 197e12,  # v5e
    ("TPU v5e", "tpu"): 197e12,
    ("TPU v5", "tpu"): 459e12,  # v5p
    ("TPU v5p", "tpu"): 459e12,
    ("TPU v6 lite", "tpu"): 918e12,  # v6e (Trillium)
    ("TPU v6e", "tpu"): 918e12,
    ("NVIDIA A100-SXM4-80GB", "gpu"): 312e12,
    ("NVIDIA A100 80GB PCIe", "gpu"): 312e12,
    ("NVIDIA H100 80GB HBM3", "gpu"): 989e12,  # SXM
    ("NVIDIA H100 PCIe", "gpu"): 756e12,
    ("NVIDIA H100 NVL", "gpu"): 835e12,
    ("NVIDIA H200", "gpu"): 989e12,
    ("NVIDIA B200", "gpu"): 2.25e15,
}
# Accelerators with no entry, some a substring match would have taken for a listed chip.
UNKNOWN_KINDS = [("TPU v4 lite", "tpu"), ("TPU7x", "tpu"), ("NVIDIA GH200 480GB", "gpu"),
                 ("NVIDIA GB200", "gpu"), ("NVIDIA L4", "gpu"), ("TPU v5 litepod", "tpu")]


@pytest.mark.parametrize("kind,platform", sorted(KNOWN_KINDS))
def test_peak_of_each_reported_device_kind(kind, platform):
    assert flops.peak_flops_per_device(_Device(kind, platform)) == KNOWN_KINDS[kind, platform]


def test_every_peak_entry_is_reached_and_sourced():
    """No entry is shadowed by an earlier one: each is the first match of some reported kind."""
    first = {next(i for i, (pattern, _, _) in enumerate(flops.PEAK_BF16_FLOPS)
                  if re.fullmatch(pattern, kind, flags=re.IGNORECASE))
             for kind, _ in KNOWN_KINDS}
    assert first == set(range(len(flops.PEAK_BF16_FLOPS)))
    for _, peak, source in flops.PEAK_BF16_FLOPS:
        assert source.startswith(("Google Cloud TPU", "NVIDIA")) and "FLOP/s" in source
        assert 1e14 < peak < 1e16


@pytest.mark.parametrize("kind,platform", UNKNOWN_KINDS)
def test_unknown_accelerator_has_no_peak_and_warns_once(kind, platform, caplog, monkeypatch):
    monkeypatch.setattr(flops, "_WARNED_KINDS", set())
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert flops.peak_flops_per_device(_Device(kind, platform)) is None
        assert flops.peak_flops_per_device(_Device(kind, platform)) is None
    (record,) = [r for r in caplog.records if r.name == flops.__name__]
    assert record.levelno == logging.WARNING and repr(kind) in record.getMessage()
    assert "MFU is not reported" in record.getMessage()


def test_cpu_has_no_peak_and_no_warning(caplog, monkeypatch):
    monkeypatch.setattr(flops, "_WARNED_KINDS", set())
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert flops.peak_flops_per_device(_Device("cpu", "cpu")) is None
        assert flops.mfu(1e12) is None  # this machine's own devices are CPUs
    assert not [r for r in caplog.records if r.name == flops.__name__]


def test_mfu_divides_by_the_peak_of_all_devices(monkeypatch):
    monkeypatch.setattr(flops.jax, "devices", lambda: [_Device("TPU v5", "tpu")])
    assert flops.mfu(459e12, num_devices=4) == pytest.approx(0.25)
