"""A run writes into its model_dir only when the directory is new, empty, or holds this very
run (`xlm_jax.train.run_dir`, issue 55): each damage case of the issue through the real
`loop.train`, with every file of the directory hashed before and after (byte-identical), and
the one-line message."""
import hashlib
import os
import shutil

import pytest

from tests.testlib.tiny_run import TINY_MODEL, train_tiny
from xlm_jax import model_dir as md
from xlm_jax.models.config import ModelConfig
from xlm_jax.train import run_dir

pytestmark = pytest.mark.usefixtures("gin_isolated")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_SPM = os.path.join(ROOT, "tasks", "demo_data", "spm.model")


def snapshot(root) -> dict[str, str]:
    """{relative path: sha1 of its bytes, or 'dir'} for everything under `root`."""
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(here, name), root)] = "dir"
        for name in files:
            path = os.path.join(here, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha1(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def other_spm(tmp_path_factory, train_xlmr_spm):
    """A second, real SentencePiece model (other pieces than the demo's)."""
    d = tmp_path_factory.mktemp("spm")
    text = d / "text.txt"
    text.write_text("".join(f"zebra{i} quokka{i % 7} axolotl numbat {i}\n" for i in range(300)))
    return train_xlmr_spm(text, d / "other", 60)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny run of 2 steps, saved at step 2, with the demo's tokenizer (the run's files:
    config, run_info, spm.model, operative config, metrics, checkpoint 2)."""
    path = tmp_path_factory.mktemp("runs") / "finished"
    train_tiny(path, 2, save_every=2, spm_model=DEMO_SPM)
    return path


@pytest.fixture
def run_copy(finished_run, tmp_path):
    path = tmp_path / "run"
    shutil.copytree(finished_run, path)
    return path


def refused(path, **kw) -> str:
    """The message of a run into `path` that is refused: one line (gin appends a note on
    the configurable it called, which the CLI drops: cli_errors_test)."""
    with pytest.raises(run_dir.ModelDirRefused) as e:
        train_tiny(path, 3, **kw)
    message, *gin_note = str(e.value).splitlines()
    assert all("In call to configurable 'train'" in line for line in gin_note), str(e.value)
    assert f"model_dir {str(path)!r}" in message, message
    assert "nothing was written" in message, message
    return message


def test_the_same_run_resumes_and_the_fixture_is_a_run(finished_run):
    found = run_dir.inspect(str(finished_run), ModelConfig(**{**TINY_MODEL, "dropout_rate": 0.1}))
    assert found.is_run and found.config.num_layers == TINY_MODEL["num_layers"]
    assert {md.CONFIG_NAME, md.RUN_INFO, md.SPM_NAME, md.CHECKPOINTS_DIR} <= set(found.entries)
    # the same tokenizer and no language table on either side: nothing to refuse
    run_dir.check_tokenizer_and_languages(found, DEMO_SPM, None)


def test_another_model_shape_is_refused_and_the_run_is_untouched(run_copy):
    before = snapshot(run_copy)
    message = refused(run_copy, model={"num_layers": 2, "mlp_dim": 48}, spm_model=DEMO_SPM)
    assert "holds another model (num_layers 1 there, 2 here; mlp_dim 64 there, 48 here)" in message
    assert snapshot(run_copy) == before


def test_another_tokenizer_is_refused_even_with_reseed(run_copy, other_spm):
    """The issue's 'other recipe and tokenizer' and 'the reseed hint': spm.model, config and
    run_info stay as they were, with data_resume 'checkpoint' and 'reseed' alike."""
    before = snapshot(run_copy)
    there = hashlib.sha1(open(DEMO_SPM, "rb").read()).hexdigest()[:12]
    here = hashlib.sha1(open(other_spm, "rb").read()).hexdigest()[:12]
    for mode in ("checkpoint", "reseed"):
        message = refused(run_copy, spm_model=other_spm, data_resume=mode)
        assert (f"holds a run trained with another SentencePiece model (spm.model sha1 {there} "
                f"there, {other_spm} sha1 {here} here)") in message
        assert snapshot(run_copy) == before


def test_a_failed_restore_leaves_the_run_as_it_was(run_copy):
    """The scan layout is not an architecture field (a run may change it... only by
    converting): the checkpoint's own layout check refuses it, and the run's files written
    after the checks (config, run_info) are not rewritten first."""
    before = snapshot(run_copy)
    with pytest.raises(ValueError, match="scan_layers"):
        train_tiny(run_copy, 3, model={"scan_layers": True}, spm_model=DEMO_SPM)
    assert snapshot(run_copy) == before


def test_a_folder_of_the_users_is_refused_unless_allowed(tmp_path):
    folder = tmp_path / "thesis"
    (folder / "figures").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "figures" / "a.png").write_bytes(b"\x89PNG")
    (folder / "spm.model").write_bytes(b"not a run's tokenizer")
    before = snapshot(folder)
    message = refused(folder)
    assert ("holds files that are not a training run's (figures, notes.txt, spm.model); nothing "
            "was written: choose a new or empty directory, or set "
            "loop.train.allow_other_files=True") in message
    assert snapshot(folder) == before  # no checkpoints/ left behind either
    train_tiny(folder, 1, allow_other_files=True)
    after = snapshot(folder)
    assert {k: after[k] for k in ("figures", "notes.txt", "figures/a.png")} == {
        k: before[k] for k in ("figures", "notes.txt", "figures/a.png")}
    assert md.CONFIG_NAME in after and md.checkpoint_steps(folder) == [1]


def test_another_process_probe_or_half_written_file_is_not_a_users_file(tmp_path):
    """What the run's other processes leave for an instant (the writability probe, a file
    being written whole) does not make a new directory someone else's."""
    path = tmp_path / "run"
    path.mkdir()
    (path / ".write_probe.4242.0123abcd").write_bytes(b"ok")
    (path / f".{md.CONFIG_NAME}.tmp-4242").write_bytes(b"{")
    found = run_dir.inspect(str(path), ModelConfig(**TINY_MODEL))
    assert not found.is_run and found.entries == ()
    (path / ".notes.tmp").write_text("mine")  # a user's hidden file still counts
    with pytest.raises(run_dir.ModelDirRefused, match=r"\(\.notes\.tmp\)"):
        run_dir.inspect(str(path), ModelConfig(**TINY_MODEL))


