"""Registers the demo corpus in `tasks/demo_data` (importing this module is enough).

Mixtures (each with one task per language or pair, `{mixture}_{lang}` / `{mixture}_en_{xx}`),
and one task (`demo_mixup`):

  name                 example kind  what an example holds
  demo_mono            mono          full-length monolingual segments (MMLM, MRTD)
  demo_parallel        pair          `<s> en </s></s> xx </s>` pairs, packed (TLM, TRTD, CAMLM)
  demo_veco            split_pair    adjacent monolingual segments x, y (VECO)
  demo_veco_parallel   split_pair    x = a sentence, y = its translation (VECO)
  demo_mixup           mixup_pair    InfoXLM XLCo two-pair mixup examples (a single Task: each
                                     example joins pairs of two corpora)

Every mixture and the mixup draw use alpha = 0.3.

The languages and pairs are those with files in `demo_data/mono` and `demo_data/parallel`;
the vocabulary is `demo_data/spm.model`. Corpus sizes are counted on the first import and
cached in `demo_data/xlm_jax_stats.json` (or the user cache if that is read-only).
Re-importing or reloading is a no-op (registration is idempotent).
"""

from __future__ import annotations

import os

from xlm_jax.data import registry, sampling, sources
from xlm_jax.data.vocab import get_vocabulary

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data")
MONO_DIR = os.path.join(DEMO_DIR, "mono")
PARALLEL_DIR = os.path.join(DEMO_DIR, "parallel")
SPM_PATH = os.path.join(DEMO_DIR, "spm.model")
ALPHA = sampling.ALPHA_XLMR
SEQUENCE_LENGTH = 128  # default when a dataset is requested without a length
# Per-task shuffle buffer (examples). seqio's default of 1000 is made for large corpora; with
# 77 small demo tasks it only lengthens the start (every buffer fills before its first
# example) and costs memory.
SHUFFLE_BUFFER = 128

LANGUAGES: list[str] = sources.languages_in_dir(MONO_DIR)
PAIRS: list[str] = [p for p in sources.pairs_in_dir(PARALLEL_DIR) if p.startswith("en-")]


def register_all() -> dict[str, registry.Registration]:
    """Registers the demo mixtures and the mixup task (idempotent); returns the registrations."""
    if not LANGUAGES or not PAIRS:
        raise FileNotFoundError(f"demo corpus missing: no mono/parallel files under {DEMO_DIR}")
    vocab = get_vocabulary(SPM_PATH)
    out = {}
    for name, kind in (("demo_mono", "mono"), ("demo_veco", "split_pair")):
        out[name] = registry.register_monolingual(
            name, MONO_DIR, LANGUAGES, vocab, sequence_length=SEQUENCE_LENGTH, alpha=ALPHA,
            kind=kind, shuffle_buffer_size=SHUFFLE_BUFFER)
    for name, kind in (("demo_parallel", "pair"), ("demo_veco_parallel", "split_pair"),
                       ("demo_mixup", "mixup_pair")):
        out[name] = registry.register_parallel(
            name, PARALLEL_DIR, PAIRS, vocab, sequence_length=SEQUENCE_LENGTH, alpha=ALPHA,
            kind=kind, shuffle_buffer_size=SHUFFLE_BUFFER)
    return out


REGISTRATIONS = register_all()
