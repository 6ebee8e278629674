"""Whose directory is `model_dir`: the checks a run makes before it writes anything there.

A run may write into a directory only when it is new, empty, or holds *this* run (the
same model, tokenizer and language table), so that a mistyped `--model_dir` cannot damage
another run or a folder of the user's (issue 55). What is checked, read-only, on every process:

- `inspect` (before anything is built): a directory that holds files but no run is refused
  unless `loop.train.allow_other_files=True`; one that holds an encoder written by
  `convert import-hf` (`params/`) is refused (train from it with `init_from`); one that holds
  a run whose `xlm_jax_config.json` differs in an `ARCHITECTURE_FIELDS` field is refused,
  naming each field with both values.
- `check_tokenizer_and_languages` (once the tasks are loaded): a run whose `spm.model` or
  `languages.txt` differs from this run's tokenizer or language table is refused, whatever
  `data_resume` says (reseeding the data continues the run; it never changes what its ids
  mean).

Every refusal is a `ModelDirRefused` (a ValueError: one line from the CLI) that names the
directory, says that nothing was written, and says what to do. The trainer writes the run's
files (config, languages, tokenizer, run_info: `setup.write_model_files`) only after these
checks, the checkpoint's restore and the input positions' checks have passed, each file by
temp + rename (`model_dir.write_bytes`); a checkpoint's directory is created at its first
save (`checkpoints.Checkpointer(defer_create=True)`), so a run refused at any of these points
leaves the directory as it found it.

Fields outside `ARCHITECTURE_FIELDS` (dropout, dtypes, attention backend and kernel launch,
remat, scan layout, initialisers) may change between a run and its resume: they change how the step runs, not
what the parameters are (a scan-layout change is still refused by the checkpoint's layout
check, which says how to convert). Our choice; t5x checks none of this, and HF's example
training scripts refuse a non-empty `--output_dir` unless `--overwrite_output_dir`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence

from xlm_jax import model_dir as md
from xlm_jax.models.config import ModelConfig

# The ModelConfig fields that decide the parameters' shapes or what they compute: a run
# resumed with another value of any of them is another model.
ARCHITECTURE_FIELDS = (
    "vocab_size", "pad_vocab_to_multiple_of", "hidden_size", "num_layers", "num_heads",
    "mlp_dim", "max_positions", "pad_id", "type_vocab_size", "num_languages",
    "layer_norm_eps", "ln_style", "position_type", "relative_buckets",
    "relative_max_distance", "share_relative_table", "cross_attention")
# Files and folders a trainer run writes (model_dir's layout); any one of the first three
# makes a directory a run's.
RUN_MARKERS = (md.CONFIG_NAME, md.RUN_INFO, md.CHECKPOINTS_DIR)
_SHOWN = 3


class ModelDirRefused(ValueError):
    """`model_dir` holds something this run must not write over (one line, nothing written)."""


@dataclasses.dataclass(frozen=True)
class Found:
    """What `inspect` found in a model directory before the run."""

    path: str
    entries: tuple[str, ...]  # its names (empty: missing or empty)
    is_run: bool  # holds a trainer run's files
    config: ModelConfig | None = None  # the run's config, when it has one


def _names(path: str) -> tuple[str, ...]:
    """The directory's names, less what the run's other processes write for an instant (the
    writability probe, a file being written whole: `model_dir.entries`)."""
    root = md.resolve(path)
    if root.exists() and not root.is_dir():
        raise ModelDirRefused(f"model_dir {path!r} is a file, not a directory; nothing was "
                              "written")
    return tuple(md.entries(root))


def _refuse(path: str, what: str, advice: str) -> ModelDirRefused:
    return ModelDirRefused(f"model_dir {path!r} {what}; nothing was written: {advice}")


def architecture_changes(before: ModelConfig, now: ModelConfig) -> list[str]:
    """`FIELD OLD there, NEW here` for each `ARCHITECTURE_FIELDS` field whose value differs."""
    return [f"{f} {getattr(before, f)!r} there, {getattr(now, f)!r} here"
            for f in ARCHITECTURE_FIELDS if getattr(before, f) != getattr(now, f)]


def inspect(path: str, model: ModelConfig, allow_other_files: bool = False) -> Found:
    """Reads `path` and refuses what this run must not write into (see the module
    docstring); returns what it found. Reads only: nothing is created or written."""
    names = _names(path)
    if not names:
        return Found(path, names, is_run=False)
    is_run = any(n in names for n in RUN_MARKERS)
    if md.PARAMS_DIR in names and not is_run:
        raise _refuse(path, f"holds an encoder written by import-hf ({md.PARAMS_DIR}/)",
                      f"train into a new directory with loop.train.init_from={path!r} (or "
                      "--init_from) to start from it")
    if not is_run:
        if allow_other_files:
            return Found(path, names, is_run=False)
        raise _refuse(path, f"holds files that are not a training run's ({md.shown(names)})",
                      "choose a new or empty directory, or set "
                      "loop.train.allow_other_files=True to write the run among them")
    config = None
    if md.CONFIG_NAME in names:
        config_file = os.fspath(md.resolve(path) / md.CONFIG_NAME)
        try:
            config = md.read_model_config(config_file)
        except (ValueError, TypeError) as e:  # torn JSON, a hand edit, an unknown key
            raise _refuse(path, f"holds a run whose {md.CONFIG_NAME} cannot be read ({e})",
                          "repair or remove that file, or choose another directory") from None
        changes = architecture_changes(config, model)
        if changes:
            raise _refuse(path, f"holds another model ({'; '.join(changes[:_SHOWN])}"
                          + (f"; and {len(changes) - _SHOWN} more" if len(changes) > _SHOWN
                             else "") + ")",
                          "choose another directory for this model, or resume that run with "
                          "its own model settings")
    return Found(path, names, is_run=True, config=config)


def sha1_of(path: str) -> str:
    """The sha1 of a file's bytes (local or gs://)."""
    return hashlib.sha1(md.resolve(path).read_bytes()).hexdigest()


def check_tokenizer_and_languages(found: Found, spm_model: str | None,
                                  languages: Sequence[str] | None) -> None:
    """Refuses a run whose tokenizer or language table differs from those the directory's
    run was trained with (each compared only where both sides have one)."""
    if not found.is_run:
        return
    if md.SPM_NAME in found.entries and spm_model:
        there = sha1_of(os.fspath(md.resolve(found.path) / md.SPM_NAME))
        here = sha1_of(spm_model)
        if there != here:
            raise _refuse(found.path, "holds a run trained with another SentencePiece model "
                          f"({md.SPM_NAME} sha1 {there[:12]} there, {spm_model} sha1 "
                          f"{here[:12]} here)",
                          "choose another directory; a run keeps its tokenizer, whatever "
                          "loop.train.data_resume says")
    old_languages = md.read_languages(found.path) if md.LANGUAGES_FILE in found.entries else None
    if old_languages and languages and list(old_languages) != list(languages):
        changed = [f"{a}->{b}" for a, b in zip(old_languages, languages) if a != b]
        detail = (f"{len(old_languages)} there, {len(languages)} here"
                  if len(old_languages) != len(languages)
                  else f"ids changed: {md.shown(changed)}")
        raise _refuse(found.path, f"holds a run with another language table ({md.LANGUAGES_FILE}"
                      f": {detail})",
                      "choose another directory; the language ids of a run cannot change")
