"""`python -m xlm_jax.data.prepared.prepare` on Beam's DirectRunner (2 worker processes) over the demo's
text, and the prepared tasks compared with the raw ones they replace.

The reference is the raw path itself (the registry's python readers and TF tokenizer), which
shares no code with the preparation's readers (`corpus_units`) and tokenizer calls.
"""
from __future__ import annotations

import collections
import importlib
import logging
import os
import shutil
import sys

import numpy as np
import pytest
import seqio

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from xlm_jax import cli_help
from xlm_jax.data import converters, prepared, registry
from xlm_jax.data.prepared import choice
from xlm_jax.data.prepared import prepare as prepare_lib
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.vocab import get_vocabulary

# seqio's registries and the prepared-data switch put back after each test: the tests
# register tasks, or register them again over other data (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")

TASKS = ["pd_mono_de", "pd_mono_fr", "pd_veco_de", "pd_pairs_en_de", "pd_pairs_en_fr",
         "pd_mixup"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(corpus root, prepared directory, prepare's completed process)."""
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    r = pc.prepare(root, out)
    assert r.returncode == 0, r.stderr[-3000:]
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        importlib.import_module(pc.MODULE)  # the module's, forgotten after it (on_path)
        yield root, out, r


PROVIDERS = ["pd_mono", "pd_veco", "pd_pairs", "pd_mixup"]


def _select(root: str | None):
    """`prep_tasks` (imported if it was not) with its tasks reading `root` (a prepared
    directory) or the raw files (None), chosen as a run chooses (`registry.select_prepared`)."""
    module = importlib.import_module(pc.MODULE)
    registry.select_prepared(PROVIDERS, root)
    return module


def _rates() -> dict[str, dict[str, float]]:
    """Every provider's rates: a mixture's members, or a mixup task's corpora."""
    return {name: registry.mixture_rates(name) if name != "pd_mixup" else
            registry.get_provider(name).xlm_jax_definition["rates"] for name in PROVIDERS}


def _examples(name: str, length: int = pc.LENGTH, limit: int = 400) -> list[tuple]:
    """The first `limit` examples of a task's one unshuffled epoch, as comparable tuples."""
    task = seqio.TaskRegistry.get(name)
    kind = registry.provider_kind(task)
    ds = task.get_dataset(sequence_length=converters.task_feature_lengths(kind, length),
                          shuffle=False, seed=0, num_epochs=1).take(limit)
    return [tuple((k, np.asarray(v).tolist() if not isinstance(v, bytes) else v)
                  for k, v in sorted(ex.items())) for ex in ds.as_numpy_iterator()]


def test_prepared_tasks_give_the_raw_tasks_examples_and_counts(corpus):
    root, out, run = corpus
    stdout = run.stdout
    # Beam's start-up notes from each worker process are left out, and this corpus has no
    # line to skip (prepare_console; what is kept: prepare_console_test): on stderr only the
    # two inputs one worker reads whole though larger than a unit (8192 bytes here), once
    # each although two tasks read each of them (write_shard_test has the words)
    warned = run.stderr.splitlines()
    assert len(warned) == 2, run.stderr[-3000:]
    prefix = "WARNING:xlm_jax.data.prepared.prepare:"
    assert all(line.startswith(prefix) for line in warned), warned
    assert sorted(line[len(prefix):].split(" (")[0] for line in warned) == sorted([
        os.path.join(root, "mono", "fr.txt.xz"),
        " + ".join(os.path.join(root, "parallel", f"en-de.{x}.xz") for x in ("en", "de"))])
    assert all("is read by one worker from start to end" in line for line in warned)
    assert "work units of 4 tasks" not in stdout  # the mixture's tasks count one by one
    assert "work units of 6 tasks on Beam" in stdout
    manifest = pf.read_json(os.path.join(out, "pd_mono_de", pf.MANIFEST))
    assert len(manifest["corpora"]["de"]["shards"]) > 4  # the plain file was cut into units
    module = _select(None)
    raw = {t: _examples(t) for t in TASKS}
    raw_short = {t: _examples(t, 32) for t in ("pd_mono_de", "pd_pairs_en_fr")}
    raw_rates = _rates()
    assert _select(out) is module
    for name in TASKS:
        assert registry.prepared_root(seqio.TaskRegistry.get(name)) == out
        got = _examples(name)
        assert got and got == raw[name], name  # same tokens, same kinds, same order
    # one preparation serves every sequence length: it holds documents and pairs, not rows
    for name, want in raw_short.items():
        assert _examples(name, 32) == want
    assert _rates() == raw_rates  # from the counts prepare wrote: no host counts a corpus


def test_the_data_is_chosen_where_datasets_are_built_not_before_the_import(corpus):
    """The module is imported once, reading its raw files; a run on the prepared data, then
    one on the raw files again, choose theirs afterwards: the registration calls run again
    (`choice.Recipe`), the module is neither reloaded nor imported again, and nothing is
    left set for later registrations."""
    root, out, _ = corpus
    module = _select(None)
    registrations = module.REGISTRATIONS  # a reload would make a new dict
    before = {t: seqio.TaskRegistry.get(t) for t in TASKS}
    assert all(registry.prepared_root(task) is None for task in before.values())
    registry.select_prepared(["pd_mono", "pd_pairs_en_de"], out)
    assert {t for t in TASKS if registry.prepared_root(seqio.TaskRegistry.get(t)) == out} == {
        "pd_mono_de", "pd_mono_fr", "pd_pairs_en_de", "pd_pairs_en_fr"}  # a call's tasks
    assert registry.prepared_root(seqio.TaskRegistry.get("pd_veco_de")) is None  # not asked
    unchanged = seqio.TaskRegistry.get("pd_mono_de")
    registry.select_prepared(["pd_mono"], out)  # already reads it: nothing registered again
    assert seqio.TaskRegistry.get("pd_mono_de") is unchanged
    registry.select_prepared(PROVIDERS, None)
    assert all(registry.prepared_root(seqio.TaskRegistry.get(t)) is None for t in TASKS)
    assert {t: seqio.TaskRegistry.get(t).xlm_jax_definition for t in TASKS} == {
        t: task.xlm_jax_definition for t, task in before.items()}
    assert importlib.import_module(pc.MODULE).REGISTRATIONS is registrations
    assert [cell[0] for cell in (choice._READING, choice._DEFAULT)] == [None, None]
    # registered while preparing (rates not counted: placeholders), as `prepare` does, then a
    # run on the raw files in the same process: registered again, counted (a fresh clone's CI
    # found this: another file had first imported the module inside `preparing`)
    counted = _rates()
    with choice.preparing():
        importlib.reload(module)
    assert _rates() != counted
    registry.select_prepared(PROVIDERS, None)
    assert _rates() == counted
    # a registration that names its own prepared_dir keeps it whatever a run chooses
    registry.register_monolingual("pd_mono", os.path.join(root, "mono"), ["de", "fr"], pc.SPM,
                                  sequence_length=pc.LENGTH, shuffle_buffer_size=16,
                                  prepared_dir=out)
    own = seqio.TaskRegistry.get("pd_mono_de")
    registry.select_prepared(["pd_mono"], None)
    assert seqio.TaskRegistry.get("pd_mono_de") is own and registry.prepared_root(own) == out


def test_a_host_with_only_the_prepared_data_imports_its_task_module(corpus, tmp_path):
    """No corpus files on this host: the module's registrations would fail over raw files;
    imported for a run on the prepared data (`registry.import_tasks`, as the trainer imports
    its task modules) they read the prepared data."""
    _, out, _ = corpus
    (tmp_path / "host_tasks.py").write_text(pc.TASK_MODULE.format(spm=pc.SPM, length=pc.LENGTH))
    with pc.on_path(str(tmp_path)):  # beside it: no mono/ and no parallel/ directory
        with pytest.raises(FileNotFoundError, match="mono"):
            importlib.import_module("host_tasks")
        sys.modules.pop("host_tasks", None)
        try:
            registry.import_tasks("host_tasks", out, ["pd_mono"])
            assert all(registry.prepared_root(seqio.TaskRegistry.get(t)) == out for t in TASKS)
            assert _examples("pd_mono_fr")
        finally:
            sys.modules.pop("host_tasks", None)


def test_prepared_tasks_need_no_raw_files(corpus, tmp_path):
    """A pod host may hold only the prepared data: the corpus directory does not exist."""
    _, out, _ = corpus
    reg = registry.register_monolingual("pd_mono", str(tmp_path / "nowhere"), ["de", "fr"],
                                        pc.SPM, sequence_length=pc.LENGTH, prepared_dir=out)
    want = {m: prepared.load_task(out, f"pd_mono_{m}", "documents", _vocabulary_of(out, m),
                                  {m: None}).stats(m) for m in ("de", "fr")}
    assert reg.stats == want and reg.stats["de"].examples > 0
    assert _examples("pd_mono_fr")  # and it reads


def _vocabulary_of(out: str, member: str) -> str:
    """The vocabulary fingerprint pd_mono_MEMBER was prepared with."""
    return pf.read_json(os.path.join(out, f"pd_mono_{member}", pf.MANIFEST))["vocabulary"]


def _documents(records: list[np.ndarray]) -> collections.Counter:
    return collections.Counter(tuple(r.tolist()) for r in records)


def test_a_global_shuffle_reads_every_record_once_per_epoch_and_shards_split_it(corpus):
    _, out, _ = corpus
    task = prepared.load_task(out, "pd_mono_de", "documents",
                              pf.read_json(os.path.join(out, "pd_mono_de", pf.MANIFEST))
                              ["vocabulary"], {"de": None})
    records = task.records("de")
    n = records.num_records
    every = _documents(records.read(np.arange(n)))
    order = prepared.record_numbers(0, n, 0, 1, n, True, 7, 3)
    assert sorted(order.tolist()) == list(range(n)) and order.tolist() != list(range(n))
    assert _documents(records.read(order)) == every
    again = prepared.record_numbers(0, 2 * n, 0, 1, n, True, 7, 3)
    assert again[:n].tolist() == order.tolist()
    assert sorted(again[n:].tolist()) == list(range(n)) and again[n:].tolist() != order.tolist()
    assert prepared.record_numbers(0, n, 0, 1, n, True, 8, 3).tolist() != order.tolist()
    # process p of 3 takes global positions p, p + 3, ...: disjoint, together the one order
    blocks = [prepared.record_numbers(0, n // 3, p, 3, n, True, 7, 3) for p in range(3)]
    union = np.stack(blocks, axis=1).reshape(-1)
    assert union.tolist() == order[:3 * (n // 3)].tolist()
    # through the seqio source: one unshuffled epoch is every document in file order
    source = prepared.source(task, "de", [5])
    docs = list(source.get_dataset(shuffle=False).as_numpy_iterator())
    assert [d["tokens"].tolist() for d in docs] == [r.tolist() for r in records.read(
        np.arange(n))]
    assert {int(d["lang"]) for d in docs} == {5}
    shuffled = source.get_dataset(shuffle=True, seed=7).take(n).as_numpy_iterator()
    assert _documents([d["tokens"] for d in shuffled]) == every


def test_prepare_again_skips_what_is_prepared_and_refuses_another_preparation(corpus, tmp_path):
    root, out, _ = corpus
    before = pc.tree(out)
    r = pc.prepare(root, out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "on Beam" not in r.stdout and r.stdout.count("already prepared") == 6
    assert pc.tree(out) == before
    # another split of the same corpus is another preparation: refused, nothing touched
    r = pc.prepare(root, out, split_bytes=4096, pattern="pd_mono")
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith(f"prepare: {out}/pd_mono_de holds another preparation of pd_mono_de")
    assert "de units" in err and "nothing was overwritten" in err
    assert pc.tree(out) == before


def test_a_plan_names_a_corpus_file_edited_at_the_same_size(tmp_path):
    big = tmp_path / "en.txt"  # larger than the sampled bytes: 16 blocks of 64 KiB are read
    text = b"".join(b"document %07d of the corpus\n" % i for i in range(80_000))
    big.write_bytes(text)
    assert len(text) > pf.SAMPLE_BLOCKS * pf.SAMPLE_BLOCK

    def plan():
        return pf.Plan("t", "documents", "v", {"en": {"sources": pf.source_entries([str(big)]),
                                                      "swapped": False, "units": 1}})

    before = plan()
    last = len(text) - 10  # inside the last sampled block
    big.write_bytes(text[:last] + b"X" + text[last + 1:])
    assert plan().differences(before) == [
        "en: en.txt has the same size but other content than when it was prepared"]
    assert plan().digest != before.digest  # its shards are not taken for the old plan's
    # a plan written before samples were recorded: compared by name and size
    old = pf.Plan("t", "documents", "v", {"en": {"sources": [{"file": "en.txt",
                                                              "bytes": len(text)}],
                                                 "swapped": False, "units": 1}})
    assert plan().differences(old) == []


def test_prepared_data_that_does_not_match_is_one_line_before_any_read(
        corpus, tmp_path, train_xlmr_spm):
    root, out, _ = corpus
    vocab_fp = pf.read_json(os.path.join(out, "pd_pairs_en_de", pf.MANIFEST))["vocabulary"]
    other_spm = train_xlmr_spm(os.path.join(root, "mono", "de.txt"), tmp_path / "other", 300)

    def refused(fn, *words):
        with pytest.raises(pf.PreparedError) as e:
            fn()
        assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)

    # another SentencePiece model
    refused(lambda: registry.register_monolingual(
        "pd_mono", os.path.join(root, "mono"), ["de"], get_vocabulary(other_spm),
        prepared_dir=out), f"{out}/pd_mono_de", "vocabulary")
    # the corpus file changed since it was prepared
    changed = tmp_path / "changed"
    shutil.copytree(os.path.join(root, "mono"), changed)
    with open(changed / "de.txt", "a", encoding="utf-8") as f:
        f.write("\nEin neues Dokument.\n")
    size = os.path.getsize(os.path.join(root, "mono", "de.txt"))
    refused(lambda: registry.register_monolingual(
        "pd_mono", str(changed), ["de"], pc.SPM, prepared_dir=out),
        f"{out}/pd_mono_de: the corpus changed since it was prepared (de: de.txt had {size} "
        f"bytes when it was prepared and has {size + 21} now)")
    # ... and edited at the same size (one letter of its middle): the content sample sees it
    same = tmp_path / "same_size"
    shutil.copytree(os.path.join(root, "mono"), same)
    with open(same / "de.txt", "r+b") as f:
        f.seek(size // 2)
        letter = f.read(1)
        f.seek(size // 2)
        f.write(b"x" if letter != b"x" else b"y")
    assert os.path.getsize(same / "de.txt") == size
    refused(lambda: registry.register_monolingual(
        "pd_mono", str(same), ["de"], pc.SPM, prepared_dir=out),
        "de: de.txt has the same size but other content than when it was prepared")
    # damaged copies of one prepared pair task
    def damaged(name, damage):
        copy = tmp_path / name
        shutil.copytree(os.path.join(out, "pd_pairs_en_de"), copy / "pd_pairs_en_de")
        damage(copy / "pd_pairs_en_de" / "en-de" / "shard-00000-of-00001")
        return lambda: prepared.load_task(str(copy), "pd_pairs_en_de", "pairs", vocab_fp,
                                          {"en-de": None})

    refused(damaged("missing", lambda p: os.remove(f"{p}.bin")), "shard-00000-of-00001.bin",
            "is missing")
    refused(damaged("truncated", lambda p: os.truncate(f"{p}.bin", 100)),
            "shard-00000-of-00001.bin: 100 bytes, but the manifest says")

    def shift_index(p):
        idx = np.fromfile(f"{p}.idx", "<i8")
        idx[-1] -= 4
        idx.tofile(f"{p}.idx")

    refused(damaged("index", shift_index), "shard-00000-of-00001.idx does not match its shard")

    def half_copied(p):
        manifest = p.parent.parent / pf.MANIFEST
        manifest.write_bytes(manifest.read_bytes()[:200])

    refused(damaged("half_copied", half_copied), f"pd_pairs_en_de/{pf.MANIFEST}: not valid JSON "
            "(", "a damaged or half-copied file")
    with pytest.raises(pf.PreparedError) as e:
        damaged("half_copied_again", half_copied)()
    assert str(e.value).count(pf.MANIFEST) == 1, str(e.value)  # named once, not wrapped
    refused(damaged("unfinished", lambda p: os.remove(p.parent.parent / pf.MANIFEST)),
            "did not finish", "every work unit written, the manifest not")
    refused(lambda: prepared.load_task(str(tmp_path), "pd_pairs_en_de", "pairs", vocab_fp,
                                       {"en-de": None}), "is not prepared there")
    # more processes than records
    task = prepared.load_task(out, "pd_mono_fr", "documents", vocab_fp, {"fr": None})
    n = task.records("fr").num_records
    refused(lambda: prepared.source(task, "fr", [1]).get_dataset(
        shard_info=seqio.ShardInfo(0, n + 1)), f"{n} records cannot be shared by {n + 1}")


def test_a_worker_that_fails_names_its_shard_and_the_rerun_finishes(tmp_path):
    root = pc.write(str(tmp_path / "corpus"))
    bad = os.path.join(root, "parallel", "en-de.de.xz")
    os.rename(bad, bad + ".good")
    shutil.copy(os.path.join(root, "parallel", "en-de.en.xz"), bad)  # wrong side, same lines
    with open(bad, "ab") as f:  # one line more than en: misaligned
        import lzma
        f.write(lzma.compress(b"one line too many\n"))
    out = str(tmp_path / "prepared")
    r = pc.prepare(root, out, pattern="pd_pairs")
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith(f"prepare: {out}/pd_pairs_en_de/en-de/shard-00000-of-00001: "
                          "ValueError: parallel files have different line counts"), err
    assert "1 work unit(s) failed" in err
    assert os.path.exists(os.path.join(out, "pd_pairs_en_fr", pf.MANIFEST))  # the other task
    assert not os.path.exists(os.path.join(out, "pd_pairs_en_de", pf.MANIFEST))
    os.replace(bad + ".good", bad)
    # fixed, the same command finishes: the unfinished task (planned with the bad file's
    # size) starts over, the finished one is kept
    kept = pc.tree(os.path.join(out, "pd_pairs_en_fr"))
    r = pc.prepare(root, out, pattern="pd_pairs")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pd_pairs_en_de: an unfinished preparation of another plan" in r.stdout
    assert pc.tree(os.path.join(out, "pd_pairs_en_fr")) == kept
    stats = pf.read_json(os.path.join(out, "pd_pairs_en_de", pf.MANIFEST))["corpora"]["en-de"]
    assert stats["stats"]["examples"] == 1542  # every pair of the demo's en-de


def test_a_missing_corpus_file_is_one_line_and_exit_1(tmp_path):
    root = pc.write(str(tmp_path / "corpus"))
    os.remove(os.path.join(root, "mono", "fr.txt.xz"))
    out = str(tmp_path / "prepared")
    r = pc.prepare(root, out, pattern="pd_mono")
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"prepare: --module {pc.MODULE}: FileNotFoundError: no corpus file for language 'fr': "
        f"{os.path.join(root, 'mono', 'fr.txt')}[.xz|.gz] does not exist, nor "
        f"{os.path.join(root, 'mono', 'fr')}/*.txt[.xz|.gz]; languages found in "
        f"{os.path.join(root, 'mono')}: ['de']"]
    assert not os.path.exists(out)  # refused before anything was written


def test_skipped_lines_are_warned_and_a_refused_corpus_keeps_the_other_tasks(tmp_path):
    """German with 5 invalid UTF-8 lines (skipped and counted), French in Latin-1 (mostly not
    UTF-8: refused): the warning names the file and its count, the refusal is one line that
    names what was prepared and kept, and the same command finishes once French is fixed."""
    import lzma

    root = pc.write(str(tmp_path / "corpus"))
    de = os.path.join(root, "mono", "de.txt")
    with open(de, "rb") as f:
        lines = f.read().split(b"\n")
    for k in range(5):
        lines[10 + 7 * k] = b"kaputt \xff\xfe " + lines[10 + 7 * k]
    with open(de, "wb") as f:
        f.write(b"\n".join(lines))
    fr = os.path.join(root, "mono", "fr.txt.xz")
    shutil.copy(fr, fr + ".good")
    with lzma.open(fr + ".good", "rt", encoding="utf-8") as f:
        text = f.read()
    with lzma.open(fr, "wb") as f:
        f.write(text.encode("latin-1", errors="replace"))
    out = str(tmp_path / "prepared")
    r = pc.prepare(root, out, pattern="pd_mono")
    assert r.returncode == 2, r.stderr[-3000:]
    err = r.stderr.strip().splitlines()
    assert f"WARNING:xlm_jax.data.stats_cache:{de}: skipped 5 lines that are not valid UTF-8" in err
    assert err[-1].startswith(f"prepare: pd_mono_fr: {fr}: ")
    assert err[-1].endswith("(1 task(s) refused; prepared and kept: pd_mono_de; fix the corpus "
                            "and run the same command again to finish the rest)")
    assert "Latin-1" in err[-1]
    manifest = pf.read_json(os.path.join(out, "pd_mono_de", pf.MANIFEST))
    assert manifest["corpora"]["de"]["stats"]["invalid_utf8_lines"] == 5
    assert not os.path.exists(os.path.join(out, "pd_mono_fr", pf.MANIFEST))
    kept = pc.tree(os.path.join(out, "pd_mono_de"))
    os.replace(fr + ".good", fr)
    r = pc.prepare(root, out, pattern="pd_mono")
    assert r.returncode == 0, r.stderr[-3000:]
    assert pf.exists(os.path.join(out, "pd_mono_fr", pf.MANIFEST))
    assert pc.tree(os.path.join(out, "pd_mono_de")) == kept


def test_prepare_is_refused_for_tasks_it_cannot_read(corpus):
    root, out, _ = corpus
    _select(out)  # prepared tasks hold no corpus files to read
    with pytest.raises(ValueError, match="has no corpus files to prepare"):
        prepare_lib.plan_task(seqio.TaskRegistry.get("pd_mono_de"), out, 1 << 20)
    with pytest.raises(ValueError, match="names no registered task"):
        prepare_lib.resolve_tasks(["no_such_task*"])


def test_a_language_in_parts_is_read_in_order_and_prepared_file_by_file(tmp_path):
    """`{lang}/` holding the German text as three files (plain, plain, .xz): the raw task reads
    them in name order; `prepare` makes work units of each file and gives the same examples."""
    import io
    import lzma

    from xlm_jax.data.prepared.prepare_worker import run_unit

    docs = pc._text(os.path.join(pc.DEMO, "mono", "de.txt.xz")).split("\n\n")
    parts = tmp_path / "mono" / "de"
    parts.mkdir(parents=True)
    third = len(docs) // 3
    (parts / "a.txt").write_text("\n\n".join(docs[:third]), encoding="utf-8")
    (parts / "b.txt").write_text("\n\n".join(docs[third:2 * third]), encoding="utf-8")
    (parts / "c.txt.xz").write_bytes(lzma.compress("\n\n".join(docs[2 * third:]).encode()))
    mono = str(tmp_path / "mono")

    def register(**kw):
        return registry.register_monolingual("parts", mono, ["de"], pc.SPM,
                                             sequence_length=pc.LENGTH, **kw)

    raw = register()
    want = _examples("parts_de")
    whole = registry.register_monolingual("whole", os.path.join(pc.DEMO, "mono"), ["de"],
                                          pc.SPM, sequence_length=pc.LENGTH)
    assert raw.stats["de"].examples == whole.stats["de"].examples  # no document lost or split
    out = str(tmp_path / "prepared")
    with choice.preparing():
        register()
    prepare_lib.prepare(["parts_de"], out, split_bytes=16384, out=io.StringIO(),
                        run_units=lambda items, _: [run_unit(i) for i in items])
    manifest = pf.read_json(os.path.join(out, "parts_de", pf.MANIFEST))["corpora"]["de"]
    assert [s["file"] for s in manifest["sources"]] == ["a.txt", "b.txt", "c.txt.xz"]
    assert len(manifest["shards"]) > 3  # the plain parts cut further, the .xz one unit
    assert register(prepared_dir=out).stats == raw.stats
    assert _examples("parts_de") == want


def test_0_2_s_names_still_work_for_one_release_with_a_warning(corpus, monkeypatch):
    """`prepared.use` (the process-wide switch) and the old module paths, each with one
    WARNING naming what replaces it (`cli_help.MOVED`; the old commands: cli_table_test)."""
    _, out, _ = corpus
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    monkeypatch.setattr(cli_help, "_warned", set())
    logging.getLogger("xlm_jax.moved").addHandler(handler)
    try:
        prepared.use(out)
        try:  # no corpus files here: only the switch makes this registration work
            registry.register_monolingual("pd_mono", "/nowhere", ["de", "fr"], pc.SPM,
                                          sequence_length=pc.LENGTH, shuffle_buffer_size=16)
        finally:
            prepared.use(None)
        from xlm_jax.data.prepared_files import CorpusRecords  # noqa: the old path
        from xlm_jax.data import verify as old_verify
        old_main = old_verify.main
    finally:
        logging.getLogger("xlm_jax.moved").removeHandler(handler)
    assert registry.prepared_root(seqio.TaskRegistry.get("pd_mono_fr")) == out
    assert CorpusRecords is pf.CorpusRecords
    from xlm_jax.data.prepared import verify
    assert old_main is verify.main
    assert [r.getMessage() for r in records] == [
        "`xlm_jax.data.prepared.use` is deprecated: use loop.train.prepared_data or "
        "registry.select_prepared; the old name is removed in the release after 0.3",
        "`xlm_jax.data.prepared_files` has moved to `xlm_jax.data.prepared.shard_files`; the "
        "old name is removed in the release after 0.3",
        "`xlm_jax.data.verify` has moved to `xlm_jax.data.prepared.verify`; the old name is "
        "removed in the release after 0.3"]
