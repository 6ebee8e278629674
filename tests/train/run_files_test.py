"""The paper run files configure what their comments cite: the objective mixtures of the
ablation files and the optimiser/model values of the papers' tables (gin is parsed, nothing is
trained; a typo in a mixture or a value drifting from its cited table fails here)."""
import gin
import pytest

from xlm_jax.train import gin_utils

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

REQUIRED = ["TASK_MODULES=[]", "MONO_TASK='m'", "PAIR_TASK='p'", "INIT_FROM='x'",
            "TARGET_LANGUAGES=['de']", "VECO_MONO_TASK='vm'", "VECO_BI_TASK='vb'",
            "XLCO_TASK='x'"]


def _query(path, *names):
    gin.clear_config()
    try:
        gin_utils.parse([path], REQUIRED, placeholders=REQUIRED)  # some go unused
        return [gin.query_parameter(name) for name in names]  # "%NAME" = a macro's value
    finally:
        gin.clear_config()


@pytest.mark.parametrize("exp, mixture", [
    (1, {"mmlm"}), (2, {"mmlm", "tlm"}), (3, {"mmlm", "camlm"}),
    (4, {"mmlm", "camlm", "btmlm"}), (5, {"mmlm", "tlm", "camlm", "btmlm"})])
def test_ernie_m_ablation_files_train_their_mixture_for_50k_steps(exp, mixture):
    objectives, steps, init = _query(f"runs/ernie_m_exp{exp}.gin", "loop.train.objectives",
                                     "%TRAIN_STEPS", "%INIT_FROM")
    assert set(objectives) == mixture and steps == 50000 and init == "x"


@pytest.mark.parametrize("path, steps, lr, batch", [
    ("runs/ernie_m_base.gin", 150000, 2e-4, 2048), ("runs/ernie_m_large.gin", 200000, 1e-4, 2048),
    ("runs/ernie_m_small.gin", 240000, 3e-4, 1024)])
def test_ernie_m_run_files_have_table_11(path, steps, lr, batch):
    got = _query(path, "%TRAIN_STEPS", "%LEARNING_RATE", "%BATCH_SIZE", "optim.OptimizerConfig.b1",
                 "optim.OptimizerConfig.b2", "optim.OptimizerConfig.eps",
                 "optim.OptimizerConfig.weight_decay", "optim.OptimizerConfig.warmup_steps",
                 "%SEQ_LEN", "loop.train.objectives")
    assert got[:9] == [steps, lr, batch, 0.98, 0.999, 1e-6, 0.01, 10000, 512]
    assert set(got[9]) == {"mmlm", "tlm", "camlm", "btmlm"}
    overrides = _query(path, "loop.model_config.overrides")[0]
    assert overrides["language_init"] == ("normal" if "small" in path else "zeros")


def test_xlme_run_file_has_table_10():
    got = _query("runs/xlme_base.gin", "%TRAIN_STEPS", "optim.OptimizerConfig.learning_rate",
                 "optim.OptimizerConfig.b2", "optim.OptimizerConfig.clip_norm", "%RTD_WEIGHT",
                 "%GENERATOR_LAYERS", "loop.train.objectives")
    assert got[:6] == [125000, 5e-4, 0.98, 2.0, 50.0, "4/12"] and set(got[6]) == {"mrtd", "trtd"}


@pytest.mark.parametrize("path, lr, b2, size", [("runs/veco_large.gin", 2e-4, 0.98, "large"),
                                                ("runs/veco_small.gin", 3e-4, 0.999, "base")])
