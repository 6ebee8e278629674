"""The model directory: the one module that knows its file names, its layout and its paths.

A model directory is what `python -m xlm_jax.train` writes and what `load_encoder`,
`export-hf`, retrieval, the demo and `loop.train(init_from=...)` read:

    xlm_jax_config.json        the encoder's `ModelConfig` (JSON)
    languages.txt              the `lang_ids` table, one code per line (models trained on
                               tasks registered with a language list)
    spm.model                  the SentencePiece model (HF directories call theirs
                               sentencepiece.bpe.model; both are found)
    run_info.json              versions, git commit, argv, process/device count (trainer)
    operative_config.gin       the gin configuration as run (trainer)
    checkpoints/<step>/state   orbax item: the whole train state {step, params: {encoder,
                               objectives}, opt_state, obj_state} (trainer)
    checkpoints/<step>/extra   orbax JSON item: the trainer's `ResumeInfo` (step, process
                               count, the saved input positions' seeds and shapes)
    data_state/<step>/         each process's tf.data iterator state per objective, beside
                               checkpoint <step> (trainer; `xlm_jax.train.data_state`)
    params/                    orbax checkpoint of the encoder's parameters alone
                               (`python -m xlm_jax.convert import-hf`)
    metrics.jsonl, train/, eval/   metrics log and TensorBoard events (trainer)

Paths: a model directory is a local path or a `gs://bucket/path` URI, and every read and
write of its files goes through `etils.epath` (`resolve` makes the `epath.Path`). epath reaches
gs:// through fsspec and `gcsfs`, or through `tf.io.gfile` where TensorFlow is installed
(`EPATH_USE_TF=false` turns that off); orbax writes the checkpoints' arrays itself, through
tensorstore's `gcs` driver. Other schemes are refused before anything is written: orbax writes
arrays only to local paths and gs://, so an s3:// run would lose its checkpoints, and epath
would take an unknown `scheme://` for a local relative path. docs/architecture.md ("Paths").
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Union

from etils import epath

from xlm_jax.models.config import ModelConfig

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_NAME = "xlm_jax_config.json"
LANGUAGES_FILE = "languages.txt"
SPM_NAME = "spm.model"
SPM_NAMES = ("sentencepiece.bpe.model", SPM_NAME)  # HF's name first, then ours
RUN_INFO = "run_info.json"
OPERATIVE_CONFIG = "operative_config.gin"
CHECKPOINTS_DIR = "checkpoints"
STATE_ITEM, EXTRA_ITEM = "state", "extra"  # items of a trainer checkpoint
PARAMS_DIR = "params"
METRICS_FILE = "metrics.jsonl"
DATA_STATE_DIR = "data_state"

# The URI schemes a model directory may have, and the package through which epath reaches
# each when it goes through fsspec (it does unless TensorFlow is installed).
FILESYSTEMS = {"gs": "gcsfs"}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/")

# ModelConfig fields of earlier versions that a config file may still carry: dropped on read.
# projection_dim: InfoXLM's projection was a model field before objectives owned modules; it
# now belongs to the XLCo objective, and exported encoders never contained it.
_RETIRED_CONFIG_FIELDS = ("projection_dim",)


class FilesystemNotInstalled(ImportError, ValueError):
    """A path on a filesystem whose package is not installed. An ImportError (what it is) and a
    ValueError (bad input: what `python -m xlm_jax.train` reports in one line)."""


# ----------------------------------------------------------------------------- paths

def resolve(path: PathLike) -> epath.Path:
    """`path` as the `epath.Path` every reader and writer uses: a local path made absolute
    (orbax needs absolute paths), a gs:// URI as it is.

    One-line errors, raised before anything is read or written: ValueError for a scheme that
    is not in `FILESYSTEMS` (or a malformed URI such as `gs:/bucket`), `FilesystemNotInstalled`
    naming the package to install when epath could not reach the filesystem.
    """
    text = os.fspath(path)
    match = _SCHEME.match(text)
    if match is None:
        return epath.Path(os.path.abspath(text))
    scheme = match.group(1)
    supported = " or ".join(f"{s}://BUCKET/PATH" for s in FILESYSTEMS)
    if not text.startswith(f"{scheme}://"):
        raise ValueError(f"{text!r} is not a URI: expected {scheme}://BUCKET/PATH")
    if scheme not in FILESYSTEMS:
        raise ValueError(f"{text!r}: unsupported filesystem {scheme}://; a model directory is "
                         f"a local path or {supported} (orbax writes checkpoints only there)")
    if not text[len(scheme) + 3:].split("/")[0]:
        raise ValueError(f"{text!r} names no bucket: expected {scheme}://BUCKET/PATH")
    _check_installed(scheme, text)
    return epath.Path(text)


def is_remote(path: PathLike) -> bool:
    """True for a URI (gs://...), False for a local path."""
    return _SCHEME.match(os.fspath(path)) is not None


def _epath_uses_tensorflow() -> bool:
    # etils.epath reaches gs:// through tf.io.gfile when TensorFlow is installed, unless the
    # environment says EPATH_USE_TF=false (etils/epath/gpath.py, `_GPath._backend`).
    if os.environ.get("EPATH_USE_TF", "").lower() in ("false", "no", "f", "0"):
        return False
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):  # a blocked or broken tensorflow module
        return False


