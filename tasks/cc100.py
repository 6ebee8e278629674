"""Register CC-100 style monolingual corpora (or a TFDS text dataset) as seqio tasks.

CC-100 layout: `{data_dir}/{lang}.txt` (optionally `.xz`/`.gz`), one sentence per line,
documents separated by blank lines. Example:

    from xlm_jax_tasks import cc100
    cc100.register_cc100("/data/cc100", ["en", "de", "sw"], "/models/xlmr.spm.model")
    # -> tasks cc100_en, cc100_de, cc100_sw and the mixture cc100 (alpha = 0.3)
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from xlm_jax.data import registry, sampling

__all__ = ["register_cc100", "register_tfds_text"]


def register_cc100(
    data_dir: str,
    languages: Sequence[str],
    spm_path: str,
    name_prefix: str = "cc100",
    alpha: float = sampling.ALPHA_XLMR,
    sequence_length: int = 512,
    kind: str = "mono",
    language_list: Optional[Sequence[str]] = None,
    rate_by: str = "tokens",
) -> registry.Registration:
    """Registers `{name_prefix}_{lang}` per language and the alpha-smoothed mixture
    `{name_prefix}`. kind "mono" gives full-length segments (MLM), "split_pair" adjacent
    segments x, y (VECO). The first call counts every file once (cached in `{data_dir}/xlm_jax_stats.json`).
    """
    return registry.register_monolingual(
        name_prefix, data_dir, languages, spm_path, sequence_length=sequence_length,
        alpha=alpha, kind=kind, language_list=language_list, rate_by=rate_by)


def register_tfds_text(
    tfds_name: str,
    languages: Sequence[str],
    spm_path: str,
    name_prefix: str = "mc4",
    sizes: Optional[Mapping[str, int]] = None,
    alpha: float = sampling.ALPHA_XLMR,
    sequence_length: int = 512,
    text_key: str = "text",
    split_template: str = "{lang}",
    tfds_data_dir: Optional[str] = None,
    language_list: Optional[Sequence[str]] = None,
) -> registry.Registration:
    """Registers a TFDS text dataset with one split per language, e.g.
    `register_tfds_text("c4/multilingual:3.1.0", ["en", "de"], spm)`. Needs the prepared
    TFDS data (`tfds_data_dir`); rates use `sizes` or the TFDS example counts."""
    return registry.register_tfds_monolingual(
        name_prefix, tfds_name, languages, spm_path, sizes=sizes,
        sequence_length=sequence_length, alpha=alpha, text_key=text_key,
        split_template=split_template, tfds_data_dir=tfds_data_dir,
        language_list=language_list)
