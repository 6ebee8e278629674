"""The model directory: the one module that knows its file names and layout.

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
    checkpoints/<step>/extra   orbax JSON item: step, data position, tasks (trainer)
    params/                    orbax checkpoint of the encoder's parameters alone
                               (`python -m xlm_jax.convert import-hf`)
    metrics.jsonl, train/, eval/   metrics log and TensorBoard events (trainer)

Paths are plain local paths here; every reader and writer of these files goes through this
module, so a path layer for object stores (gs://) has one place to go.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from xlm_jax.models.config import ModelConfig

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

# ModelConfig fields of earlier versions that a config file may still carry: dropped on read.
# projection_dim: InfoXLM's projection was a model field before objectives owned modules; it
# now belongs to the XLCo objective, and exported encoders never contained it.
_RETIRED_CONFIG_FIELDS = ("projection_dim",)


def write_config(model_dir: str, cfg: ModelConfig) -> None:
    with open(os.path.join(model_dir, CONFIG_NAME), "w") as f:
        json.dump(cfg.to_dict(), f, indent=2)


def read_model_config(path: str) -> ModelConfig:
    """The `ModelConfig` of a config file; unknown keys are a ValueError naming them."""
    with open(path) as f:
        raw = json.load(f)
    for field in _RETIRED_CONFIG_FIELDS:
        raw.pop(field, None)
    known = set(ModelConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown ModelConfig key(s) {unknown}")
    return ModelConfig(**raw)


def read_config(model_dir: str) -> ModelConfig:
    return read_model_config(os.path.join(model_dir, CONFIG_NAME))


def write_languages(model_dir: str, languages: Sequence[str]) -> None:
    with open(os.path.join(model_dir, LANGUAGES_FILE), "w", encoding="utf-8") as f:
        f.write("".join(f"{lang}\n" for lang in languages))


def read_language_file(path: str) -> list[str]:
    """Language codes from a text file with one code per line (blank lines skipped); an empty
    file is a ValueError naming it."""
    with open(path, encoding="utf-8") as f:
        codes = [line.strip() for line in f if line.strip()]
    if not codes:
        raise ValueError(f"{path}: no language codes")
    return codes


def read_languages(model_dir: str) -> list[str] | None:
    """The directory's `lang_ids` table, or None when it has none."""
    path = os.path.join(model_dir, LANGUAGES_FILE)
    return read_language_file(path) if os.path.exists(path) else None


def find_spm(model_dir: str) -> str | None:
    """The SentencePiece model of a model or HF directory, or None."""
    for name in SPM_NAMES:
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            return path
    return None


def copy_spm(spm_file: str | None, out_dir: str, name: str = SPM_NAME) -> None:
    """Copies a SentencePiece model file into `out_dir` (nothing when `spm_file` is None)."""
    if spm_file:
        shutil.copyfile(spm_file, os.path.join(out_dir, name))


def write_run_info(model_dir: str, info: dict[str, Any]) -> None:
    with open(os.path.join(model_dir, RUN_INFO), "w") as f:
        json.dump(info, f, indent=2)


def write_operative_config(model_dir: str, text: str) -> None:
    with open(os.path.join(model_dir, OPERATIVE_CONFIG), "w") as f:
        f.write(text)


def checkpoints_dir(model_dir: str) -> str:
    return os.path.join(str(model_dir), CHECKPOINTS_DIR)


def checkpoint_steps(model_dir: str) -> list[int]:
    """Finished trainer checkpoint steps under `model_dir/checkpoints`, ascending."""
    root = checkpoints_dir(model_dir)
    if not os.path.isdir(root):
        return []
    return sorted(int(s) for s in os.listdir(root)
                  if s.isdigit() and os.path.isdir(os.path.join(root, s, STATE_ITEM)))


def trainer_state_dir(model_dir: str, step: int | None = None) -> str:
    """Path of the train-state item of a trainer checkpoint (default: the newest)."""
    steps = checkpoint_steps(model_dir)
    if not steps:
        raise FileNotFoundError(f"{model_dir}: neither {PARAMS_DIR}/ nor "
                                f"{CHECKPOINTS_DIR}/<step>/{STATE_ITEM} found")
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise FileNotFoundError(f"{model_dir}: no checkpoint for step {step}; available: {steps}")
    return os.path.join(checkpoints_dir(model_dir), str(step), STATE_ITEM)


def params_dir(model_dir: str) -> str:
    return os.path.join(model_dir, PARAMS_DIR)


def has_params_dir(model_dir: str) -> bool:
    """True for an imported/saved encoder directory (`params/`), False for a trainer's."""
    return os.path.isdir(params_dir(model_dir))


def is_model_dir(path: str) -> bool:
    return os.path.exists(os.path.join(path, CONFIG_NAME))
