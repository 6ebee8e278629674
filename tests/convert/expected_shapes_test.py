"""`convert.weights.expected_shapes`: the parameter shapes every load checks against, traced
once per (config, head) in a process and handed out as a fresh dict each time."""
import flax.linen as nn
import jax
import numpy as np

from xlm_jax.convert import weights
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.transformer import Transformer


def _traced(cfg: ModelConfig, with_mlm_head: bool) -> dict:
    """The shapes of the model's own init, traced here (the reference)."""
    ids = jax.ShapeDtypeStruct((1, 4), np.int32)
    model = Transformer(cfg, with_mlm_head=with_mlm_head)
    tree = jax.eval_shape(lambda i: nn.meta.unbox(model.init(jax.random.PRNGKey(0), i)), ids)
    return {path: tuple(v.shape) for path, v in weights.flatten(tree["params"]).items()}


def test_shapes_are_the_models_own_and_a_second_call_does_not_trace_again():
    small = ModelConfig(vocab_size=40, num_layers=1, hidden_size=8, num_heads=2, mlp_dim=16,
                        max_positions=16)
    wider = small.replace(hidden_size=16, mlp_dim=32)
    for cfg in (small, wider):
        for head in (True, False):
            assert weights.expected_shapes(cfg, with_mlm_head=head) == _traced(cfg, head)
    before = weights._expected_shapes.cache_info()
    first = weights.expected_shapes(wider, with_mlm_head=True)
    assert weights._expected_shapes.cache_info().hits == before.hits + 1
    assert first["embeddings/word_embeddings/embedding"] == (40, 16)
    first.clear()  # the caller's dict is its own: the next caller gets every shape again
    assert weights.expected_shapes(wider, with_mlm_head=True) == _traced(wider, True)
    assert weights.expected_shapes(small, with_mlm_head=True) != _traced(wider, True)