def _check_installed(scheme: str, where: str) -> None:
    if _epath_uses_tensorflow():
        return
    package = FILESYSTEMS[scheme]
    try:
        importlib.import_module(package)
    except ImportError as e:
        why = "" if e.name == package else f" (importing it failed: {e})"
        raise FilesystemNotInstalled(
            f"{where!r}: {scheme}:// paths need the package {package}, which is not installed"
            f"{why}; pip install {package}", name=package) from None


# The names of files this module keeps only for an instant: `check_writable`'s probe and a
# file `write_bytes` is writing whole. A reader of a directory (`train.run_dir`) leaves them
# out: another process of the same run may be writing them.
_PROBE_PREFIX = ".write_probe."
_TRANSIENT = re.compile(r"^\.(write_probe\..+|.+\.tmp-\d+)$")


def is_transient(name: str) -> bool:
    """Whether a file name is one of this module's instant files (the probe, a half-written
    file)."""
    return _TRANSIENT.match(name) is not None


def check_writable(directory: PathLike, owner: str) -> epath.Path:
    """Creates `directory` and writes and removes a probe file in it, so that a typo, a
    read-only mount or a bucket without write access fails before training, not at the first
    save (on gs://, where directories are only name prefixes, the probe is the whole check).
    One-line OSError `"{owner}: cannot write to '{directory}' ({why})"`."""
    path = resolve(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f"{_PROBE_PREFIX}{os.getpid()}.{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except Exception as e:  # noqa: BLE001 - each filesystem package raises its own types
        why = getattr(e, "strerror", None)
        if not why:  # gcsfs: FileNotFoundError(url) for a missing bucket, HttpError(...), ...
            first = (str(e).strip().splitlines() or [""])[0]
            why = f"{type(e).__name__}: {first}" if first else type(e).__name__
        filename = getattr(e, "filename", None)
        if filename and os.fspath(filename) != os.fspath(path):
            why += f": {os.fspath(filename)!r}"
        if is_remote(path):
            why += "; does the bucket exist, and may these credentials write to it?"
        raise OSError(f"{owner}: cannot write to {os.fspath(path)!r} ({why})") from None
    return path


def read_text(path: PathLike) -> str:
    """A UTF-8 text file (local or gs://)."""
    return resolve(path).read_bytes().decode("utf-8")


def write_bytes(path: PathLike, data: bytes) -> None:
    """Writes a file whole or not at all, creating its directory: locally into a hidden
    sibling (`.NAME.tmp-PID`) renamed over `path` (a reader, or a run killed mid-write, never
    sees half a file); on gs://, where an object appears only once its upload completes, in
    place."""
    target = resolve(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_remote(target):
        target.write_bytes(data)
        return
    temp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        temp.write_bytes(data)
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def write_text(path: PathLike, text: str) -> None:
    """Writes a UTF-8 text file (local or gs://) whole or not at all (`write_bytes`)."""
    write_bytes(path, text.encode("utf-8"))


def read_json(path: PathLike) -> Any:
    return json.loads(read_text(path))


def write_json(path: PathLike, value: Any) -> None:
    write_text(path, json.dumps(value, indent=2) + "\n")


# ----------------------------------------------------------------------------- files

def write_config(model_dir: PathLike, cfg: ModelConfig) -> None:
    write_json(resolve(model_dir) / CONFIG_NAME, cfg.to_dict())


def read_model_config(path: PathLike) -> ModelConfig:
    """The `ModelConfig` of a config file; unknown keys are a ValueError naming them."""
    raw = read_json(path)
    for field in _RETIRED_CONFIG_FIELDS:
        raw.pop(field, None)
    known = set(ModelConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{os.fspath(path)}: unknown ModelConfig key(s) {unknown}")
    return ModelConfig(**raw)


def read_config(model_dir: PathLike) -> ModelConfig:
    return read_model_config(resolve(model_dir) / CONFIG_NAME)


def write_languages(model_dir: PathLike, languages: Sequence[str]) -> None:
    write_text(resolve(model_dir) / LANGUAGES_FILE, "".join(f"{lang}\n" for lang in languages))


def read_language_file(path: PathLike) -> list[str]:
    """Language codes from a text file with one code per line (blank lines skipped); an empty
    file is a ValueError naming it."""
    codes = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    if not codes:
        raise ValueError(f"{os.fspath(path)}: no language codes")
    return codes


def read_languages(model_dir: PathLike) -> list[str] | None:
    """The directory's `lang_ids` table, or None when it has none."""
    path = resolve(model_dir) / LANGUAGES_FILE
    return read_language_file(path) if path.exists() else None


def find_spm(model_dir: PathLike) -> str | None:
    """The SentencePiece model of a model or HF directory, or None."""
    root = resolve(model_dir)
    for name in SPM_NAMES:
        if (root / name).exists():
            return os.fspath(root / name)
    return None


def copy_spm(spm_file: PathLike | None, out_dir: PathLike, name: str = SPM_NAME) -> None:
    """Copies a SentencePiece model file into `out_dir` (nothing when `spm_file` is None);
    either side may be local or gs://."""
    if spm_file:
        write_bytes(resolve(out_dir) / name, resolve(spm_file).read_bytes())


def write_run_info(model_dir: PathLike, info: dict[str, Any]) -> None:
    write_json(resolve(model_dir) / RUN_INFO, info)


def write_operative_config(model_dir: PathLike, text: str) -> None:
    write_text(resolve(model_dir) / OPERATIVE_CONFIG, text)


def checkpoints_dir(model_dir: PathLike) -> str:
    return os.fspath(resolve(model_dir) / CHECKPOINTS_DIR)


def checkpoint_steps(model_dir: PathLike) -> list[int]:
    """Finished trainer checkpoint steps under `model_dir/checkpoints`, ascending. On gs://
    orbax writes a step in place and marks it finished last (`commit_success.txt`), so a step
    counts only once orbax calls it finalized; locally an unfinished step has a temporary name."""
    root = resolve(checkpoints_dir(model_dir))
    if not root.is_dir():
        return []
    steps = [p for p in root.iterdir() if p.name.isdigit() and (p / STATE_ITEM).is_dir()]
    if is_remote(root) and steps:
        from orbax.checkpoint import path as ocp_path

        steps = [p for p in steps if ocp_path.step.is_path_finalized(p)]
    return sorted(int(p.name) for p in steps)


def trainer_state_dir(model_dir: PathLike, step: int | None = None) -> str:
    """Path of the train-state item of a trainer checkpoint (default: the newest)."""
    steps = checkpoint_steps(model_dir)
    if not steps:
        raise FileNotFoundError(f"{os.fspath(model_dir)}: neither {PARAMS_DIR}/ nor "
                                f"{CHECKPOINTS_DIR}/<step>/{STATE_ITEM} found")
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise FileNotFoundError(f"{os.fspath(model_dir)}: no checkpoint for step {step}; "
                                f"available: {steps}")
    return os.fspath(resolve(checkpoints_dir(model_dir)) / str(step) / STATE_ITEM)


def saved_tree(checkpoint: PathLike) -> Any:
    """The tree of an orbax checkpoint item (a trainer state or a `params/` folder) with each
    array's metadata (shape, dtype) at its leaves: what is there, nothing read."""
    import orbax.checkpoint as ocp

    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.metadata(os.fspath(resolve(checkpoint))).item_metadata.tree


def restore_subtree(checkpoint: PathLike, keys: Sequence[str] = (), tree: Any = None) -> Any:
    """The arrays under `keys` of an orbax checkpoint item, as numpy arrays, read alone
    (orbax's partial restore): a trainer state's `("params", "encoder")` without the
    optimiser's moments and the objectives' state, about a quarter of the state at XLM-R's
    sizes (three quarters of the bytes a reader of the encoder never needed: measured in
    docs/architecture.md, "Reading a checkpoint's encoder"). `tree`: its `saved_tree`, where
    the caller has read it already (else it is read here). A missing key is a one-line
    KeyError naming the keys there."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    path = os.fspath(resolve(checkpoint))
    with ocp.PyTreeCheckpointer() as ckptr:
        sub = ckptr.metadata(path).item_metadata.tree if tree is None else tree
        for n, key in enumerate(keys):
            if not isinstance(sub, dict) or key not in sub:
                there = ", ".join(sorted(map(str, sub))) if isinstance(sub, dict) else "an array"
                raise KeyError(f"{path}: no {'/'.join(keys[:n + 1])} in this checkpoint "
                               f"({'/'.join(keys[:n]) or 'its top level'} holds {there})")
            sub = sub[key]
        spec = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), sub)
        item: Any = spec
        for key in reversed(keys):
            item = {key: item}
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
        out = ckptr.restore(path, args=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=True))
    for key in keys:
        out = out[key]
    return out


def params_dir(model_dir: PathLike) -> str:
    return os.fspath(resolve(model_dir) / PARAMS_DIR)


def has_params_dir(model_dir: PathLike) -> bool:
    """True for an imported/saved encoder directory (`params/`), False for a trainer's."""
    return resolve(params_dir(model_dir)).is_dir()


def is_model_dir(path: PathLike) -> bool:
    return (resolve(path) / CONFIG_NAME).exists()


# ----------------------------------------------------------------------------- whole directories
# Writing a whole output directory so that it appears complete or not at all, and never over a
# user's files without consent. `staged(out, owner, replace)` is what `python -m xlm_jax.convert
# export-hf` writes through (issue 55): a directory that holds anything is refused in one line,
# before anything is written, unless `replace` is given; the files are written into a hidden
# sibling (`.NAME.staging-PID`) and renamed into place when all are written, so a failure
# leaves `out` byte for byte as it was and removes the sibling; files get the permissions the
# user's umask gives (some writers, safetensors' among them, create theirs 0600). On gs://,
# where a directory cannot be renamed, the files are written in place (the refusal still
# holds). Stricter than HF's `save_pretrained`, which writes into a non-empty directory
# silently (our choice).

def entries(path: PathLike) -> list[str]:
    """The names in directory `path`, sorted, without this module's instant files
    (`is_transient`); [] for a missing directory or a file."""
    try:
        return sorted(p.name for p in resolve(path).iterdir() if not is_transient(p.name))
    except (FileNotFoundError, NotADirectoryError):
        return []


def shown(names: Sequence[str], most: int = 3) -> str:
    """`a, b, c and N more`: the first `most` of `names`, for a one-line message."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


def refuse_unless_empty(out: str, owner: str, replace: bool) -> None:
    """ValueError (one line, naming the directory and some of what it holds) when `out`
    exists and holds anything, unless `replace`; also when `out` is a file."""
    path = resolve(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{owner} {out!r} is a file, not a directory; nothing was written")
    held = entries(path)
    if held and not replace:
        raise ValueError(f"{owner} {out!r} is not empty ({shown(held)}); nothing was written: "
                         "choose a new or empty directory, or pass --overwrite to replace it")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask(root: str) -> None:
    """Gives every file under `root` mode 0666 and every directory 0777, less the umask."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for here, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(here, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(here, name), 0o666 & ~mask)


@contextlib.contextmanager
def staged(out: str, owner: str, replace: bool = False) -> Iterator[str]:
    """Yields the directory to write into; on a clean exit it becomes `out` (see "whole
    directories" above). `owner` names the setting in messages (`export-hf --out`)."""
    refuse_unless_empty(out, owner, replace)
    existed = resolve(out).exists()
    path = check_writable(out, owner)  # creates `out` (empty) where it was missing
    if is_remote(path):
        yield os.fspath(path)
        return
    target = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(target)
    staging = os.path.join(parent, f".{name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    done = False
    try:
        yield staging
        apply_umask(staging)
        old = os.path.join(parent, f".{name}.replaced-{os.getpid()}")
        os.rename(target, old)  # `out` exists: check_writable made it
        os.rename(staging, target)
        done = True
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done and not existed:
            with contextlib.suppress(OSError):
                os.rmdir(target)  # the empty directory check_writable made