def test_veco_run_files_have_table_5(path, lr, b2, size):
    got = _query(path, "%TRAIN_STEPS", "%LEARNING_RATE", "optim.OptimizerConfig.b2",
                 "optim.OptimizerConfig.warmup_steps", "%MONO_MASK_PROB", "%BI_MASK_PROB",
                 "loop.model_config.size", "loop.model_config.overrides", "loop.train.objectives")
    assert got[:7] == [240000, lr, b2, 12000, 0.15, 0.25, size]
    assert got[7]["cross_attention"] is True and "num_languages" not in got[7]
    assert set(got[8]) == {"veco_mono", "veco_bi", "tlm"}
    # Table 5's two streams: 1024 x 512 monolingual, 4096 x 128 bilingual, alternating
    shapes = _query(path, "%BATCH_SIZE", "%SEQ_LEN", "%BI_BATCH_SIZE", "%BI_SEQ_LEN",
                    "%MAX_PREDICTIONS_BI")
    assert shapes[:4] == [1024, 512, 4096, 128] and shapes[4] >= int(0.25 * 128) + 1
    phases = _query(path, *(f"{n}/loop.ObjectiveSpec.{k}" for n in ("veco_mono", "veco_bi", "tlm")
                            for k in ("every", "offset")))
    assert phases == [2, 0, 2, 1, 2, 1]


@pytest.mark.parametrize("path, steps, lr, layer", [
    ("runs/infoxlm_base.gin", 150000, 2e-4, "8/12"),
    ("runs/infoxlm_large.gin", 200000, 1e-4, "12/24")])
def test_infoxlm_run_files_have_table_10(path, steps, lr, layer):
    got = _query(path, "%TRAIN_STEPS", "%BATCH_SIZE", "optim.OptimizerConfig.learning_rate",
                 "optim.OptimizerConfig.warmup_steps", "optim.OptimizerConfig.b1",
                 "optim.OptimizerConfig.b2", "optim.OptimizerConfig.eps",
                 "optim.OptimizerConfig.clip_norm", "optim.OptimizerConfig.weight_decay",
                 "%XLCO_MOMENTUM", "%XLCO_QUEUE_SIZE", "%XLCO_LAYER", "%RESTART_TARGET_POSITIONS")
    assert got == [steps, 2048, lr, 10000, 0.9, 0.98, 1e-6, 1.0, 0.01, 0.999, 131072, layer,
                   False]


