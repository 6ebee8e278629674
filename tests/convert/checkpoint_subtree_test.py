"""Reading part of a trainer checkpoint: `model_dir.restore_subtree` returns the arrays under
its keys equal to a whole restore's, deserialises only them (the optimiser's moments and the
objectives' state are never read), and names what is there when a key is not."""
import numpy as np
import orbax.checkpoint as ocp
import pytest

import jax
from tests.testlib.tiny_run import train_tiny
from xlm_jax import model_dir as md
from xlm_jax.convert import hf


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    train_tiny(path, 2)
    return str(path)


def _flat(tree):
    return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture
def read_names(monkeypatch):
    """The names of the arrays orbax deserialises, whichever handler reads them."""
    names = []
    for cls in (ocp.type_handlers.NumpyHandler, ocp.type_handlers.ArrayHandler):
        original = cls.deserialize

        async def recording(self, infos, args=None, _original=original):
            names.extend(info.name for info in infos)
            return await _original(self, infos, args)

        monkeypatch.setattr(cls, "deserialize", recording)
    return names


def test_the_encoder_alone_equals_the_whole_restore_and_only_it_is_read(run_dir, read_names):
    state_dir = md.trainer_state_dir(run_dir)
    with ocp.StandardCheckpointer() as ckptr:
        whole = ckptr.restore(state_dir)
    everything = len(read_names)
    read_names.clear()
    encoder = md.restore_subtree(state_dir, ("params", "encoder"))
    want, got = _flat(whole["params"]["encoder"]), _flat(encoder)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert isinstance(got[key], np.ndarray) and got[key].dtype == value.dtype
        np.testing.assert_array_equal(got[key], np.asarray(value), err_msg=key)
    # Only the encoder's arrays were deserialised: none of Adam's moments or the step.
    assert len(read_names) == len(want) < everything / 2
    assert all(name.startswith("params.encoder.") for name in read_names), read_names[:3]
    # The loaders that need no optimiser state read the same way.
    read_names.clear()
    cfg, params = hf.load_xlm_jax(run_dir)
    assert len(read_names) == len(want) and sorted(_flat(params)) == sorted(want)
    read_names.clear()
    both = md.restore_subtree(state_dir, ("params",))
    assert set(both) == {"encoder", "objectives"}
    assert all(name.startswith("params.") for name in read_names)


def test_a_missing_key_names_what_is_there(run_dir):
    state_dir = md.trainer_state_dir(run_dir)
    with pytest.raises(KeyError) as info:
        md.restore_subtree(state_dir, ("params", "decoder"))
    message = info.value.args[0]
    assert "\n" not in message
    assert message == f"{state_dir}: no params/decoder in this checkpoint (params holds encoder, " \
                      "objectives)"
    with pytest.raises(KeyError, match="its top level holds .*opt_state.*params"):
        md.restore_subtree(state_dir, ("weights",))
    assert hf.encoder_keys(md.saved_tree(state_dir)) == ("params", "encoder")


def test_encoder_keys_of_each_saved_layout():
    emb = {"embeddings": {}, "layers_0": {}}
    assert hf.encoder_keys({"step": 0, "params": {"encoder": emb, "objectives": {}}}) == (
        "params", "encoder")
    assert hf.encoder_keys({"step": 0, "params": emb, "opt_state": []}) == ("params",)
    assert hf.encoder_keys({"encoder": emb, "objectives": {}}) == ("encoder",)
    assert hf.encoder_keys(emb) == ()
