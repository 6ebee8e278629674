"""Alternating objectives and per-objective batch shapes (`train.mixture`): the schedule, the
trainer against a hand-written schedule, resume across phases, the logged metrics, the FLOP
count, and the configuration errors."""
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from testlib.tiny_run import TINY_MODEL, assert_trees_close
from testlib.tiny_run import train_tiny as _train
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import step_flops as flops, loop, mixture
from xlm_jax.train import optim as optim_lib
from xlm_jax.train import step as step_lib

OPT = optim_lib.OptimizerConfig(learning_rate=3e-3, warmup_steps=2, total_steps=20)


def _alternating() -> dict[str, loop.ObjectiveSpec]:
    """MMLM on even steps at the run's shape (8 x 32), TLM on odd steps at 4 x 16."""
    return {
        "mmlm": loop.ObjectiveSpec(factory=lambda model, name: MaskedLM(
            model, name=name, kind="mono", max_predictions=6), task="synthetic:mono",
            every=2, offset=0),
        "tlm": loop.ObjectiveSpec(factory=lambda model, name: MaskedLM(
            model, name=name, kind="pair", max_predictions=5), task="synthetic:pair",
            batch_size=4, seq_len=16, every=2, offset=1),
    }


def _encoder(model_dir):
    from xlm_jax.convert import hf

    return hf.load_xlm_jax(str(model_dir))[1]


def test_runs_before_counts_the_steps_an_objective_ran():
    for every in (1, 2, 3, 5):
        for offset in range(every):
            s = mixture.Shape(8, 32, every, offset)
            for start in range(13):
                assert s.runs_before(start) == sum(
                    step % every == offset for step in range(start)), (every, offset, start)


def test_alternating_run_equals_a_hand_written_schedule(tmp_path):
    steps = 5
    result = _train(tmp_path / "run", steps, objectives=_alternating(), optimizer=OPT)

    # The reference: the same init, optimizer and pure step, with the batches drawn by hand
    # in the order the schedule means (mmlm at steps 0, 2, 4; tlm at 1, 3) at their shapes.
    cfg = loop.model_config("tiny", TINY_MODEL)
    net = Transformer(cfg)
    specs = _alternating()
    objs = [step_lib.WeightedObjective(spec.factory(model=net, name=name))
            for name, spec in specs.items()]
    tx = optim_lib.make_optimizer(OPT)
    init_fn = step_lib.make_init_fn(net, objs, tx, 32)
    state = jax.jit(lambda r: nn.meta.unbox(init_fn(r)))(jax.random.PRNGKey(0))
    train_step = jax.jit(step_lib.make_train_step(objs, tx, optim_lib.make_schedule(OPT)))
    streams = {
        "mmlm": streams_lib.make_stream("synthetic:mono", 8, 32, 0, 0, cfg.vocab_size),
        "tlm": streams_lib.make_stream("synthetic:pair", 4, 16, 1000, 0, cfg.vocab_size),
    }
    losses = []
    for name in ["mmlm", "tlm", "mmlm", "tlm", "mmlm"]:
        state, metrics = train_step(state, {name: next(streams[name])}, jax.random.PRNGKey(1))
        assert set(k.split("/")[0] for k in metrics if "/" in k) == {name}
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(result.losses, losses, rtol=1e-6, atol=0)
    assert_trees_close(_encoder(tmp_path / "run"), state.params["encoder"], 1e-6)

    # each logged row reports the objective of its own step only (log_every = 1)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")
            if json.loads(line)["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        ran, idle = ("mmlm", "tlm") if r["step"] % 2 else ("tlm", "mmlm")
        assert f"{ran}/loss" in r and f"{idle}/loss" not in r, r


def test_resume_across_phases_is_exact(tmp_path):
    straight = _train(tmp_path / "straight", 6, objectives=_alternating(), optimizer=OPT)
    first = _train(tmp_path / "resumed", 3, objectives=_alternating(), optimizer=OPT)
    # resumed at step 3: mmlm has run twice (steps 0, 2), tlm once (step 1)
    second = _train(tmp_path / "resumed", 6, objectives=_alternating(), optimizer=OPT)
    assert first.losses + second.losses == straight.losses
    assert_trees_close(_encoder(tmp_path / "resumed"), _encoder(tmp_path / "straight"), 0.0)


def test_window_metrics_are_means_over_the_steps_that_reported_them(tmp_path):
    result = _train(tmp_path / "run", 4, objectives=_alternating(), optimizer=OPT,
                    log_every=4)
    # the one logged window is steps 1..4: the mixture loss averages all four steps
    assert result.last_metrics["loss"] == pytest.approx(np.mean(result.losses), rel=1e-6)
    assert result.last_metrics["learning_rate"] == pytest.approx(
        float(optim_lib.make_schedule(OPT)(3)))


def test_flops_per_token_weighs_each_objective_by_its_rows_length_and_period():
    net = Transformer(get_config("tiny", **TINY_MODEL))
    mono, pair = (MaskedLM(net, kind="mono", max_predictions=6),
                  MaskedLM(net, kind="pair", max_predictions=5))
    shapes = [mixture.Shape(8, 32, 2, 0), mixture.Shape(4, 16, 4, 1)]
    got = flops.mixture_flops_per_token([mono, pair], 32, shapes)
    # over a cycle of 4 steps: mono runs twice (8 x 32), pair once (4 x 16)
    want = ((2 * 8 * mono.flops_per_example(32) + 4 * pair.flops_per_example(16))
            / (2 * 8 * 32 + 4 * 16))
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("change, message", [
    ({"every": 0}, "objective 'tlm': every=0 must be a positive integer"),
    ({"offset": 2}, "objective 'tlm': offset=2 must be in [0, every=2)"),
    ({"batch_size": -4}, "objective 'tlm': batch_size=-4 must be a positive integer"),
    ({"seq_len": 0}, "objective 'tlm': seq_len=0 must be a positive integer"),
    ({"offset": 0}, "no objective runs at steps 1 (mod 2) of the mixture"),
])
def test_bad_schedules_fail_before_compiling(tmp_path, change, message):
    specs = _alternating()
    specs["tlm"] = loop.ObjectiveSpec(**{**specs["tlm"].__dict__, **change})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        _train(tmp_path / "bad", 2, objectives=specs, optimizer=OPT)


def test_an_objective_batch_not_divisible_by_the_devices_is_named(tmp_path):
    from xlm_jax.train import partitioning

    specs = _alternating()
    specs["tlm"] = loop.ObjectiveSpec(**{**specs["tlm"].__dict__, "batch_size": 6})
    with pytest.raises(ValueError, match="objective 'tlm': global batch size 6 is not "
                                         "divisible by the data-parallel size 4"):
        _train(tmp_path / "bad", 2, objectives=specs, optimizer=OPT,
               mesh=partitioning.MeshConfig(data=4), num_devices=4)
