"""What the trainer passes to an objective's constructor from the run (`run_arguments`): the
run's language table reaches a gin-configured class and a `functools.partial` of one; a
factory that cannot receive it fails loudly instead of building with synthetic ids; an
undeclared argument name is refused, naming the objective."""
import functools

import gin
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import RUN_ARGUMENTS
from xlm_jax.objectives.ernie_m import BackTranslationMLM
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import setup

NET = Transformer(get_config("tiny", vocab_size=64, num_layers=1, hidden_size=16, num_heads=2,
                             mlp_dim=32, num_languages=6))
LANGUAGES = ["en", "de", "fr", "ja", "zh"]  # lang_ids 1..5


def _build(factory, languages=LANGUAGES):
    return setup.build_objective(NET, "btmlm", setup.ObjectiveSpec(factory=factory), languages,
                                 check_tasks=False)


@pytest.fixture
def gin_btmlm(gin_isolated):
    """`@btmlm/ernie_m.BackTranslationMLM` as a run file names it (dynamic registration under
    the class's own module path, as the run files do): gin's configurable subclass. It was
    registered here under a name of this file's once, which gin's `clear_config` does not
    undo: every later gin file naming the class by its module then found no bindings for it
    (issue 56); `gin_isolated` puts gin's registry back after the test."""
    gin.parse_config(["from __gin__ import dynamic_registration",
                      "from xlm_jax.objectives import ernie_m",
                      "btmlm/ernie_m.BackTranslationMLM.target_languages = ['fr', 'zh']",
                      "f = @btmlm/ernie_m.BackTranslationMLM"])
    return gin.query_parameter("%f").scoped_configurable_fn


def test_a_gin_configured_class_gets_the_run_language_table(gin_btmlm):
    obj = _build(gin_btmlm)
    assert isinstance(obj, BackTranslationMLM)
    assert obj.target_ids == (3, 5)  # fr, zh in the run's table, not the synthetic 1, 2
    assert _build(gin_btmlm, languages=None).target_ids == (1, 2)  # synthetic streams


def test_a_partial_of_the_class_gets_it_too():
    obj = _build(functools.partial(BackTranslationMLM, target_languages=["de", "ja"]))
    assert obj.target_ids == (2, 4)
    with pytest.raises(ValueError, match=r"BackTranslationMLM\(name='btmlm'\): target_languages "
                                         r"has 'xx'"):
        _build(functools.partial(BackTranslationMLM, target_languages=["de", "xx"]))


def test_a_factory_that_cannot_receive_the_table_fails_instead_of_guessing():
    """A lambda hides the class, so the trainer passes only `model` and `name`; the objective
    then lacks its required `languages` and says so, rather than resolving its targets as if
    the streams were synthetic."""
    with pytest.raises(TypeError, match="languages"):
        _build(lambda model, name: BackTranslationMLM(model, name, target_languages=["de"]))


def test_an_objective_without_run_arguments_is_called_with_model_and_name_only():
    seen = {}

    def factory(**kw):
        seen.update(kw)
        return MaskedLM(**kw)

    _build(factory)
    assert sorted(seen) == ["model", "name"]


def test_an_unknown_run_argument_is_refused_naming_the_objective():
    class Odd(MaskedLM):
        run_arguments = ("languages", "vocabulary")

    with pytest.raises(ValueError, match=r"objective 'btmlm': run_arguments names 'vocabulary'; "
                                         r"the trainer passes " + ", ".join(RUN_ARGUMENTS)):
        _build(Odd)
