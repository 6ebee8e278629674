"""XLM-E's generator/discriminator embedding sharing: "tokens" (the token table only) or "all"
(the whole embedding block, ELECTRA's sharing). Checked through the gradient of the generator's
MLM loss (which encoder embedding parameters it reaches), through the generator's embedding
output against the discriminator's (identical under "all"), and the errors for a mode that does
not fit the generator."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective, init_params
from xlm_jax.objectives.xlme import ReplacedTokenDetection

CFG = get_config("tiny", vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0,
                 position_type="both")


def _setup(**kw):
    net = Transformer(CFG)
    obj = ReplacedTokenDetection(net, name="rtd", generator_layers=1, max_predictions=6,
                                 mask_prob=0.3, **kw)
    params = nn.meta.unbox(init_params(net, [WeightedObjective(obj)], 16, jax.random.PRNGKey(0)))
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 16, 64, "mono", seed=2).items()}
    return net, obj, params, obj.prepare(batch, jax.random.PRNGKey(3))


def _generator_grads(obj, params, prep):
    """Gradient of the generator's MLM sum alone (the detection loss is left out)."""
    return jax.grad(lambda p: obj.forward(p, prep, jax.random.PRNGKey(5), True).mlm_sum)(params)


@pytest.mark.parametrize("mode, shared", [
    ("tokens", {"word_embeddings"}),
    ("all", {"word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm"})])
def test_the_generator_trains_the_encoder_embeddings_it_shares(mode, shared):
    _, obj, params, prep = _setup(embedding_sharing=mode)
    own = params["objectives"]["generator"]
    assert ("embeddings" in own) == (mode == "tokens")
    grads = _generator_grads(obj, params, prep)["encoder"]["embeddings"]
    reached = {name for name, tree in grads.items()
               if max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(tree)) > 0}
    assert reached == shared
    assert float(jnp.abs(grads["word_embeddings"]["embedding"]).max()) > 0


def test_sharing_all_gives_the_generator_the_discriminators_embedding_output():
    net, obj, params, prep = _setup(embedding_sharing="all")
    gen_params = obj._generator_params(params)

    def embed(model, p):
        return model.apply({"params": p}, prep["input_ids"], return_hidden_states=True,
                           deterministic=True, method=Transformer.encode).hidden_states[0]

    np.testing.assert_array_equal(np.asarray(embed(obj.generator, gen_params)),
                                  np.asarray(embed(net, params["encoder"])))
    # with "tokens" the generator's own position/type tables and LayerNorm make it differ
    _, tok, tok_params, _ = _setup(embedding_sharing="tokens")
    assert np.abs(np.asarray(embed(tok.generator, tok._generator_params(tok_params)))
                  - np.asarray(embed(net, tok_params["encoder"]))).max() > 1e-3


@pytest.mark.parametrize("kw, match", [
    ({"embedding_sharing": "all", "generator_hidden_size": 16},
     r"embedding_sharing='all' needs the generator at the discriminator's width, but "
     r"generator_hidden_size=16 and hidden_size=32"),
    ({"embedding_sharing": "all", "generator_position_type": "relative"},
     r"embedding_sharing='all' shares the position table, but generator_position_type="
     r"'relative'"),
    ({"embedding_sharing": "block"}, r"embedding_sharing='block' must be one of tokens, all"),
])
def test_a_sharing_mode_that_does_not_fit_the_generator_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ReplacedTokenDetection(Transformer(CFG), generator_layers=1, **kw)
