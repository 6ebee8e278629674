"""`SIZE`, the one knob that makes any run file small (xlm_jax/train/sizing.py): every run, demo
and league file parsed with `SIZE = 'tiny'` has the tiny encoder shape and builds every
objective, its layer values (XLCo's universal layer, XLM-E's generator, VECO's decoder) resolved
within the smaller depth; at its own size a file keeps the paper's values. Gin is parsed and
the objectives built (no parameters, no data, nothing compiled): a few hundredths of a second
per file."""
from __future__ import annotations

import glob
import os

import gin
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.train import gin_utils, sizing

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

ROOT = os.path.join(os.path.dirname(gin_utils.__file__), "..", "..", "gin_configs")
# Files under the three directories that are not run files: what they are instead.
NOT_RUN_FILES = {
    "league/common.gin": "the piece every league recipe includes (no objectives)",
    "league/tiny.gin": "a league plan (LeagueConfig), checked recipe by recipe below",
    "league/gpu_1h.gin": "a league plan (LeagueConfig), checked recipe by recipe below",
}
# A file's macros beyond the tools' synthetic ones (gin_utils.SYNTHETIC_RUN_MACROS).
EXTRA_MACROS = {"finetune/veco_translate.gin": [
    "SOURCE_FILE = 's'", "TARGET_FILE = 't'", "SOURCE_LANG = 'en'", "TARGET_LANG = 'de'"]}
RUN_FILES = sorted(
    os.path.relpath(p, ROOT) for d in ("runs", "demo", "league")
    for p in glob.glob(os.path.join(ROOT, d, "**", "*.gin"), recursive=True)
    if os.path.relpath(p, ROOT) not in NOT_RUN_FILES) + ["finetune/veco_translate.gin"]
TINY_SHAPE = {k: getattr(get_config("tiny"), k) for k in sizing.SHAPE_FIELDS}


def _layer_values(obj):
    """{what: value} of the layer index or count an objective was built with."""
    out = {}
    if hasattr(obj, "layer"):
        out["xlco_layer"] = obj.layer
    if hasattr(obj, "gen_config"):
        out["generator_layers"] = obj.gen_config.num_layers
    if hasattr(obj, "decoder_config"):
        out["decoder_layers"] = obj.decoder_config.num_layers
    return out


def _build(path, *bindings):
    """(ModelConfig, {objective: its layer values}) of `path` parsed with the synthetic macros
    and `bindings`, every objective built as the trainer builds it."""
    from xlm_jax.accelerator import pod_memory
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.train import setup

    gin.clear_config()
    try:
        gin_utils.parse([path], [*gin_utils.SYNTHETIC_RUN_MACROS, *EXTRA_MACROS.get(path, ()),
                                 *bindings])
        kw = pod_memory.train_bindings()
        net = Transformer(kw["model"])
        objs = {name: setup.build_objective(net, name, spec, None, check_tasks=False)
                for name, spec in kw["objectives"].items()}
    finally:
        gin.clear_config()
    return kw["model"], {name: _layer_values(o) for name, o in objs.items()}


def test_the_file_lists_are_what_the_directories_hold():
    assert len(RUN_FILES) >= 35, RUN_FILES
    for path in NOT_RUN_FILES:
        assert os.path.exists(os.path.join(ROOT, path)), path


@pytest.mark.parametrize("path", RUN_FILES)
def test_every_run_file_is_tiny_with_the_size_knob_and_builds(path):
    own, _ = _build(path)
    model, layers = _build(path, "SIZE = 'tiny'")
    assert {k: getattr(model, k) for k in sizing.SHAPE_FIELDS} == TINY_SHAPE
    # the file's other fields stay: vocabulary, positions, structure, dtype
    assert model.replace(**{k: getattr(own, k) for k in sizing.SHAPE_FIELDS}) == own
    for name, values in layers.items():
        for what, value in values.items():
            low = 0 if what == "xlco_layer" else 1
            assert low <= value <= model.num_layers, (path, name, what, value)


# The paper's values where a file is at the paper's size, and the league's scaled ones (which
# the recipes wrote as numbers before they followed the depth).
OWN_SIZE = {
    "runs/infoxlm_base.gin": ("xlco", "xlco_layer", 8),  # InfoXLM Table 10 (base)
    "runs/infoxlm_large.gin": ("xlco", "xlco_layer", 12),  # InfoXLM Table 10 (large)
    "runs/infoxlm_ablations/no_tlm.gin": ("xlco", "xlco_layer", 12),  # InfoXLM Table 6/7
    "runs/infoxlm_ablations/no_tlm_layer8.gin": ("xlco", "xlco_layer", 8),
    "runs/infoxlm_ablations/no_universal_layer.gin": ("xlco", "xlco_layer", 12),  # last
    "runs/xlme_base.gin": ("mrtd", "generator_layers", 4),  # XLM-E Tables 8-9 (base)
    "runs/xlme_large.gin": ("trtd", "generator_layers", 6),  # XLM-E Tables 8-9 (large)
    "finetune/veco_translate.gin": ("translate", "decoder_layers", 6),  # VECO §5.1
    "league/infoxlm.gin": ("xlco", "xlco_layer", 3),
    "league/xlme.gin": ("mrtd", "generator_layers", 1),
    "demo/veco_translate.gin": ("translate", "decoder_layers", 1),
}