def test_an_imported_encoder_is_refused(tmp_path):
    encoder = tmp_path / "xlmr"
    (encoder / md.PARAMS_DIR).mkdir(parents=True)
    (encoder / md.PARAMS_DIR / "_METADATA").write_text("{}")
    before = snapshot(encoder)
    message = refused(encoder)
    assert "holds an encoder written by import-hf (params/)" in message
    assert f"loop.train.init_from={str(encoder)!r}" in message
    assert snapshot(encoder) == before


def test_another_language_table_is_refused(tmp_path):
    path = tmp_path / "run"
    md.write_config(path, ModelConfig(**TINY_MODEL))
    md.write_languages(path, ["de", "en", "fr"])
    found = run_dir.inspect(str(path), ModelConfig(**TINY_MODEL))
    run_dir.check_tokenizer_and_languages(found, None, ["de", "en", "fr"])
    with pytest.raises(run_dir.ModelDirRefused, match=r"languages.txt: ids changed: en->es\)"):
        run_dir.check_tokenizer_and_languages(found, None, ["de", "es", "fr"])
    with pytest.raises(run_dir.ModelDirRefused, match=r"languages.txt: 3 there, 4 here\)"):
        run_dir.check_tokenizer_and_languages(found, None, ["de", "en", "fr", "it"])


def test_an_unreadable_config_or_a_file_is_refused(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    (path / md.CONFIG_NAME).write_text('{"num_layers": 2,')
    with pytest.raises(run_dir.ModelDirRefused, match="xlm_jax_config.json cannot be read"):
        run_dir.inspect(str(path), ModelConfig(**TINY_MODEL))
    (tmp_path / "file").write_text("x")
    with pytest.raises(run_dir.ModelDirRefused, match="is a file, not a directory"):
        run_dir.inspect(str(tmp_path / "file"), ModelConfig(**TINY_MODEL))


def test_every_non_architecture_field_may_change_on_resume():
    """The split of ModelConfig's fields is explicit: each field is either an architecture
    field or one of the known run-time fields, so a new field must be placed on purpose."""
    runtime = {"dropout_rate", "attention_dropout_rate", "language_init", "relative_init",
               "attention_backend", "attention_launch", "remat", "scan_layers", "dtype",
               "param_dtype", "initializer_range"}
    fields = set(ModelConfig.__dataclass_fields__)
    assert set(run_dir.ARCHITECTURE_FIELDS) | runtime == fields
    assert not set(run_dir.ARCHITECTURE_FIELDS) & runtime
    base = ModelConfig(**TINY_MODEL)
    assert run_dir.architecture_changes(base, ModelConfig(**{**TINY_MODEL, "dropout_rate": 0.3,
                                                             "dtype": "bfloat16"})) == []


def test_model_files_are_written_whole(tmp_path, monkeypatch):
    """model_dir.write_bytes: the new bytes replace the file by rename; a failed rename
    leaves the old file and no temporary beside it."""
    target = tmp_path / "run" / md.CONFIG_NAME
    md.write_text(target, "old\n")
    md.write_text(target, "new\n")
    assert target.read_text() == "new\n" and os.listdir(target.parent) == [md.CONFIG_NAME]

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        md.write_text(target, "newer\n")
    assert target.read_text() == "new\n" and os.listdir(target.parent) == [md.CONFIG_NAME]
