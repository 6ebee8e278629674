"""Trainer correctness: sharded == single device, accumulation == big batch, restore onto a
different mesh, NaN stop, and the bad-input errors."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from testlib.tiny_run import assert_trees_close as _assert_trees_close
from testlib.tiny_run import mlm_objectives as _objectives
from testlib.tiny_run import train_tiny as _train
from xlm_jax.objectives.base import LossOutput, Metric, Objective, WeightedObjective
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import loop, partitioning


def _final_params(model_dir):
    from xlm_jax.convert import hf

    return hf.load_xlm_jax(str(model_dir))[1]


@pytest.mark.parametrize("embed_proj", ["replicated", "tensor"])
def test_eight_devices_match_single_device(tmp_path, embed_proj):
    # "tensor": the heads' d x d projection split over `tensor` too; it gave wrong gradients
    # while the model's activation constraints were inactive (legacy `with mesh:`).
    # "replicated" runs as users do: dropout on (its masks are the same bits on any mesh:
    # jax's partitionable threefry) and asynchronous saves of the donated state.
    # "tensor" also runs two layers, so activations are resharded between layers too.
    overrides = [("embed_proj", "tensor")] if embed_proj == "tensor" else []
    kw = {"model": {"num_layers": 2}} if embed_proj == "tensor" else {
        "model": {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, "async_save": True,
        "save_every": 2}
    single = _train(tmp_path / "one", 5, **kw)
    sharded = _train(tmp_path / "eight", 5, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
                     num_devices=8, axis_rule_overrides=overrides, **kw)
    assert len(single.losses) == 5 and single.losses[0] > 5.0
    np.testing.assert_allclose(sharded.losses, single.losses, atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "eight"), _final_params(tmp_path / "one"), 1e-5)


def test_gradient_accumulation_equals_big_batch(tmp_path):
    # As users run: dropout on (each row's masks are drawn from its index in the step's global
    # batch, so 4 microbatches draw the big batch's masks) and asynchronous saves of the
    # donated state. Drawing the masks from the microbatch's key instead fails at step 1.
    kw = {"model": {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, "async_save": True,
          "save_every": 2}
    big = _train(tmp_path / "big", 3, batch=16, **kw)
    acc = _train(tmp_path / "acc", 3, batch=16, accum=4, **kw)
    np.testing.assert_allclose(acc.losses, big.losses, atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "acc"), _final_params(tmp_path / "big"), 1e-5)


def test_restore_one_device_checkpoint_onto_eight(tmp_path):
    straight = _train(tmp_path / "straight", 8)
    first = _train(tmp_path / "moved", 4)  # 1 device; final save at step 4
    assert first.losses == straight.losses[:4]
    second = _train(tmp_path / "moved", 8, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
                    num_devices=8)
    assert len(second.losses) == 4  # resumed at step 4, ran 5..8
    np.testing.assert_allclose(second.losses, straight.losses[4:], atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "moved"), _final_params(tmp_path / "straight"),
                        1e-5)


class _NanAfterThreeSteps(MaskedLM):
    """Counts optimizer steps in its objective state; its loss turns NaN from the 4th step."""

    def init_state(self, params):
        return {"updates": jnp.zeros((), jnp.int32)}

    def after_update(self, params, state, inputs):
        return {"updates": state["updates"] + 1}

    def loss(self, params, prepared, rng, state, deterministic=False):
        out = super().loss(params, prepared, rng, state, deterministic)
        bad = jnp.where(state["updates"] >= 3, jnp.nan, 0.0)
        return out.replace(losses={"loss": out.losses["loss"] + bad})


def test_nan_loss_stops_naming_step_and_objective_keeping_last_good_checkpoint(tmp_path):
    with pytest.raises(FloatingPointError) as e:
        _train(tmp_path, 10, save_every=2, objectives=_objectives(_NanAfterThreeSteps))
    msg = str(e.value)
    assert "step 4" in msg and "'mmlm'" in msg and "last good checkpoint: step 2" in msg
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3]  # the NaN step was not logged as a normal step


def test_nan_between_log_steps_is_found_at_the_next_fetch_before_any_save(tmp_path):
    # the host reads metrics at steps 3 (save) and 5 (log) only: the NaN of step 4 is found at
    # step 5, named as step 4, and nothing after the good step-3 checkpoint is saved
    with pytest.raises(FloatingPointError) as e:
        _train(tmp_path, 10, save_every=3, log_every=5,
               objectives=_objectives(_NanAfterThreeSteps))
    msg = str(e.value)
    assert "step 4" in msg and "'mmlm'" in msg and "last good checkpoint: step 3" in msg
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]


def test_batch_not_divisible_by_data_parallel_size(tmp_path):
    with pytest.raises(ValueError, match=r"global batch size 6 is not divisible by the "
                                         r"data-parallel size 4"):
        _train(tmp_path, 2, batch=6, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
               num_devices=8)


def test_unwritable_model_dir_fails_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((ValueError, PermissionError, OSError)) as e:
        _train(blocker / "run", 2)
    assert str(blocker) in str(e.value)


def test_periodic_eval_writes_eval_metrics(tmp_path):
    objectives = _objectives()
    objectives["mmlm"] = loop.ObjectiveSpec(
        factory=objectives["mmlm"].factory, task="synthetic:mono", eval_task="synthetic:mono")
    _train(tmp_path, 4, objectives=objectives, eval_every=2, eval_batches=2)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:  # only the objective with an eval task is evaluated
        assert 4.0 < r["mmlm/loss"] < 7.0 and 0.0 <= r["mmlm/accuracy"] <= 1.0
        assert "tlm/loss" not in r
    assert evals[0]["mmlm/loss"] != evals[1]["mmlm/loss"]  # the parameters changed


def test_data_resume_reseed_is_a_deterministic_new_draw(tmp_path):
    # (data_resume="replay", the default, is the exact resume of cli_test's SIGKILL test)
    import shutil

    straight = _train(tmp_path / "straight", 4, save_every=2)
    for name in ("a", "b"):  # a run preempted after its step-2 checkpoint
        shutil.copytree(tmp_path / "straight", tmp_path / name)
        shutil.rmtree(tmp_path / name / "checkpoints" / "4")
    a = _train(tmp_path / "a", 4, data_resume="reseed")
    b = _train(tmp_path / "b", 4, data_resume="reseed")
    assert len(a.losses) == 2 and a.losses == b.losses  # same checkpoint, same batches
    # other batches than the uninterrupted run's (the model and the rng are the same)
    assert all(abs(x - y) > 1e-4 for x, y in zip(a.losses, straight.losses[2:]))
    assert streams_lib.resume_plan(7, 0, "reseed") == (7, 0)  # fresh runs ignore the mode
    assert streams_lib.resume_plan(7, 3, "replay") == (7, 3)
    assert streams_lib.resume_plan(7, 3, "reseed") != streams_lib.resume_plan(7, 4, "reseed")


def test_unknown_data_resume_mode_fails_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"data_resume='resume' is not one of \('checkpoint', 'replay', "
                                         r"'reseed'\)"):
        _train(tmp_path / "run", 2, data_resume="resume")
    assert not os.path.exists(tmp_path / "run")


def test_bfloat16_compute_on_eight_devices_tracks_float32(tmp_path):
    fp32 = _train(tmp_path / "fp32", 3)
    bf16 = _train(tmp_path / "bf16", 3, model={"dtype": "bfloat16"},
                  mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)
    np.testing.assert_allclose(bf16.losses, fp32.losses, atol=1e-2, rtol=0)
    assert bf16.losses != fp32.losses  # the activations really were bf16
    params = _final_params(tmp_path / "bf16")
    assert {str(v.dtype) for v in jax.tree_util.tree_leaves(params)} == {"float32"}


def test_language_embedding_model_trains_and_evaluates_on_synthetic_streams(tmp_path):
    # Synthetic lang_ids used to reach num_languages, one past the table (row 0 = padding):
    # jnp.take filled that row with NaN and the run stopped at step 1.
    from xlm_jax.data.synthetic import synthetic_batch

    n = streams_lib.synthetic_language_count(3)
    lang_ids = synthetic_batch(64, 32, 256, "pair", seed=0, num_languages=n)["lang_ids"]
    assert set(np.unique(lang_ids)) == {0, 1, 2}  # padding plus the table's two languages
    objectives = _objectives()
    objectives["mmlm"] = loop.ObjectiveSpec(
        factory=objectives["mmlm"].factory, task="synthetic:mono", eval_task="synthetic:mono")
    result = _train(tmp_path, 3, model={"num_languages": 3}, objectives=objectives,
                    eval_every=3, eval_batches=1)
    assert len(result.losses) == 3 and all(np.isfinite(result.losses))
    (evaluated,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")
                    if json.loads(line)["split"] == "eval"]
    assert np.isfinite(evaluated["mmlm/loss"])


# ------------------------------------------------------------------ the per-term loss contract


class _TwoTerms(Objective):
    """A toy objective on params {"encoder": {"w": [D]}}: term "a" sums (x . w)^2 over the rows
    with `a_mask`, term "b" sums |x . w - target| over the [B, K] slots of `b_mask`; metric
    "positive": the share of "a" rows with x . w > 0."""

    name = "toy"

    def __init__(self, weights=None, terms_returned=None, metric_name="positive"):
        self.term_weights = weights or {"a": 1.0, "b": 3.0}
        self.terms_returned, self.metric_name = terms_returned, metric_name

    def prepare(self, batch, rng):
        return dict(batch)

    def counts(self, prepared):
        return {t: jnp.sum(prepared[f"{t}_mask"]) for t in self.term_weights}

    def loss(self, params, prepared, rng, state, deterministic=False):
        z = prepared["x"] @ params["encoder"]["w"]
        a_mask, b_mask = prepared["a_mask"], prepared["b_mask"]
        sums = {"a": jnp.sum(a_mask * z ** 2),
                "b": jnp.sum(b_mask * jnp.abs(z[:, None] - prepared["target"]))}
        sums = {t: sums[t] for t in (self.terms_returned or self.term_weights)}
        return LossOutput(losses=sums, metrics={self.metric_name: Metric(
            jnp.sum(a_mask * (z > 0)), jnp.sum(a_mask))})


class _OneTerm(_TwoTerms):
    name = "one"

    def __init__(self):
        super().__init__(weights={"a": 1.0})


def _toy_batch(seed, rows=8, dim=3, k=4):
    rng = np.random.default_rng(seed)
    # uneven masks: every microbatch of 2 rows has its own counts
    return {"x": jnp.asarray(rng.normal(size=(rows, dim)), jnp.float32),
            "target": jnp.asarray(rng.normal(size=(rows, k)), jnp.float32),
            "a_mask": jnp.asarray(rng.random(rows) < 0.6, jnp.float32).at[0].set(1.0),
            "b_mask": jnp.asarray(rng.random((rows, k)) < 0.3, jnp.float32).at[0, 0].set(1.0)}


def _toy_step(objs, accum=1, normalization="per_objective"):
    import optax

    from xlm_jax.train import step as step_lib

    tx = optax.sgd(0.1)
    params = {"encoder": {"w": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}, "objectives": {}}
    state = step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(params), obj_state={o.name: {} for o in objs})
    fn = jax.jit(step_lib.make_train_step(objs, tx, accum_steps=accum,
                                          normalization=normalization))
    batches = {o.name: _toy_batch(i) for i, o in enumerate(objs)}
    return fn(state, batches, jax.random.PRNGKey(0)), batches, params


def _np_terms(batch, w):
    z = np.asarray(batch["x"]) @ np.asarray(w)
    a, b = np.asarray(batch["a_mask"]), np.asarray(batch["b_mask"])
    return ({"a": (a * z ** 2).sum(), "b": (b * np.abs(z[:, None] - batch["target"])).sum()},
            {"a": a.sum(), "b": b.sum()}, (a * (z > 0)).sum() / a.sum())


def test_loss_is_the_weighted_sum_of_term_means_and_accumulation_is_exact():
    """Per objective: L_o = sum_t lambda_t sum_t / N_t over the global counts; 4 microbatches
    of uneven counts give the one-batch step's loss, metrics and update."""
    objs = [WeightedObjective(_TwoTerms(), 2.0)]
    (one, m1), batches, params = _toy_step(objs)
    (four, m4), _, _ = _toy_step(objs, accum=4)
    sums, counts, positive = _np_terms(batches["toy"], params["encoder"]["w"])
    means = {t: sums[t] / counts[t] for t in sums}
    assert float(m1["toy/loss"]) == pytest.approx(means["a"] + 3.0 * means["b"], rel=1e-6)
    assert float(m1["loss"]) == pytest.approx(2.0 * (means["a"] + 3.0 * means["b"]), rel=1e-6)
    for t in ("a", "b"):
        assert float(m1[f"toy/{t}_loss"]) == pytest.approx(means[t], rel=1e-6)
    assert float(m1["toy/count"]) == counts["a"] + counts["b"]
    assert float(m1["toy/positive"]) == pytest.approx(positive, rel=1e-6)
    assert set(m1) == set(m4)
    for k in m1:
        np.testing.assert_allclose(float(m4[k]), float(m1[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    np.testing.assert_allclose(np.asarray(four.params["encoder"]["w"]),
                               np.asarray(one.params["encoder"]["w"]), rtol=1e-6, atol=1e-7)


def test_pooled_weighs_each_objectives_loss_by_its_share_of_the_units():
    """pooled: sum_o w_o N_o L_o / sum_o N_o with N_o the units of all of o's terms (its
    `count`); the one-term objective's part is w_o * its loss sum / all units (unilm)."""
    objs = [WeightedObjective(_TwoTerms(), 2.0), WeightedObjective(_OneTerm(), 0.5)]
    (_, m), batches, params = _toy_step(objs, accum=2, normalization="pooled")
    w = params["encoder"]["w"]
    s2, n2, _ = _np_terms(batches["toy"], w)
    s1, n1, _ = _np_terms(batches["one"], w)
    units = n2["a"] + n2["b"] + n1["a"]
    want = (2.0 * (n2["a"] + n2["b"]) * (s2["a"] / n2["a"] + 3.0 * s2["b"] / n2["b"])
            + 0.5 * s1["a"]) / units
    assert float(m["loss"]) == pytest.approx(want, rel=1e-6)
    assert "one/a_loss" not in m and float(m["one/loss"]) == pytest.approx(s1["a"] / n1["a"],
                                                                          rel=1e-6)
    assert float(m["loss"]) == pytest.approx(
        sum(o.weight * float(m[f"{o.name}/loss"]) * float(m[f"{o.name}/count"]) for o in objs)
        / (float(m["toy/count"]) + float(m["one/count"])), rel=1e-6)


@pytest.mark.parametrize("objective, match", [
    (_TwoTerms(terms_returned=("a",)), r"objective 'toy': loss\(\) gives the terms \['a'\] but "
                                       r"term_weights declares \['a', 'b'\]"),
    (_TwoTerms(weights={"a": 1.0, "b": -1.0}), r"objective 'toy': term_weights\['b'\]=-1.0 "
                                               r"must be a finite number >= 0"),
    (_TwoTerms(metric_name="a_loss"), r"objective 'toy': metric names \['a_loss'\] are "
                                      r"reported by the trainer already"),
])
def test_contract_errors_name_the_objective(objective, match):
    with pytest.raises(ValueError, match=match):
        _toy_step([WeightedObjective(objective)])
