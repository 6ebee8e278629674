"""Task/mixture registration, corpus-stats cache, idempotency, file layouts and the demo tasks.

Expected sizes and rates are recomputed here independently: documents/pairs are counted with
plain python file reading and tokens with the TF-free `XLMRTokenizer`, and the rates with the
paper's formula n^alpha / sum n^alpha.
"""

import collections
import gzip
import json
import lzma
import os
import random

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")
pytest.importorskip("sentencepiece")

from xlm_jax.data import converters, registry, sources, stats_cache  # noqa: E402
from xlm_jax.data.features import EXAMPLE_KINDS, example_kind, language_index  # noqa: E402
from xlm_jax.data.pipeline import make_batch_iterator  # noqa: E402
from xlm_jax.data.vocab import XLMRTokenizer, get_vocabulary  # noqa: E402

WORDS = {lang: [f"{lang}{w}" for w in ("alpha", "beta", "gamma", "delta", "eps", "zeta")]
         for lang in ("en", "fr", "sw", "de")}


# seqio's registries put back after each test: the tests register tasks (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")


def _sentence(rnd, lang):
    return " ".join(rnd.choice(WORDS[lang]) for _ in range(rnd.randint(2, 7)))


def _write(path, text):
    opener = lzma.open if path.endswith(".xz") else gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)


def _mono_text(rnd, lang, docs):
    return "".join("\n".join(_sentence(rnd, lang) for _ in range(rnd.randint(1, 4))) + "\n\n"
                   for _ in range(docs))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, train_xlmr_spm):
    root = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(0)
    (root / "spm.txt").write_text("\n".join(_sentence(rnd, l) for l in WORDS for _ in range(200)))
    train_xlmr_spm(root / "spm.txt", root / "spm", 60)
    mono = root / "mono"
    mono.mkdir()
    _write(str(mono / "en.txt"), _mono_text(rnd, "en", 40))
    _write(str(mono / "fr.txt.xz"), _mono_text(rnd, "fr", 12))
    _write(str(mono / "sw.txt.gz"), _mono_text(rnd, "sw", 3))
    par = root / "par"
    par.mkdir()
    en_fr = [(_sentence(rnd, "en"), _sentence(rnd, "fr")) for _ in range(30)]
    _write(str(par / "en-fr.en"), "".join(a + "\n" for a, _ in en_fr))
    _write(str(par / "en-fr.fr"), "".join(b + "\n" for _, b in en_fr))
    en_sw = [(_sentence(rnd, "en"), _sentence(rnd, "sw")) for _ in range(8)]
    _write(str(par / "en-sw.tsv"), "".join(f"{a}\t{b}\n" for a, b in en_sw))
    en_de = [(_sentence(rnd, "en"), _sentence(rnd, "de")) for _ in range(5)]  # named de-en.*
    _write(str(par / "de-en.de.gz"), "".join(b + "\n" for _, b in en_de))
    _write(str(par / "de-en.en.gz"), "".join(a + "\n" for a, _ in en_de))
    spm_path = str(root / "spm.model")
    return {"root": root, "mono": str(mono), "par": str(par), "spm": spm_path,
            "vocab": get_vocabulary(spm_path), "tok": XLMRTokenizer(spm_path),
            "pairs": {"en-fr": en_fr, "en-sw": en_sw, "en-de": en_de}}


def _read_text(path):
    opener = lzma.open if path.endswith(".xz") else gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def _independent_mono_sizes(path, tok):
    """(documents, tokens incl. one </s> per document) by plain splitting on blank lines."""
    docs = [d for d in _read_text(path).split("\n\n") if d.strip()]
    tokens = sum(len(tok.encode(line)) for d in docs for line in d.split("\n") if line.strip())
    return len(docs), tokens + len(docs)


def _expected_rates(sizes, alpha):
    w = {k: v ** alpha for k, v in sizes.items()}
    return {k: v / sum(w.values()) for k, v in w.items()}


