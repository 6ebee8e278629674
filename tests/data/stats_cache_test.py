"""The raw path's counting pass says, once and before it starts, how long it is about to take
when a corpus file is large; a cached count says nothing."""
from __future__ import annotations

import logging

from xlm_jax.data import registry, stats_cache

SPM = "tasks/demo_data/spm.model"


def test_a_large_file_is_announced_once_with_its_time(tmp_path, monkeypatch, caplog,
                                                      seqio_isolated):
    text = "".join(f"Satz Nummer {i} des Dokuments.\n" + ("\n" if i % 5 == 4 else "")
                   for i in range(2000))
    (tmp_path / "de.txt").write_text(text, encoding="utf-8")
    size = (tmp_path / "de.txt").stat().st_size
    monkeypatch.setattr(stats_cache, "ANNOUNCE_BYTES", size)  # "large" = this file's size
    with caplog.at_level(logging.WARNING, logger="xlm_jax.data.stats_cache"):
        reg = registry.register_monolingual("ann_mono", str(tmp_path), ["de"], SPM)
        registry.register_monolingual("ann_mono", str(tmp_path), ["de"], SPM)  # cached now
    lines = [r.getMessage() for r in caplog.records if "counting the tokens" in r.getMessage()]
    seconds = size / 1e6 / stats_cache.COUNT_MB_PER_S
    assert lines == [f"counting the tokens of {tmp_path / 'de.txt'} ({size / 1e6:.0f} MB) on "
                     f"this host: about {seconds:.0f} s at {stats_cache.COUNT_MB_PER_S:.1f} MB/s, "
                     "once (cached in the stats file); python -m xlm_jax.data.prepared.prepare counts in "
                     "parallel while it prepares the corpus"]
    assert reg.stats["de"].examples == 400

    monkeypatch.setattr(stats_cache, "ANNOUNCE_BYTES", size + 1)  # a smaller file: silent
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "de.txt").write_text(text, encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="xlm_jax.data.stats_cache"):
        registry.register_monolingual("ann_mono", str(tmp_path / "other"), ["de"], SPM)
    assert not [r for r in caplog.records if "counting the tokens" in r.getMessage()]
