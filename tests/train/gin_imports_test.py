"""Command-line bindings resolve names as a line of the run's gin file would
(`xlm_jax/train/gin_imports.py`): docs/quickstart.md's evaluator binding works on a run file
that does not import the evaluators itself, and what the files do not allow stays refused."""
import gin
import pytest

from xlm_jax.train import gin_imports, gin_utils

pytestmark = pytest.mark.usefixtures("gin_isolated")

# docs/quickstart.md's bindings, as `--gin.NAME=VALUE` becomes them
QUICKSTART = ["loop.train.evaluators = [@evaluators.TatoebaRetrieval()]",
              "evaluators.TatoebaRetrieval.tatoeba_dir = 'tatoeba'",
              "loop.train.eval_at_start = True"]


def _parse(files, bindings):
    gin.clear_config()
    gin_utils.parse(files, bindings, check_required=False)


def test_the_quickstarts_evaluator_binding_works_on_a_run_file_without_the_import():
    assert "xlm_jax.train.evaluators" not in open(
        gin_utils.find_gin_file("demo/mmlm_tlm.gin", gin_utils.default_search_paths())).read()
    _parse(["demo/mmlm_tlm.gin"], QUICKSTART)
    (evaluator,) = gin.query_parameter("loop.train.evaluators")
    from xlm_jax.train import evaluators

    assert evaluator.configurable.wrapped is evaluators.TatoebaRetrieval
    assert gin.query_parameter("evaluators.TatoebaRetrieval.tatoeba_dir") == "tatoeba"


def test_before_the_preamble_gin_refused_the_same_binding():
    """The control: gin's own parse of the bindings, without the files' imports, fails as
    the issue reported (so the test above sees the preamble's work)."""
    gin.clear_config()
    gin_utils.parse(["demo/mmlm_tlm.gin"], [], check_required=False)
    with pytest.raises(ValueError, match="No configurable matching reference "
                                         "'@evaluators.TatoebaRetrieval"):
        gin.parse_config(QUICKSTART)


def test_the_preamble_holds_the_files_imports_and_only_the_shipped_aliases_the_bindings_use():
    _parse(["demo/mmlm_tlm.gin"], [])
    lines = gin_imports.preamble(QUICKSTART, gin_utils.GIN_CONFIG_DIRS)
    assert lines[0] == "from __gin__ import dynamic_registration"
    assert "import xlm_jax.train.loop as loop" in lines  # the file's own
    assert "import xlm_jax.train.evaluators as evaluators" in lines  # used by a binding
    assert not any(line.endswith(" as xlme") for line in lines)  # not used, not the file's
    # a name inside a string is no use of the alias
    assert not any(" as evaluators" in line
                   for line in gin_imports.preamble(["loop.train.spm_model = 'evaluators.x'"],
                                                         gin_utils.GIN_CONFIG_DIRS))


def test_the_shipped_aliases_are_read_from_the_shipped_files(tmp_path):
    (tmp_path / "a.gin").write_text("import xlm_jax.train.loop as loop  # the loop\n"
                                    "import pkg.one as dup\n")
    (tmp_path / "b.gin").write_text("import pkg.two as dup\nimport xlm_jax.train.loop as loop\n")
    assert gin_imports.shipped_aliases((str(tmp_path),)) == {"loop": "xlm_jax.train.loop"}


def test_a_misspelt_configurable_on_the_command_line_is_still_one_line_naming_the_flag():
    with pytest.raises(gin_utils.GinConfigError) as e:
        _parse(["demo/mmlm_tlm.gin"], ["loop.train.evaluators = [@evaluators.TatoebaRetreival()]"])
    assert str(e.value) == ("--gin.loop.train.evaluators=[@evaluators.TatoebaRetreival()]: no "
                            "configurable evaluators.TatoebaRetreival; did you mean "
                            "evaluators.TatoebaRetrieval?")
    with pytest.raises(gin_utils.GinConfigError) as e:
        _parse(["demo/mmlm_tlm.gin"], ["loop.train.evaluators = [@evalutors.TatoebaRetrieval()]"])
    assert str(e.value).startswith("--gin.loop.train.evaluators=[@evalutors.TatoebaRetrieval()]: "
                                   "no import named 'evalutors' in the gin files (they import ")
    assert "loop" in str(e.value)