def test_register_monolingual_tasks_rates_and_stats(corpus):
    reg = registry.register_monolingual("rt_mono", corpus["mono"], ["en", "fr", "sw"],
                                        corpus["vocab"], sequence_length=32, alpha=0.5)
    assert reg.tasks == {"en": "rt_mono_en", "fr": "rt_mono_fr", "sw": "rt_mono_sw"}
    files = {"en": "en.txt", "fr": "fr.txt.xz", "sw": "sw.txt.gz"}
    sizes = {}
    for lang, name in files.items():
        docs, tokens = _independent_mono_sizes(os.path.join(corpus["mono"], name), corpus["tok"])
        assert (reg.stats[lang].examples, reg.stats[lang].tokens) == (docs, tokens)
        sizes[lang] = tokens
    want = _expected_rates(sizes, 0.5)
    assert reg.rates == pytest.approx(want, abs=1e-12)
    assert registry.mixture_rates("rt_mono") == pytest.approx(
        {f"rt_mono_{k}": v for k, v in want.items()}, abs=1e-12)
    assert registry.provider_kind("rt_mono").name == "mono"
    assert registry.provider_kind("rt_mono_fr") is example_kind("mono")
    # the stats JSON sits beside the data and holds the same numbers
    with open(os.path.join(corpus["mono"], registry.STATS_FILE)) as f:
        entries = json.load(f)["entries"]
    by_file = {e["files"][0]: e["stats"] for e in entries.values()}
    assert by_file["fr.txt.xz"]["tokens"] == sizes["fr"]
    assert by_file["sw.txt.gz"]["invalid_utf8_lines"] == 0


def test_stats_counted_once_and_invalidated_on_change(corpus, monkeypatch, tmp_path):
    mono = tmp_path / "mono"
    mono.mkdir()
    for name in ("en.txt", "fr.txt.xz"):
        (mono / name).write_bytes((corpus["root"] / "mono" / name).read_bytes())
    calls = []
    real = sources.count_monolingual
    monkeypatch.setattr(sources, "count_monolingual",
                        lambda paths, enc: calls.extend(os.path.basename(p) for p in paths)
                        or real(paths, enc))
    first = registry.register_monolingual("rt_cache", str(mono), ["en", "fr"], corpus["vocab"])
    assert sorted(calls) == ["en.txt", "fr.txt.xz"]
    registry.register_monolingual("rt_cache2", str(mono), ["en", "fr"], corpus["vocab"])
    assert len(calls) == 2  # cached: not recounted
    os.utime(mono / "en.txt", ns=(1, 1))  # new mtime, same bytes (e.g. a fresh clone)
    registry.register_monolingual("rt_cache2", str(mono), ["en", "fr"], corpus["vocab"])
    assert len(calls) == 2  # content fallback: still not recounted
    with open(mono / "en.txt", "a") as f:
        f.write("enalpha enbeta\n\n")
    second = registry.register_monolingual("rt_cache", str(mono), ["en", "fr"], corpus["vocab"])
    assert calls[2:] == ["en.txt"]  # only the changed file
    assert second.stats["en"].examples == first.stats["en"].examples + 1
    assert second.rates != first.rates
    # the changed definition replaced the old registration
    assert seqio.MixtureRegistry.get("rt_cache").xlm_jax_definition["rates"] == second.rates