# Model settings a paper states (or, for XLM-E, the labelled choices standing in for it), as
# the built ModelConfig of each run file: VECO post-LN without language embeddings (§3) and
# dropout 0.1 (Table 5); ERNIE-M dropout 0.1 (Table 11) with language embeddings (§3);
# XLM-E's unstated dropout (the default 0.1) and one relative-bias table (both our choice).
@pytest.mark.parametrize("path, expected, languages", [
    ("runs/veco_large.gin", {"ln_style": "post", "dropout_rate": 0.1,
                             "attention_dropout_rate": 0.1}, False),
    ("runs/veco_small.gin", {"ln_style": "post", "dropout_rate": 0.1,
                             "attention_dropout_rate": 0.1}, False),
    ("runs/ernie_m_base.gin", {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, True),
    ("runs/ernie_m_small.gin", {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, True),
    ("runs/xlme_base.gin", {"dropout_rate": 0.1, "attention_dropout_rate": 0.1,
                            "share_relative_table": True}, False)])
def test_model_settings_the_papers_state(path, expected, languages):
    from xlm_jax.models.config import get_config

    gin.clear_config()
    try:
        gin_utils.parse([path], REQUIRED, placeholders=REQUIRED)
        size = gin.query_parameter("loop.model_config.size")
        # an override holding a macro (%NAME, e.g. %NUM_LANGUAGES) takes the macro's value
        overrides = {k: (gin.query_parameter("%" + v.scoped_selector.rsplit("/", 1)[0])
                         if isinstance(v, gin.config.ConfigurableReference) else v)
                     for k, v in gin.query_parameter("loop.model_config.overrides").items()}
    finally:
        gin.clear_config()
    config = get_config(size, **overrides)
    assert {k: getattr(config, k) for k in expected} == expected
    assert (config.num_languages > 0) == languages


def test_veco_from_xlmr_trains_the_cross_attention_first():
    got = _query("runs/veco_large_from_xlmr.gin", "optim.OptimizerConfig.train_only",
                 "%TRAIN_ONLY_STEPS", "%INIT_FROM", "%TRAIN_STEPS")
    assert got == ["cross_attention", 10000, "x", 240000]


# The papers' ablation tables, written from their text: file -> (header's table and row,
# objectives, train steps, settings that make the row). InfoXLM Table 7 (§4.3): every row is
# INFOXLM15, "trained on 15 languages for 100K steps", with parts removed; "-TLM-Mixup" and
# "-TLM-Momentum" remove TLM too. The -TLM rows put XLCo on layer 12 (their scores are Table 6's
# "INFOXLM15 - TLM" at layer 12; §4.3: layer 12 is better without TLM), "-Universal" is INFOXLM15
# on the last layer (Table 6's layer 12), and Table 6's "-TLM" at layer 8 has its own file.
# XLM-E Table 2 (§4.3) is cumulative: "-TRTD", then "-TRTD -Gated relative position bias".
# ERNIE-M Table 6 (§4.3): see the test above.
INFOXLM15 = "runs/infoxlm_ablations/"
# (layer values are "L of a D-layer model", resolved at the model's depth: train/sizing.py)
MIXUP = {"xlco/xlco.XLCo.kind": "mixup_pair", "%XLCO_MOMENTUM": 0.999, "%XLCO_LAYER": "8/12"}
NO_TLM = {"xlco/xlco.XLCo.kind": "mixup_pair", "%XLCO_MOMENTUM": 0.999, "%XLCO_LAYER": "12/12"}
ABLATIONS = {
    INFOXLM15 + "infoxlm15.gin": ("Table 7", "INFOXLM15", {"mmlm", "tlm", "xlco"}, 100000,
                                  MIXUP),
    INFOXLM15 + "no_xlco.gin": ("Table 7", "-XLCo", {"mmlm", "tlm"}, 100000, {}),
    INFOXLM15 + "no_tlm.gin": ("Table 7", "-TLM", {"mmlm", "xlco"}, 100000, NO_TLM),
    INFOXLM15 + "no_tlm_no_mixup.gin": ("Table 7", "-TLM-Mixup", {"mmlm", "xlco"}, 100000,
                                        {**NO_TLM, "xlco/xlco.XLCo.kind": "split_pair"}),
    INFOXLM15 + "no_tlm_no_momentum.gin": ("Table 7", "-TLM-Momentum", {"mmlm", "xlco"}, 100000,
                                           {**NO_TLM, "%XLCO_MOMENTUM": 0.0}),
    INFOXLM15 + "no_tlm_no_xlco.gin": ("Table 7", "-TLM-XLCo", {"mmlm"}, 100000, {}),
    INFOXLM15 + "no_universal_layer.gin": ("Table 7", "-Universal", {"mmlm", "tlm", "xlco"},
                                           100000, {**MIXUP, "%XLCO_LAYER": None}),
    INFOXLM15 + "no_tlm_layer8.gin": ("Table 6", "INFOXLM15 - TLM", {"mmlm", "xlco"}, 100000,
                                      {**NO_TLM, "%XLCO_LAYER": "8/12"}),
    "runs/xlme_base_no_trtd.gin": ("Table 2", "-TRTD", {"mrtd"}, 125000,
                                   {"%POSITION_TYPE": "both"}),
    "runs/xlme_base_no_trtd_no_gated_bias.gin": (
        "Table 2", "-TRTD -Gated relative position bias", {"mrtd"}, 125000,
        {"%POSITION_TYPE": "absolute"}),
}
ABLATION_MACROS = REQUIRED + ["XLCO_TASK='x'"]


@pytest.mark.parametrize("path", sorted(ABLATIONS))
def test_ablation_files_are_the_papers_rows(path):
    """Each file parses through the training CLI's own gin step, names its table and row in
    its header, and trains the row's objectives for the row's budget with the row's settings."""
    from xlm_jax.train import cli

    table, row, objectives, steps, settings = ABLATIONS[path]
    gin.clear_config()
    try:
        cli.parse_gin(cli._parser().parse_args(
            ["--model_dir=/unused", f"--gin_file={path}"]
            + [f"--gin_bindings={b}" for b in ABLATION_MACROS]), placeholders=ABLATION_MACROS)
        got = {name: gin.query_parameter(name) for name in settings}
        mixture, got_steps = (gin.query_parameter("loop.train.objectives"),
                              gin.query_parameter("%TRAIN_STEPS"))
    finally:
        gin.clear_config()
    assert set(mixture) == objectives and got_steps == steps and got == settings
    header = open(gin_utils.find_gin_file(path, gin_utils.default_search_paths())).read()
    if path.startswith(INFOXLM15):  # "15 languages" (InfoXLM §4.3), listed in infoxlm15.gin
        base = open(gin_utils.find_gin_file(INFOXLM15 + "infoxlm15.gin",
                                            gin_utils.default_search_paths())).read()
        languages = base.split("# INFOXLM15 languages")[1].splitlines()[1].strip("# ").split()
        assert len(set(languages)) == 15 and "en" in languages
    assert f'{table} row "{row}"' in header.split("\nfrom __gin__")[0], path


def test_every_infoxlm_ablation_file_is_in_the_table():
    """Every file in the InfoXLM ablation directory is a Table 7 row or Table 6's layer-8 "-TLM",
    and the last-layer file says it is Table 7's "-Universal" (= Table 6's layer 12)."""
    import glob
    import os

    root = os.path.join(os.path.dirname(gin_utils.__file__), "..", "..", "gin_configs")
    files = {os.path.relpath(p, root) for p in glob.glob(f"{root}/{INFOXLM15}*.gin")}
    assert files == {p for p in ABLATIONS if p.startswith(INFOXLM15)}
    rows = [row for path, (table, row, *_) in ABLATIONS.items()
            if path.startswith(INFOXLM15) and table == "Table 7"]
    assert sorted(rows) == sorted(["INFOXLM15", "-XLCo", "-TLM", "-TLM-Mixup", "-TLM-Momentum",
                                   "-TLM-XLCo", "-Universal"])
    header = open(os.path.join(root, INFOXLM15, "no_universal_layer.gin")).read()
    assert "Not a Table 7 row" not in header and 'Table 6\'s "INFOXLM15" at layer 12' in header


@pytest.mark.parametrize("path, missing", [
    (INFOXLM15 + "no_tlm_no_mixup.gin", "XLCO_TASK"),
    (INFOXLM15 + "no_xlco.gin", "PAIR_TASK"),
    ("runs/xlme_base_no_trtd_no_gated_bias.gin", "MONO_TASK")])
def test_an_ablation_file_without_its_macros_fails_in_one_line_naming_them(path, missing,
                                                                          capsys):
    from xlm_jax.train import cli

    bindings = [b for b in ABLATION_MACROS if not b.startswith(missing + "=")]
    code = cli.main(["xlm_jax.train", "--model_dir=/nonexistent/unused", f"--gin_file={path}"]
                    + [f"--gin.{b}" for b in bindings])
    gin.clear_config()
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("error: ValueError: required gin macro(s) not set: ") and missing in err


def test_every_pretraining_run_file_computes_in_bf16_with_float32_weights():
    """The accelerator default: bf16 activations, float32 parameters (and so float32 optimiser
    moments), in every run file and the files that include one."""
    import glob
    import os

    from xlm_jax.models.config import ModelConfig

    root = os.path.join(os.path.dirname(gin_utils.__file__), "..", "..", "gin_configs")
    paths = sorted(os.path.relpath(p, root) for p in glob.glob(f"{root}/runs/**/*.gin",
                                                                recursive=True))
    assert len(paths) >= 20, paths
    assert ModelConfig().param_dtype == "float32"
    for path in paths:
        gin.clear_config()
        try:
            gin_utils.parse([path], REQUIRED + ["XLCO_TASK='x'", "TRAIN_STEPS=1"],
                            placeholders=REQUIRED + ["XLCO_TASK='x'"])
            dtype = gin.query_parameter("loop.model_config.dtype")
            overrides = (gin.query_parameter("loop.model_config.overrides")
                         if _bound("loop.model_config.overrides") else {})
        finally:
            gin.clear_config()
        # the dedicated binding wins over overrides['dtype'] (loop.model_config)
        assert dtype == "bfloat16" and "param_dtype" not in overrides, path


def _bound(name):
    try:
        gin.query_parameter(name)
        return True
    except ValueError:
        return False
