"""Register OPUS/Moses or TSV parallel corpora as seqio tasks.

Layouts: `{data_dir}/{src}-{tgt}.{src}` + `{data_dir}/{src}-{tgt}.{tgt}` (line aligned,
optionally `.xz`/`.gz`; `{tgt}-{src}.*` is found too) or `{data_dir}/{src}-{tgt}.tsv`
(`src<TAB>tgt`). Example:

    from xlm_jax_tasks import parallel
    parallel.register_opus("/data/opus", ["en-de", "en-sw"], "/models/xlmr.spm.model")
    # -> tasks opus_en_de, opus_en_sw and the mixture opus
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from xlm_jax.data import registry, sampling

__all__ = ["register_opus"]


def register_opus(
    data_dir: str,
    pairs: Sequence[Union[str, Sequence[str]]],
    spm_path: str,
    name_prefix: str = "opus",
    alpha: float = sampling.ALPHA_XLMR,
    kind: str = "pair",
    sequence_length: int = 256,
    max_side_length: int = 128,
    max_total_length: int = 256,
    random_order: bool = True,
    language_list: Optional[Sequence[str]] = None,
    rate_by: str = "tokens",
) -> registry.Registration:
    """Registers `{name_prefix}_{src}_{tgt}` per pair and the mixture `{name_prefix}`.

    kind "pair": `<s> a </s></s> b </s>` (TLM/TRTD/CAMLM), packed several per row;
    "split_pair": x/y rows, a sentence and its translation (VECO bilingual, XLCo without
    mixup); "mixup_pair": InfoXLM XLCo two-pair mixup (needs >= 2 pairs).
    """
    return registry.register_parallel(
        name_prefix, data_dir, pairs, spm_path, sequence_length=sequence_length, alpha=alpha,
        kind=kind, language_list=language_list, max_side_length=max_side_length,
        max_total_length=max_total_length, random_order=random_order, rate_by=rate_by)