@pytest.mark.parametrize("path", sorted(OWN_SIZE))
def test_a_file_at_its_own_size_keeps_its_values(path):
    name, what, value = OWN_SIZE[path]
    _, layers = _build(path)
    assert layers[name][what] == value


@pytest.mark.parametrize("path, depth, expected", [
    ("runs/infoxlm_base.gin", 4, 3), ("runs/infoxlm_base.gin", 2, 2),
    ("runs/infoxlm_base.gin", 1, 1), ("runs/infoxlm_large.gin", 4, 2),
    ("runs/xlme_base.gin", 2, 1), ("runs/xlme_base.gin", 6, 2)])
def test_lower_at_a_smaller_depth_moves_the_layer_values(path, depth, expected):
    """`python -m xlm_jax.accelerator.lower --depth 2` on InfoXLM failed building XLCo (layer 8 > 2
    layers): `lower.configure` (what --depth binds) now builds, the layer at the same fraction."""
    from xlm_jax.accelerator import lower, pod_memory
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.train import setup

    gin.clear_config()
    try:
        lower.configure([path], [], depth=depth)
        kw = pod_memory.train_bindings()
        objs = [setup.build_objective(Transformer(kw["model"]), name, spec, None,
                                      check_tasks=False)
                for name, spec in kw["objectives"].items()]
    finally:
        gin.clear_config()
    values = [v for o in objs for v in _layer_values(o).values()]
    assert kw["model"].num_layers == depth and values == [expected] * len(values)


@pytest.mark.parametrize("plan, expected", [
    ("league/tiny.gin", {"infoxlm": {"xlco_layer": 1}, "xlme": {"generator_layers": 1},
                         "xlme_no_trtd": {"generator_layers": 1}}),
    ("league/gpu_1h.gin", {"infoxlm": {"xlco_layer": 4}, "xlme": {"generator_layers": 2},
                           "xlme_no_trtd": {"generator_layers": 2}})])
def test_the_league_plans_recipes_build_at_their_depth(plan, expected):
    """The plans' NUM_LAYERS (1 and 6) move the recipes' layer values (they bound
    'XLCO_LAYER = 1', 'XLCO_LAYER = 4' and 'GENERATOR_LAYERS = 2' by hand before)."""
    from xlm_jax.league import plan as league_plan

    gin.clear_config()
    try:
        gin_utils.parse([plan], [])
        config = league_plan.league_config()
    finally:
        gin.clear_config()
    for recipe in league_plan.RECIPES:
        gin_file, = config.recipe_gin(recipe)
        model, layers = _build(gin_file, *config.bindings_for(recipe))
        got = {what: v for values in layers.values() for what, v in values.items()}
        assert got == expected.get(recipe, {}), (plan, recipe, got)
        assert all(v <= model.num_layers for v in got.values())


@pytest.mark.parametrize("spec, depth, rounding, expected", [
    ("8/12", 12, "up", 8), ("8/12", 24, "up", 16), ("8/12", 4, "up", 3), ("8/12", 6, "up", 4),
    ("8/12", 2, "up", 2), ("8/12", 1, "up", 1), ("12/24", 4, "up", 2), ("12/12", 4, "up", 4),
    ("6/24", 4, "up", 1), ("6/24", 2, "up", 1), ("1/2", 4, "up", 2), ("0/12", 4, "up", 0),
    ("4/12", 12, "nearest", 4), ("4/12", 4, "nearest", 1), ("4/12", 6, "nearest", 2),
    ("4/12", 1, "nearest", 1), ("6/24", 48, "nearest", 12), (" 8 / 12 ", 12, "up", 8),
    (3, 4, "up", 3), (30, 4, "up", 30), (None, 4, "up", None)])
def test_layers_at_depth(spec, depth, rounding, expected):
    model = get_config("tiny", num_layers=depth)
    assert sizing.layers_at_depth(spec, model, rounding) == expected


@pytest.mark.parametrize("spec, match", [
    ("8", r"layer value '8': expected an int .* or 'L/D'"),
    ("13/12", r"layer value '13/12': needs 0 <= L <= D"),
    ("1/0", r"needs 0 <= L <= D and D >= 1"),
    (2.5, r"layer value 2.5: expected an int")])
def test_bad_layer_values_are_one_line_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        sizing.layers_at_depth(spec, get_config("tiny"))
    with pytest.raises(ValueError, match="rounding='down' must be one of up, nearest"):
        sizing.layers_at_depth("8/12", get_config("tiny"), "down")


def test_an_unknown_size_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"SIZE='tinny': unknown model size; valid sizes: "
                                         r"tiny, small, base, large, xl"):
        _build("runs/infoxlm_base.gin", "SIZE = 'tinny'")


def test_a_literal_layer_is_not_rescaled():
    """A user's int is the layer itself at any depth (out of range: XLCo's own error)."""
    _, layers = _build("runs/infoxlm_base.gin", "SIZE = 'tiny'", "XLCO_LAYER = 2")
    assert layers["xlco"]["xlco_layer"] == 2
    with pytest.raises(ValueError, match=r"layer=8 is outside 0..4"):
        _build("runs/infoxlm_base.gin", "SIZE = 'tiny'", "XLCO_LAYER = 8")