def test_stats_go_to_user_cache_when_data_dir_is_read_only(corpus, monkeypatch, tmp_path):
    mono = tmp_path / "ro"
    mono.mkdir()
    (mono / "en.txt").write_bytes((corpus["root"] / "mono" / "en.txt").read_bytes())
    monkeypatch.setattr(stats_cache, "_dir_writable", lambda path: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    registry.register_monolingual("rt_ro", str(mono), ["en"], corpus["vocab"])
    assert not (mono / registry.STATS_FILE).exists()
    cached = list((tmp_path / "xdg" / "xlm_jax" / "stats").glob("*.json"))
    assert len(cached) == 1 and "en.txt" in cached[0].read_text()


def test_registration_is_idempotent(corpus):
    a = registry.register_monolingual("rt_idem", corpus["mono"], ["en", "fr"], corpus["vocab"],
                                      sequence_length=64)
    task = seqio.TaskRegistry.get("rt_idem_en")
    mixture = seqio.MixtureRegistry.get("rt_idem")
    b = registry.register_monolingual("rt_idem", corpus["mono"], ["en", "fr"], corpus["vocab"],
                                      sequence_length=64)
    assert a == b
    assert seqio.TaskRegistry.get("rt_idem_en") is task  # identical: kept as is
    assert seqio.MixtureRegistry.get("rt_idem") is mixture
    registry.register_monolingual("rt_idem", corpus["mono"], ["en", "fr"], corpus["vocab"],
                                  sequence_length=128)
    assert seqio.TaskRegistry.get("rt_idem_en") is not task  # changed: replaced
    assert seqio.TaskRegistry.get("rt_idem_en").xlm_jax_definition["sequence_length"] == 128
    seqio.TaskRegistry.add("rt_foreign_en", source=task.source,
                           output_features=task.output_features)
    with pytest.raises(ValueError, match="'rt_foreign_en' is already registered by other code"):
        registry.register_monolingual("rt_foreign", corpus["mono"], ["en"], corpus["vocab"])


def test_every_example_kind_names_pieces_that_exist():
    """The records name their TF-side pieces by module path (`features.Ref`): each resolves,
    and each converter handles exactly its kind's rows."""
    for kind in EXAMPLE_KINDS.values():
        converter = kind.converter.load()
        assert converter.PREFIXES == kind.prefixes, kind.name
        assert set(converter.MODEL_FEATURES) == set(kind.features), kind.name
        assert callable(kind.synthetic_rows.load()), kind.name
        for ref in (kind.from_documents, kind.from_pairs):
            assert ref is None or callable(ref.load()), kind.name


def test_the_kind_of_a_provider_is_the_one_recorded(corpus):
    """A plain seqio Mixture over registered Tasks has their kind; Tasks of two kinds in one
    Mixture, or a Task registered without a kind, are one-line errors (no guessing)."""
    registry.register_monolingual("rt_pk", corpus["mono"], ["en", "fr"], corpus["vocab"])
    registry.register_parallel("rt_pk_par", corpus["par"], ["en-fr"], corpus["vocab"])
    for name, members in (("rt_pk_plain", ["rt_pk_en", "rt_pk_fr"]),
                          ("rt_pk_mixed", ["rt_pk_en", "rt_pk_par_en_fr"])):
        if name not in seqio.MixtureRegistry.names():
            seqio.MixtureRegistry.add(name, [(m, 1.0) for m in members])
    assert registry.provider_kind("rt_pk_plain") is example_kind("mono")
    with pytest.raises(ValueError, match=r"^mixture rt_pk_mixed: its tasks have different "
                                         r"example kinds \(rt_pk_en: mono, rt_pk_par_en_fr: "
                                         r"pair\)$"):
        registry.provider_kind("rt_pk_mixed")
    task = seqio.TaskRegistry.get("rt_pk_en")
    if "rt_pk_foreign" not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add("rt_pk_foreign", source=task.source,
                               output_features=task.output_features)
    with pytest.raises(ValueError, match=r"^task rt_pk_foreign records no example kind: .*"
                                         r"xlm_jax_kind=KIND, KIND one of mono, pair, "):
        registry.provider_kind("rt_pk_foreign")


def test_register_parallel_layouts_and_orientation(corpus):
    reg = registry.register_parallel("rt_par", corpus["par"], ["en-fr", "en-sw", ("en", "de")],
                                     corpus["vocab"], alpha=0.7, random_order=False)
    assert reg.tasks == {"en-fr": "rt_par_en_fr", "en-sw": "rt_par_en_sw",
                         "en-de": "rt_par_en_de"}
    tok = corpus["tok"]
    sizes = {}
    for member, pairs in corpus["pairs"].items():
        assert reg.stats[member].examples == len(pairs)
        sizes[member] = sum(len(tok.encode(a)) + len(tok.encode(b)) for a, b in pairs)
        assert reg.stats[member].tokens == sizes[member]
    assert reg.rates == pytest.approx(_expected_rates(sizes, 0.7), abs=1e-12)
    languages = registry.default_language_list()
    for member, pairs in corpus["pairs"].items():
        src, tgt = member.split("-")
        task = seqio.TaskRegistry.get(reg.tasks[member])
        ds = task.get_dataset(converters.task_feature_lengths("pair", 64), shuffle=False)
        first = next(ds.as_numpy_iterator())
        a, b = (tok.encode(x) for x in pairs[0])
        assert first["input_ids"].tolist() == [0] + a + [2, 2] + b + [2]  # en first, as given
        assert first["lang_ids"].tolist() == (
            [language_index(src, languages)] * (len(a) + 2)
            + [language_index(tgt, languages)] * (len(b) + 2))


def test_parallel_kinds_split_pair_and_mixup_pair(corpus):
    split = registry.register_parallel("rt_vp", corpus["par"], ["en-fr", "en-sw"],
                                       corpus["vocab"], kind="split_pair")
    assert split.kind == "split_pair" and registry.provider_kind(split.mixture).name == "split_pair"
    # the old name is an alias: the same registration, recorded under the new name
    assert registry.register_parallel("rt_vp", corpus["par"], ["en-fr", "en-sw"],
                                      corpus["vocab"], kind="veco") == split
    mix = registry.register_parallel("rt_mix", corpus["par"], ["en-fr", "en-sw", "en-de"],
                                     corpus["vocab"], kind="mixup_pair", alpha=1.0)
    assert isinstance(registry.get_provider("rt_mix"), seqio.Task)  # one task, no mixture
    batch = next(make_batch_iterator("rt_mix", 64, 48, seed=0))
    languages = registry.default_language_list()
    ids = {m: tuple(language_index(x, languages) for x in m.split("-")) for m in mix.stats}
    # the query's two sentences come from two different corpora: their languages differ or,
    # when both are English, the key's two translations do
    firsts = batch["query_lang_ids"][:, 0]
    assert set(firsts.tolist()) <= {i for pair in ids.values() for i in pair}
    for row in range(64):
        q_langs = {int(x) for x in batch["query_lang_ids"][row] if x}
        k_langs = {int(x) for x in batch["key_lang_ids"][row] if x}
        assert len(q_langs | k_langs) >= 2
        assert batch["query_segment_ids"][row].max() == 1 and batch["key_pair_side"][row].max() == 2


def test_make_batch_iterator_shapes_and_shards(corpus):
    registry.register_monolingual("rt_it", corpus["mono"], ["en", "fr", "sw"], corpus["vocab"])
    batch = next(make_batch_iterator("rt_it", 4, 16, seed=0))
    assert sorted(batch) == sorted(["input_ids", "positions", "segment_ids", "pair_side",
                                    "lang_ids"])
    assert all(v.shape == (4, 16) and v.dtype == np.int32 for v in batch.values())
    assert (batch["input_ids"][:, 0] == 0).all()
    # two shards read different documents (their disjointness and coverage: the next test)
    s0 = next(make_batch_iterator("rt_it", 4, 16, seed=0, shard_index=0, num_shards=2))
    s1 = next(make_batch_iterator("rt_it", 4, 16, seed=0, shard_index=1, num_shards=2))
    assert not np.array_equal(s0["input_ids"], s1["input_ids"])


def _epoch(ds):
    return list(ds.as_numpy_iterator())


@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_are_disjoint_and_cover_every_document_once(corpus, num_shards):
    """Host i of n (the `seqio.ShardInfo(i, n)` that `make_batch_iterator` passes down) reads
    documents i, i+n, ... of every language: over one epoch the hosts' documents are pairwise
    disjoint and together every document exactly once; the same holds for the tokens of the
    hosts' segment streams (the Task's preprocessed output, what the batches are packed from).
    (Every corpus here has >= n documents: fewer would share one, by design.)"""
    reg = registry.register_monolingual("rt_it", corpus["mono"], ["en", "fr", "sw"],
                                        corpus["vocab"])
    for lang, task_name in reg.tasks.items():
        task = seqio.get_mixture_or_task(task_name)
        # every document, by plain file reading (blank-line separated, as in _mono_text)
        name = next(f for f in os.listdir(corpus["mono"]) if f.startswith(lang + "."))
        opener = (lzma.open if name.endswith(".xz") else gzip.open if name.endswith(".gz")
                  else open)
        with opener(os.path.join(corpus["mono"], name), "rt", encoding="utf-8") as f:
            docs = [tuple(d.split("\n")) for d in f.read().strip("\n").split("\n\n")]
        assert len(docs) >= num_shards and len(set(docs)) == len(docs), lang  # all distinct
        shards = []
        for i in range(num_shards):
            info = seqio.ShardInfo(i, num_shards)
            got = [tuple(x.decode() for x in ex["lines"]) for ex in _epoch(
                task.source.get_dataset("train", shuffle=False, shard_info=info))]
            assert len(set(got)) == len(got), (lang, i)  # no document twice in one shard
            assert got == docs[i::num_shards], (lang, i)
            shards.append(set(got))
        for i in range(num_shards):
            for j in range(i + 1, num_shards):
                assert not shards[i] & shards[j], (lang, i, j)
        assert set().union(*shards) == set(docs), lang
        assert sum(len(s) for s in shards) == len(docs), lang
        # the preprocessed streams: token counts of the hosts add up to the unsharded ones
        def tokens(shard_info):
            counts = collections.Counter()
            for ex in _epoch(task.get_dataset({"input_ids": 32}, "train", shuffle=False,
                                              num_epochs=1, shard_info=shard_info)):
                counts.update(ex["input_ids"][1:-1].tolist())  # without the <s> ... </s> wrap
            return counts
        whole = tokens(None)
        assert sum((tokens(seqio.ShardInfo(i, num_shards)) for i in range(num_shards)),
                   collections.Counter()) == whole, lang


def test_tfds_source_with_a_tiny_local_dataset(corpus, tmp_path):
    """`register_tfds_monolingual` on a TFDS dataset prepared here (one split per language):
    rates from the TFDS example counts, documents from the `text` feature."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class XlmJaxTestTinyText(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"en": self._generate_examples("en", 12),
                    "fr": self._generate_examples("fr", 3)}

        def _generate_examples(self, lang, n):
            for i in range(n):
                yield i, {"text": " ".join(WORDS[lang][j % 6] for j in range(i, i + 5))}

    XlmJaxTestTinyText(data_dir=str(tmp_path)).download_and_prepare()
    reg = registry.register_tfds_monolingual(
        "rt_tfds", "xlm_jax_test_tiny_text:1.0.0", ["en", "fr"], corpus["vocab"],
        alpha=0.5, tfds_data_dir=str(tmp_path))
    assert reg.rates == pytest.approx(_expected_rates({"en": 12, "fr": 3}, 0.5), abs=1e-12)
    batch = next(make_batch_iterator("rt_tfds", 8, 16, seed=0))
    languages = registry.default_language_list()
    ids = {language_index("en", languages): "en", language_index("fr", languages): "fr"}
    for row in range(8):
        lang = ids[int(batch["lang_ids"][row, 0])]
        text = corpus["vocab"].decode(batch["input_ids"][row, 1:].tolist())
        assert text and all(w[:2] == lang for w in text.split()), text


def test_unknown_task_name_lists_registered_names():
    with pytest.raises(ValueError, match="unknown task or mixture 'no_such_task'.*xlm_jax_tasks.demo"):
        registry.get_provider("no_such_task")


# ----------------------------------------------------------------------------- demo corpus

DEMO_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data")
needs_demo = pytest.mark.skipif(not os.path.isfile(os.path.join(DEMO_DIR, "spm.model")),
                                reason="tasks/demo_data not built yet")


@pytest.fixture(scope="module")
def demo():
    import xlm_jax_tasks.demo  # pylint: disable=import-outside-toplevel

    return xlm_jax_tasks.demo


def _first_example(task_name, length=32):
    task = seqio.TaskRegistry.get(task_name)
    kind = registry.provider_kind(task)
    ds = task.get_dataset(converters.task_feature_lengths(kind, length), shuffle=False)
    return kind, next(ds.as_numpy_iterator())


@needs_demo
def test_demo_registrations_cover_every_file(demo):
    regs = demo.REGISTRATIONS
    assert set(regs) == {"demo_mono", "demo_veco", "demo_parallel", "demo_veco_parallel",
                         "demo_mixup"}
    mono_files = sorted(f for f in os.listdir(demo.MONO_DIR) if ".txt" in f)
    assert sorted(regs["demo_mono"].tasks) == sorted(f.split(".")[0] for f in mono_files)
    assert len(regs["demo_parallel"].tasks) == len(
        [f for f in os.listdir(demo.PARALLEL_DIR) if f.endswith(".en.xz")])
    for reg in regs.values():  # every task has data: documents / pairs counted from its files
        assert all(s.examples > 0 and s.tokens > 0 for s in reg.stats.values()), reg.mixture
        assert sum(reg.rates.values()) == pytest.approx(1.0)
        for name in set(reg.tasks.values()):
            assert registry.get_provider(name) is not None
    # re-importing is a no-op (idempotent registration)
    import importlib  # pylint: disable=import-outside-toplevel

    task = seqio.TaskRegistry.get("demo_mono_en")
    importlib.reload(demo)
    assert seqio.TaskRegistry.get("demo_mono_en") is task


@needs_demo
def test_demo_tasks_yield_examples_sample(demo):
    """Full pipeline for the smallest task of every demo registration (the slow test below
    runs every task; each task pipeline costs ~0.5 s to build)."""
    for reg in demo.REGISTRATIONS.values():
        members = sorted(reg.tasks)
        smallest = min(members, key=lambda m: reg.stats[m].tokens)
        for member in {smallest}:
            kind, ex = _first_example(reg.tasks[member])
            ids = ex[kind.prefixes[0] + "input_ids"]
            assert ids[0] == 0 and (ids != 1).sum() > 3, reg.tasks[member]


@needs_demo
@pytest.mark.slow
def test_every_demo_task_yields_examples(demo):
    names = sorted({n for reg in demo.REGISTRATIONS.values() for n in reg.tasks.values()})
    for name in names:
        kind, ex = _first_example(name)
        assert ex[kind.prefixes[0] + "input_ids"][0] == 0, name
