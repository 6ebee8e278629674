"""A new user's mistakes, each one line from the real CLI (no traceback, no warning before
it), with the exit status: an unquoted string binding, a misspelt parameter, an unregistered
`bench --pipeline` task; a failed run removes the --model_dir it created; `train --init_from`
starts from the given model's weights."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.testlib.cli_run import ROOT, env
from tests.testlib.cli_run import run as train

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

SYNTH = "--gin_file=demo/synthetic.gin"


def _only_line(r, code=1):
    """The one line a failed command printed on stderr; asserts it is the only one."""
    assert r.returncode == code, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def _module(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def test_an_unquoted_string_binding_is_one_line_showing_it_quoted(tmp_path):
    model_dir = tmp_path / "run"
    quoted = ("error: GinConfigError: --gin.loop.train.spm_model=my_spm.model: a string must "
              "be quoted in gin: --gin.loop.train.spm_model=\"'my_spm.model'\"")
    for flag in ("--gin.loop.train.spm_model=my_spm.model",
                 "--gin_bindings=loop.train.spm_model = my_spm.model"):
        r = train([SYNTH, f"--model_dir={model_dir}", flag], timeout=120)
        assert _only_line(r) == quoted
    r = train([SYNTH, f"--model_dir={model_dir}", "--gin.MONO_TASK=demo_mono"], timeout=120)
    assert _only_line(r) == ("error: GinConfigError: --gin.MONO_TASK=demo_mono: a string must "
                             "be quoted in gin: --gin.MONO_TASK=\"'demo_mono'\"")
    r = train([SYNTH, f"--model_dir={model_dir}", "--gin.loop.train.init_from=none"],
              timeout=120)
    assert _only_line(r) == (
        "error: GinConfigError: --gin.loop.train.init_from=none: gin writes None, True and "
        "False capitalised: --gin.loop.train.init_from=None")
    assert not model_dir.exists()


def test_a_misspelt_parameter_or_configurable_gets_did_you_mean(tmp_path):
    model_dir = tmp_path / "run"
    r = train([SYNTH, f"--model_dir={model_dir}", "--gin.loop.train.totl_steps=10"],
              timeout=120)
    # total_steps is OptimizerConfig's, set by the file through TRAIN_STEPS: the macro is named
    assert _only_line(r) == (
        "error: GinConfigError: --gin.loop.train.totl_steps=10: loop.train has no parameter "
        "totl_steps; did you mean --gin.TRAIN_STEPS (it sets optim.OptimizerConfig.total_steps)?")
    r = train([SYNTH, f"--model_dir={model_dir}", "--gin.loop.train.seq_lne=16"], timeout=120)
    assert _only_line(r) == (
        "error: GinConfigError: --gin.loop.train.seq_lne=16: loop.train has no parameter "
        "seq_lne; did you mean --gin.SEQ_LEN (it sets loop.train.seq_len)?")
    r = train([SYNTH, f"--model_dir={model_dir}", "--gin.loop.trian.seed=1"], timeout=120)
    assert _only_line(r) == ("error: GinConfigError: --gin.loop.trian.seed=1: no configurable "
                             "loop.trian; did you mean loop.train?")
    assert not model_dir.exists()


def test_gin_file_mistakes_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'demo/synthetic.gin'\nloop.train.spm_model = my_spm.model\n")
    r = train([f"--gin_file={bad}", f"--model_dir={tmp_path / 'run'}"], timeout=120)
    assert _only_line(r) == (f"error: GinConfigError: {bad}:2: a string must be quoted in gin: "
                             "loop.train.spm_model = 'my_spm.model'")
    bad.write_text("include 'demo/synthetic.gin'\nloop.train.seq_len = [16,\n")
    r = train([f"--gin_file={bad}", f"--model_dir={tmp_path / 'run'}"], timeout=120)
    # Python's tokenizer's words: "EOF in ..." on 3.11, "unexpected EOF in ..." on 3.12
    assert re.fullmatch(re.escape(f"error: GinConfigError: {bad}: gin cannot parse (")
                        + r"(unexpected )?EOF in multi-line statement\)", _only_line(r))


def test_bench_pipeline_unregistered_task_is_one_line_and_its_flags_are_in_help():
    r = _module("xlm_jax.accelerator.bench", "--pipeline", "nope_task", "--module",
                "xlm_jax.data.registry")
    assert _only_line(r) == (
        "error: pipeline_bench: no task or mixture 'nope_task' after importing --module "
        "xlm_jax.data.registry (0 are registered); pass the module that registers it with "
        "--module")
    line = _only_line(_module("xlm_jax.accelerator.bench", "--pipeline", "demo_mnoo"))
    assert re.fullmatch(
        r"error: pipeline_bench: no task or mixture 'demo_mnoo' after importing --module "
        r"xlm_jax_tasks.demo \(\d+ are registered\); did you mean demo_mono or \S+ or \S+\? "
        r"else pass the module that registers it with --module", line), line
    r = _module("xlm_jax.accelerator.bench", "--help", timeout=120)
    assert r.returncode == 0
    for flag in ("--module MODULE", "--sequence_length SEQUENCE_LENGTH", "--batches BATCHES"):
        assert flag in r.stdout, flag
    line = _only_line(_module("xlm_jax.accelerator.bench", "--batches=3", timeout=120), code=2)
    assert line == ("python -m xlm_jax.accelerator.bench: error: --batches is a --pipeline flag "
                    "(--help lists every flag)")


MISSING_TASK = ["--gin_file=runs/xlmr_base_mmlm.gin", "--gin.TRAIN_STEPS=3",
                "--gin.MONO_TASK='nope'"]
MISSING_TASK_LINE = ("error: ValueError: unknown task or mixture 'nope' (registered: none); "
                     "import the module that registers it first (e.g. xlm_jax_tasks.demo)")


def test_a_failed_run_leaves_no_directory_it_created(tmp_path):
    """The run file's 10000 warmup steps over TRAIN_STEPS=3 warn (through gin's wrapper)
    before the task is looked up: the error is still the only line, and the new directories
    (two levels) are gone; a directory the user made is left alone."""
    fresh = tmp_path / "new" / "run"
    r = train([*MISSING_TASK, f"--model_dir={fresh}"], timeout=180)
    assert _only_line(r) == MISSING_TASK_LINE
    assert not (tmp_path / "new").exists()
    made = tmp_path / "mine"
    made.mkdir()
    r = train([*MISSING_TASK, f"--model_dir={made}"], timeout=180)
    assert _only_line(r) == MISSING_TASK_LINE
    assert made.is_dir() and list(made.iterdir()) == []  # no checkpoints/ left in it either
    r = train([SYNTH, f"--model_dir={fresh}", "--gin.loop.train.spm_model=x.model"])
    assert r.returncode == 1 and not (tmp_path / "new").exists()


def test_a_folder_of_the_users_is_one_line_and_left_as_it_was(tmp_path):
    """issue 55: --model_dir at a folder holding files that are not a run's."""
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "draft.tex").write_text("\\section{}\n")
    r = train([SYNTH, f"--model_dir={folder}"], timeout=180)
    assert _only_line(r) == (
        f"error: ModelDirRefused: model_dir {str(folder)!r} holds files that are not a training "
        "run's (draft.tex); nothing was written: choose a new or empty directory, or set "
        "loop.train.allow_other_files=True to write the run among them")
    assert os.listdir(folder) == ["draft.tex"]
    assert (folder / "draft.tex").read_text() == "\\section{}\n"


