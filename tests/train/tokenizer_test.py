"""One tokenizer per run: the tasks' SentencePiece model and `loop.train.spm_model` are compared
by content before compiling; unset, spm_model is the tasks' model (what the model directory
then carries)."""
import os
import shutil

import pytest

from tests.testlib import temp_modules, user_corpus

pytest.importorskip("seqio")


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A user's corpus, their own 150-piece tokenizer and task module, outside the repo."""
    return user_corpus.make(str(tmp_path_factory.mktemp("user")))


def test_a_run_file_naming_another_tokenizer_is_refused_naming_both(user):
    """Must-show: the tasks are tokenised with the user's model, the run file (demo/mmlm_tlm)
    still names the demo's spm_model: one line naming both files, before anything is built."""
    model_dir = os.path.join(user["root"], "refused")
    r = user_corpus.python(["-m", "xlm_jax.train", f"--model_dir={model_dir}",
                            *user_corpus.RUN], cwd=user["root"])
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    demo_spm = os.path.join(user_corpus.DEMO, "spm.model")
    assert f"loop.train.spm_model={demo_spm} is not the SentencePiece model" in errors[0]
    assert f"({user['spm']})" in errors[0] and "task my_mono_" in errors[0]
    assert not os.path.exists(os.path.join(model_dir, "spm.model"))
    assert not os.path.exists(os.path.join(model_dir, "xlm_jax_config.json"))


def _tasks(user):
    """The user's mixtures, registered by importing their `my_tasks` (forgotten after it;
    the tests' `seqio_isolated` removes the registrations)."""
    import importlib

    with temp_modules.importable(user["root"]):
        importlib.import_module("my_tasks")
    return ["my_mono", "my_opus"]


def test_spm_model_is_compared_by_content_and_defaults_to_the_tasks(user, tmp_path,
                                                                    seqio_isolated):
    from xlm_jax.train import streams

    tasks = _tasks(user)
    copy = str(tmp_path / "renamed.model")
    shutil.copy(user["spm"], copy)
    assert streams.run_spm_model(copy, tasks) == copy  # same bytes, another name: fine
    assert streams.run_spm_model(None, tasks) == user["spm"]  # unset: the tasks' model
    assert streams.run_spm_model(None, ["synthetic:mono"]) is None
    assert streams.run_spm_model("x.model", ["synthetic:mono"]) == "x.model"  # nothing to compare
    with pytest.raises(ValueError, match="is not the SentencePiece model task my_mono"):
        streams.run_spm_model(os.path.join(user_corpus.DEMO, "spm.model"), tasks)


def test_tasks_of_two_tokenizers_are_refused(user, seqio_isolated):
    import xlm_jax_tasks.demo  # noqa: F401 - registers demo_mono with the demo's model

    from xlm_jax.train import streams

    with pytest.raises(ValueError, match=r"task .* is tokenised with .* but task .* with .*"
                                         r"\(different models\): a run has one tokenizer"):
        streams.run_spm_model(None, [*_tasks(user), "demo_mono"])
