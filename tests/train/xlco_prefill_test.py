"""XLCo's queue is filled before step 1 through the real `loop.train` (unilm's `fill_queue`):
the queue holds the keys a plain forward pass of the initial encoder gives on the XLCo
stream's first batches, step 1 trains on the batch after them with the loss on, a resume
across the fill is bit-identical and does not fill again, and the former warm-up is an option.

The reference keys here are computed without the objective's code: `Transformer.encode`'s
hidden state of the layer, row 0 (`<s>`), times the projection kernel, in numpy.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from testlib.tiny_run import TINY_MODEL, mlm_objectives
from testlib.tiny_run import assert_trees_close
from testlib.tiny_run import train_tiny
from xlm_jax import model_dir as md
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.xlco import XLCo
from xlm_jax.train import loop
from xlm_jax.train import streams as streams_lib

BATCH, SEQ, QUEUE, LAYER, TAU = 8, 32, 16, 1, 0.25  # the fill takes QUEUE / BATCH = 2 batches
XLCO_SEED = 2000  # the stream seed of the third objective of a seed-0 run (seed + 1000 * i)


def _specs(initial_fill: str = "prefill") -> dict[str, loop.ObjectiveSpec]:
    """MMLM + TLM + XLCo without masking of its rows (the reference needs no mask draw)."""
    specs = mlm_objectives()
    specs["xlco"] = loop.ObjectiveSpec(
        factory=lambda model, name: XLCo(model, name=name, kind="mixup_pair", layer=LAYER,
                                         queue_size=QUEUE, momentum=0.9, projection_dim=16,
                                         mask_prob=0.0, initial_fill=initial_fill),
        task="synthetic:mixup_pair")
    return specs


def _checkpoint(model_dir, step):
    """(train state, the checkpoint's JSON record) of checkpoint `step`."""
    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(md.trainer_state_dir(str(model_dir), step))
    extra = os.path.join(os.path.dirname(md.trainer_state_dir(str(model_dir), step)),
                         md.EXTRA_ITEM)
    return state, ocp.JsonCheckpointHandler().restore(epath.Path(extra))


def _xlco_batches(n: int) -> list[dict[str, np.ndarray]]:
    """The XLCo stream's first `n` global batches, drawn afresh."""
    cfg = get_config("tiny", **TINY_MODEL)
    stream = streams_lib.make_stream(
        "synthetic:mixup_pair", BATCH, SEQ, XLCO_SEED, 0, cfg.vocab_size,
        num_languages=streams_lib.synthetic_language_count(cfg.num_languages))
    return [next(stream) for _ in range(n)]


def _vectors(params, ids: np.ndarray) -> np.ndarray:
    """`<s>` of layer LAYER times the projection kernel, for rows `ids`."""
    net = Transformer(get_config("tiny", **TINY_MODEL))
    out = net.apply({"params": params["encoder"]}, np.asarray(ids), return_hidden_states=True,
                    method=Transformer.encode)
    cls = np.asarray(out.hidden_states[LAYER])[:, 0].astype(np.float64)
    return cls @ np.asarray(params["objectives"]["xlco"]["dense"]["kernel"], np.float64)


def _metrics(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "train"]


def test_queue_is_full_before_step_1_from_the_initial_encoder(tmp_path):
    result = train_tiny(tmp_path, 1, objectives=_specs(), save_initial=True)
    initial, record0 = _checkpoint(tmp_path, 0)  # written after the fill, before step 1
    after, record1 = _checkpoint(tmp_path, 1)
    assert record0["prefill"] == record1["prefill"] == {"xlco": 2}
    batches = _xlco_batches(3)
    keys = [_vectors(initial["params"], b["key_input_ids"]) for b in batches]
    fill = initial["obj_state"]["xlco"]
    assert int(fill["filled"]) == QUEUE and int(fill["ptr"]) == 0
    np.testing.assert_allclose(fill["queue"], np.concatenate(keys[:2]), rtol=1e-5, atol=1e-6)
    # the key encoder did not move during the fill: it is still the initial encoder
    assert_trees_close(fill["key_params"]["encoder"], initial["params"]["encoder"], 0.0)

    # step 1 trained on the stream's third batch, with the loss on against the filled queue
    q = _vectors(initial["params"], batches[2]["query_input_ids"])
    logits = np.concatenate([np.sum(q * keys[2], 1, keepdims=True),
                             q @ np.concatenate(keys[:2]).T], 1) / TAU
    nll = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1) \
        - logits[:, 0]
    assert nll.mean() > 0.5
    np.testing.assert_allclose(result.last_metrics["xlco/loss"], nll.mean(), rtol=1e-4)
    assert result.last_metrics["xlco/queue_fill"] == 1.0
    # its keys (the key encoder before its EMA) replaced the oldest, the first batch's
    queue = after["obj_state"]["xlco"]["queue"]
    np.testing.assert_allclose(queue, np.concatenate([keys[2], keys[1]]), rtol=1e-5, atol=1e-6)


def test_resume_across_the_fill_is_bit_identical(tmp_path):
    straight = train_tiny(tmp_path / "straight", 4, objectives=_specs())
    # the step compiled before the fill (train.compile_ahead) is the one the first step ran:
    # the state after the fill has the initial state's shapes, dtypes and shardings
    assert straight.compiled_ahead and straight.first_call_compiles == 0
    final = _checkpoint(tmp_path / "straight", 4)[0]
    # stopped right after the fill (step 0, written by save_initial), and after step 1
    for split, first in (("at0", 0), ("at1", 1)):
        train_tiny(tmp_path / split, 1, objectives=_specs(), save_initial=True)
        if first == 0:  # as if killed before step 1's save
            shutil.rmtree(os.path.join(md.checkpoints_dir(tmp_path / split), "1"))
        resumed = train_tiny(tmp_path / split, 4, objectives=_specs())
        assert resumed.losses == straight.losses[first:], split
        assert resumed.compiled_ahead and resumed.first_call_compiles == 0, split
        state, record = _checkpoint(tmp_path / split, 4)
        assert record["prefill"] == {"xlco": 2}
        # a second fill would have drawn two more batches and enqueued other keys
        assert_trees_close(state["obj_state"], final["obj_state"], 0.0)
        assert_trees_close(state["params"], final["params"], 0.0)


def test_warmup_option_keeps_the_loss_off_until_the_steps_fill_the_queue(tmp_path):
    train_tiny(tmp_path, 3, objectives=_specs("warmup"))
    rows = _metrics(tmp_path)
    assert [r["xlco/loss"] for r in rows[:2]] == [0.0, 0.0]
    assert [r["xlco/queue_fill"] for r in rows] == [0.0, 0.5, 1.0]
    assert rows[2]["xlco/loss"] > 0.5
    _, record = _checkpoint(tmp_path, 3)
    assert record["prefill"] == {}