def _encoder(model_dir, step=None):
    import jax

    from xlm_jax.convert import hf

    params = hf.load_xlm_jax(str(model_dir), step=step)[1]
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_train_init_from_loads_the_given_model(tmp_path):
    """A 2-step source run (its warmup warning one line, without gin's source line), then a
    run with --init_from=SOURCE and another seed whose step-0 checkpoint holds the source's
    trained encoder."""
    source, run = tmp_path / "source", tmp_path / "run"
    r = train([SYNTH, f"--model_dir={source}", "--gin.TRAIN_STEPS=2",
               "--gin.optim.OptimizerConfig.warmup_steps=10"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("warning: OptimizerConfig.warmup_steps=10 > total_steps=2: the run ends during "
            "warmup, below the peak learning rate 0.001") in r.stderr.splitlines()
    assert "gin/config.py" not in r.stderr and "cls_meta" not in r.stderr
    r = train([SYNTH, f"--model_dir={run}", "--gin.TRAIN_STEPS=1", f"--init_from={source}",
               "--gin.loop.train.seed=1", "--gin.loop.train.save_initial=True"])
    assert r.returncode == 0, r.stderr[-3000:]
    operative = (run / "operative_config.gin").read_text()
    bound = re.search(r"loop\.train\.init_from = \\?\s*'([^']*)'", operative)  # may wrap
    assert bound and bound[1] == str(source), operative
    want, got = _encoder(source), _encoder(run, step=0)
    key = "['embeddings']['word_embeddings']['embedding']"
    np.testing.assert_array_equal(got[key], want[key])
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_train_init_from_is_in_help_and_checked_before_anything_runs(tmp_path):
    r = train(["--help"], timeout=120)
    assert r.returncode == 0 and "--init_from MODEL" in r.stdout
    r = train([SYNTH, f"--model_dir={tmp_path / 'run'}", f"--init_from={tmp_path / 'nope'}"],
              timeout=120)
    assert _only_line(r, code=2) == (f"python -m xlm_jax.train: error: --init_from="
                                     f"{tmp_path / 'nope'}: not a directory (--help lists "
                                     "every flag)")
    r = train([SYNTH, f"--model_dir={tmp_path / 'run'}", f"--init_from={tmp_path}",
               "--gin.loop.train.init_from='x'"], timeout=120)
    assert _only_line(r, code=2) == (
        "python -m xlm_jax.train: error: --init_from and --gin.loop.train.init_from='x' both "
        "set the starting weights; give one (--help lists every flag)")
    assert not (tmp_path / "run").exists()


def test_a_run_file_requiring_init_from_takes_the_flag(tmp_path):
    """runs/veco_large_from_xlmr.gin requires INIT_FROM: --init_from satisfies it (the parse
    succeeds: no required-macro error, no unused-macro error)."""
    import gin

    from xlm_jax.train import cli, gin_utils

    args = cli._parser().parse_args([
        "--gin_file=runs/veco_large_from_xlmr.gin", f"--model_dir={tmp_path / 'run'}",
        f"--init_from={tmp_path}", "--gin_bindings=TRAIN_STEPS = 3",
        "--gin_bindings=TASK_MODULES = []", "--gin_bindings=VECO_MONO_TASK = 'm'",
        "--gin_bindings=VECO_BI_TASK = 'b'", "--gin_bindings=PAIR_TASK = 'p'"])
    bindings = cli.init_from_bindings(args, cli._parser())
    gin.clear_config()
    try:
        cli.parse_gin(args, [*gin_utils.SYNTHETIC_RUN_MACROS, bindings[0]], bindings)
        assert gin.query_parameter("loop.train.init_from") == str(tmp_path)
    finally:
        gin.clear_config()
