"""A new objective needs no FLOP formula: one written from docs/adding_an_objective.md alone
(`tests/testlib/first_token.py`: two loss terms, a head of its own, no `flops_per_example`,
no entry in flops_test.py) gets its model FLOPs, and so its MFU and model TFLOP/s, from the
jaxpr of its loss's gradient (`train.step_flops.jaxpr_flops_per_example`). Checked against the
closed form written out here, and through the real trainer. Also: the jaxpr count multiplies a
scanned layer stack's body by its length, and sees attention on every backend."""
import dataclasses

import pytest

from testlib.first_token import MaskedLMWithFirstToken
from testlib.tiny_run import TINY_MODEL, train_tiny
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import step_flops as flops, loop

T, P = 32, 4


def _closed_form(cfg, seq_len, predictions):
    """Forward + backward (x 3) matmul FLOPs of one example: per token and layer the four
    d x d projections, the d x f x 2 FFN and the T x d scores and values; the tied MLM head at
    each prediction slot (d x d transform, d x padded vocabulary); the first-token head once
    per row (d x vocabulary)."""
    d, f, layers = cfg.hidden_size, cfg.mlp_dim, cfg.num_layers
    encoder = seq_len * layers * (2 * (4 * d * d + 2 * d * f) + 2 * 2 * seq_len * d)
    mlm_head = predictions * 2 * (d * d + d * cfg.padded_vocab_size)
    first_head = 2 * d * cfg.vocab_size
    return 3.0 * (encoder + mlm_head + first_head)


def test_new_objective_is_counted_from_its_jaxpr():
    cfg = get_config("tiny", **TINY_MODEL)
    obj = MaskedLMWithFirstToken(Transformer(cfg), max_predictions=P)
    assert obj.flops_per_example(T) is None  # no formula of its own
    assert flops.objective_flops_per_example(obj, T) == pytest.approx(_closed_form(cfg, T, P),
                                                                      rel=1e-12)


def test_the_trainer_reports_its_model_flops(tmp_path):
    """Two steps of the real loop: the run's FLOPs per token are the closed form over the row
    length, and the logged model TFLOP/s are those FLOPs times the logged tokens per second."""
    specs = {"mlm_first": loop.ObjectiveSpec(
        factory=lambda model, name: MaskedLMWithFirstToken(model, name, max_predictions=P),
        task="synthetic:mono")}
    result = train_tiny(tmp_path / "run", 2, objectives=specs)
    cfg = get_config("tiny", **TINY_MODEL)
    assert result.flops_per_token == pytest.approx(_closed_form(cfg, T, P) / T, rel=1e-12)
    last = result.last_metrics
    assert last["model_tflops_per_sec"] == pytest.approx(
        result.flops_per_token * last["tokens_per_sec"] / 1e12, rel=1e-9)
    assert {"mlm_first/mlm_loss", "mlm_first/first_token_loss"} <= set(last)


def test_jaxpr_count_multiplies_a_scanned_stack_and_sees_every_attention_backend():
    """MMLM's analytic count against the jaxpr's, with the layers in one `nn.scan` (the body
    appears once in the jaxpr; it runs num_layers times) and with the fused-kernel backend
    requested (the count traces every attention on the XLA path, where its dots are seen)."""
    base = get_config("tiny", **TINY_MODEL)
    for cfg in (dataclasses.replace(base, scan_layers=True),
                dataclasses.replace(base, attention_backend="pallas")):
        obj = MaskedLM(Transformer(cfg), max_predictions=P)
        assert flops.jaxpr_flops_per_example(obj, T) == pytest.approx(
            obj.flops_per_example(T), rel=1e-12), cfg
