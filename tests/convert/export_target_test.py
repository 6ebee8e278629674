"""export-hf and the directory it writes (`model_dir.staged`, issue 55): a non-empty target is
refused in one line with its files byte-identical, `--overwrite` replaces it only once the new
export is whole, a failure mid-write leaves the target as it was, and files get the umask's
permissions (safetensors writes 0600 by itself)."""
import hashlib
import os

import flax.linen as nn
import jax
import pytest

from xlm_jax.convert import hf as hf_lib
from xlm_jax.convert.__main__ import main as convert_main
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny XLM-R-shaped model in the xlm_jax format."""
    cfg = get_config("tiny", vocab_size=64, num_layers=1, hidden_size=16, num_heads=2,
                     mlp_dim=32, max_positions=20)
    ids = jax.numpy.ones((1, 4), jax.numpy.int32)
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), ids)["params"])
    path = str(tmp_path_factory.mktemp("model"))
    hf_lib.save_xlm_jax(path, cfg, params)
    return path


def _tree(root) -> dict[str, str]:
    """Every file under `root` (relative path -> sha1), directories included as entries."""
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(here, name), root) + "/"] = "dir"
        for name in files:
            with open(os.path.join(here, name), "rb") as f:
                out[os.path.relpath(os.path.join(here, name), root)] = hashlib.sha1(
                    f.read()).hexdigest()
    return out


def _export(model_dir, out, *extra):
    return convert_main(["export-hf", "--checkpoint", model_dir, "--out", str(out), *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_non_empty_target_is_refused_and_left_byte_identical(model_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    (out / "sub" / "data.bin").write_bytes(os.urandom(64))
    before = _tree(out)
    assert _export(model_dir, out) == 2
    err = _one_line_error(capsys)
    assert f"export-hf --out '{out}' is not empty (notes.txt, sub)" in err
    assert "--overwrite" in err
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["mine"]  # no staging directory left beside it


def test_overwrite_replaces_and_files_follow_the_umask(model_dir, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("from an older export")
    old = os.umask(0o027)
    try:
        assert _export(model_dir, out, "--overwrite") == 0
    finally:
        os.umask(old)
    names = sorted(os.listdir(out))
    assert "stale.txt" not in names and {"config.json", "model.safetensors"} <= set(names)
    for name in names:
        assert os.stat(out / name).st_mode & 0o777 == 0o640, name
    assert os.stat(out).st_mode & 0o777 == 0o750
    cfg, _ = hf_lib.load_hf_dir(str(out))
    assert cfg.hidden_size == 16
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_a_failed_write_leaves_the_previous_export_as_it_was(model_dir, tmp_path, capsys,
                                                            monkeypatch):
    out = tmp_path / "hf"
    assert _export(model_dir, out) == 0
    before = _tree(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_lib, "write_safetensors", disk_full)
    assert _export(model_dir, out, "--overwrite") == 2
    assert "No space left on device" in _one_line_error(capsys)
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["hf"]
    new = tmp_path / "new"  # a target that did not exist is not left behind, empty
    assert _export(model_dir, new) == 2
    assert not new.exists() and sorted(os.listdir(tmp_path)) == ["hf"]
