"""Registering corpora as seqio Tasks and alpha-smoothed Mixtures.

`register_monolingual` registers one Task per language, `{prefix}_{lang}`, and a Mixture
`{prefix}` over them; `register_parallel` one Task per pair, `{prefix}_{src}_{tgt}`, and a
Mixture `{prefix}`. Mixture rates are `sampling.smoothed_rates(sizes, alpha)`:
p_j = n_j^alpha / sum_k n_k^alpha, with n_j the corpus size in tokens (or examples,
`rate_by="examples"`). These functions are plain python so that gin files can pass `alpha`.

Corpus sizes are counted once and cached beside the data (`xlm_jax.data.stats_cache`).
What a Task's examples are, and which preprocessors build them, is its example kind's record
(`xlm_jax.data.features.ExampleKind`); each Task and Mixture records its kind's name.

Registration is idempotent: registering an identical definition again is a no-op; a changed
definition (other files, lengths, alpha, ...) replaces the earlier xlm_jax registration; a
name taken by a Task/Mixture that xlm_jax did not register is an error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import logging
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import seqio
import tensorflow as tf

from xlm_jax.data import corpus_fs, sampling, sources
from xlm_jax.data import preprocessors as prep
from xlm_jax.data.prepared import choice, prepared_source
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.features import (EXAMPLE_KINDS, ExampleKind, default_language_list,
                                   example_kind, language_index, valid_kinds)
from xlm_jax.data.sources import CorpusStats
from xlm_jax.data.stats_cache import (STATS_FILE, StatsCache, corpus_stats, file_key,
                                      stats_path, vocab_fingerprint)

__all__ = [
    "STATS_FILE",
    "Registration",
    "register_monolingual",
    "register_parallel",
    "register_tfds_monolingual",
    "default_language_list",
    "stats_path",
    "get_provider",
    "provider_kind",
    "mixture_rates",
    "prepared_root",
    "select_prepared",
    "import_tasks",
]

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[\w.:]+$")
VocabLike = Union[str, os.PathLike, seqio.Vocabulary]


# ----------------------------------------------------------------------------- seqio classes

class XlmTask(seqio.Task):
    """A seqio Task that remembers its example kind (the name of its `features.ExampleKind`),
    registration definition, the language list its `lang_ids` index into and the corpus
    files it reads (`shard_files.Corpus`, what `data.prepared.prepare` tokenises; none when it
    reads prepared data); `register_*` leaves its call (`xlm_jax_recipe`, `select_prepared`)."""

    xlm_jax_recipe: Optional[choice.Recipe] = None

    def __init__(self, *args, xlm_jax_kind: str, xlm_jax_definition: Any,
                 xlm_jax_languages: Sequence[str] = (),
                 xlm_jax_corpora: Sequence[pf.Corpus] = (), **kwargs):
        self.xlm_jax_kind = xlm_jax_kind
        self.xlm_jax_definition = xlm_jax_definition
        self.xlm_jax_languages = tuple(xlm_jax_languages)
        self.xlm_jax_corpora = tuple(xlm_jax_corpora)
        super().__init__(*args, **kwargs)


class XlmMixture(seqio.Mixture):
    """A seqio Mixture that remembers its kind, definition and member rates/sizes."""

    def __init__(self, *args, xlm_jax_kind: str, xlm_jax_definition: Any, **kwargs):
        self.xlm_jax_kind = xlm_jax_kind
        self.xlm_jax_definition = xlm_jax_definition
        super().__init__(*args, **kwargs)


def _add(registry, name: str, definition: Any, add: Callable[[], Any]) -> Any:
    """Adds a provider unless an identical xlm_jax definition is already registered."""
    if name in registry.names():
        existing = registry.get(name)
        if not hasattr(existing, "xlm_jax_definition"):
            raise ValueError(
                f"{name!r} is already registered by other code ({type(existing).__name__}); "
                "choose another name_prefix"
            )
        if existing.xlm_jax_definition == definition:
            return existing
        logger.info("re-registering %r with a changed definition", name)
        registry.remove(name)
    return add()


def _replayable(register: Callable[..., "Registration"]) -> Callable[..., "Registration"]:
    """`register` that leaves its call (`choice.Recipe`) on each Task it registered, so that
    `select_prepared` can make the same call over other data (a replay leaves it again)."""
    @functools.wraps(register)
    def call(*args: Any, **kwargs: Any) -> Registration:
        done = register(*args, **kwargs)
        names = tuple(sorted(set(done.tasks.values())))
        recipe = choice.Recipe(call, args, dict(kwargs), kwargs.get("prepared_dir"), names,
                               uncounted=choice.is_preparing())
        for name in names:
            seqio.TaskRegistry.get(name).xlm_jax_recipe = recipe
        return done

    return call


def select_prepared(providers: Sequence[str], root: Optional[str]) -> None:
    """Has the Tasks behind `providers` (task or mixture names) read `root` (what `python -m
    xlm_jax.data.prepared.prepare` wrote) where it holds them, else (or with None) their raw
    files: where datasets are built, as seqio's `use_cached` (`data.prepared.choice`). The
    calls that registered them run again where what they read differs, or that were made
    while preparing (uncounted); a call's own `prepared_dir` is kept."""
    recipes = {}  # id -> (recipe, what it should read, what its tasks read now)
    for name in providers:
        provider = get_provider(name)
        for task in getattr(provider, "tasks", [provider]):
            recipe = getattr(task, "xlm_jax_recipe", None)
            if recipe:  # `wanted` checks the directory once per call, not once per task
                entry = recipes.setdefault(id(recipe), (recipe, recipe.wanted(root), set()))
                entry[2].add(prepared_root(task))
    for recipe, wanted, now in recipes.values():
        if recipe.uncounted or now != {wanted}:
            recipe.replay(wanted)


def import_tasks(module: str, root: Optional[str], providers: Sequence[str]) -> None:
    """Imports `module`, which registers tasks, its registrations reading `root` where it holds
    them (a host may hold only the prepared data), then `select_prepared` of the `providers` it
    registered: also a module imported earlier over other data. ImportError as importlib's."""
    with choice.reading(root):
        importlib.import_module(module)
    known = {*seqio.MixtureRegistry.names(), *seqio.TaskRegistry.names()}
    select_prepared([name for name in providers if name in known], root)


def _sizes(cache: StatsCache, paths: Sequence[str], vocab: seqio.Vocabulary, what: str,
           count: Callable[[], CorpusStats]) -> Optional[CorpusStats]:
    """A raw corpus's counted stats (None while preparing: nothing is counted then)."""
    return None if choice.is_preparing() else corpus_stats(cache, paths, vocab, what, count)


# ----------------------------------------------------------------------------- helpers

@dataclasses.dataclass(frozen=True)
class Registration:
    """What a `register_*` call registered.

    mixture: the Mixture name; kind: the example kind's name (an alias resolved); tasks:
    member (language or `src-tgt`) -> Task name; rates: member -> sampling probability;
    stats: member -> counted corpus size.
    """

    mixture: str
    kind: str
    tasks: dict[str, str]
    rates: dict[str, float]
    stats: dict[str, CorpusStats]


def _digest(items: Sequence[str]) -> str:
    return hashlib.sha1(",".join(items).encode()).hexdigest()[:16]


def _as_vocab(vocab: VocabLike) -> seqio.Vocabulary:
    if isinstance(vocab, seqio.Vocabulary):
        return vocab
    from xlm_jax.data.vocab import get_vocabulary  # pylint: disable=g-import-not-at-top

    return get_vocabulary(os.fspath(vocab))


def _check_common(name_prefix: str, alpha: float, rate_by: str, kind: str, owner: str,
                  built_from: str) -> ExampleKind:
    """Checks the shared arguments; returns the record of `kind`, which must have the builder
    `built_from` ("from_documents" or "from_pairs")."""
    if not isinstance(name_prefix, str) or not _NAME_RE.match(name_prefix):
        raise ValueError(f"invalid name_prefix {name_prefix!r}: use letters, digits, '_', '.'")
    kinds = [k.name for k in EXAMPLE_KINDS.values() if getattr(k, built_from)]
    record = None
    if isinstance(kind, str) and not isinstance(kind, bool):
        try:
            record = example_kind(kind)
        except ValueError:
            pass
    if record is None or getattr(record, built_from) is None:
        raise ValueError(f"{owner}({name_prefix!r}): unknown kind {kind!r}: expected one of "
                         f"{valid_kinds(kinds)}")
    if rate_by not in ("tokens", "examples"):
        raise ValueError(f"rate_by must be 'tokens' or 'examples', got {rate_by!r}")
    sampling.smoothed_rates({"probe": 1}, alpha)  # raises for alpha <= 0 before any I/O
    return record


def _check_languages(langs: Sequence[str], language_list: Sequence[str]) -> dict[str, int]:
    for lang in langs:
        sampling.validate_language_code(lang)
    return {lang: language_index(lang, language_list) for lang in langs}


def _features(vocab: seqio.Vocabulary, kind: ExampleKind, num_langs: int
              ) -> dict[str, seqio.Feature]:
    out = {}
    for p in kind.prefixes:
        out[p + "input_ids"] = seqio.Feature(vocab, add_eos=False, dtype=tf.int32)
        out[p + "pair_side"] = seqio.Feature(seqio.PassThroughVocabulary(3), add_eos=False,
                                             dtype=tf.int32)
        out[p + "lang_ids"] = seqio.Feature(seqio.PassThroughVocabulary(num_langs + 1),
                                            add_eos=False, dtype=tf.int32)
    return out


def _register_mixture(name: str, kind: str, tasks: dict[str, str], rates: dict[str, float],
                      task_defs: dict[str, Any]) -> None:
    definition = {"kind": kind, "rates": rates, "tasks": task_defs}
    _add(seqio.MixtureRegistry, name, definition, lambda: seqio.MixtureRegistry.add(
        name, [(tasks[m], rates[m]) for m in sorted(tasks)], mixture_cls=XlmMixture,
        xlm_jax_kind=kind, xlm_jax_definition=definition))


# ----------------------------------------------------------------------------- monolingual

@_replayable
def register_monolingual(
    name_prefix: str,
    data_dir: str,
    languages: Sequence[str],
    vocab: VocabLike,
    sequence_length: int = 512,
    alpha: float = sampling.ALPHA_XLMR,
    *,
    kind: str = "mono",
    language_list: Optional[Sequence[str]] = None,
    rate_by: str = "tokens",
    shuffle_buffer_size: int = 1000,
    prepared_dir: Optional[str] = None,
) -> Registration:
    """Registers CC-100 style corpora `{data_dir}/{lang}.txt[.xz|.gz]` (or the files of
    `{data_dir}/{lang}/`, `sources.find_monolingual_files`), one Task per language.

    kind: a kind with `from_documents` (`features.EXAMPLE_KINDS`): "mono" (full-length
      segments) or "split_pair" (adjacent segments x, y).
    sequence_length: segment length T used when the dataset is requested without one.
    language_list: the `lang_ids` table (`language_index`); default `default_language_list()`.
    prepared_dir: read the tasks from what `data.prepared.prepare` wrote there (`PREPARED/TASK/`)
      instead of the files, whatever a run chooses (default: what the run building the
      datasets chooses, `select_prepared`; see `data.prepared.choice`).
    Raises: FileNotFoundError for a missing language file (naming the path and the languages
    found), ValueError for an empty file, an unknown language code or alpha <= 0,
    `shard_files.PreparedError` for prepared data that does not match.
    """
    record = _check_common(name_prefix, alpha, rate_by, kind, "register_monolingual",
                           "from_documents")
    kind = record.name
    if not languages:
        raise ValueError(f"register_monolingual({name_prefix!r}): no languages given")
    if len(set(languages)) != len(languages):
        raise ValueError(f"register_monolingual({name_prefix!r}): duplicate languages in "
                         f"{list(languages)}")
    language_list = list(language_list or default_language_list())
    lang_ids = _check_languages(languages, language_list)
    vocab = _as_vocab(vocab)
    data_dir = os.fspath(data_dir)
    cache = StatsCache(data_dir)

    root = choice.root_for(prepared_dir, [f"{name_prefix}_{lang}" for lang in languages])
    vocab_fp = vocab_fingerprint(vocab)
    paths, stats, ready = {}, {}, {}
    for lang in languages:
        name = f"{name_prefix}_{lang}"
        if root:  # the raw files are optional then: a pod host may hold only the prepared data
            paths[lang] = _optional_file(lambda lang=lang: sources.find_monolingual_files(
                data_dir, lang))
            ready[lang] = prepared_source.load_task(root, name, "documents", vocab_fp,
                                             {lang: paths[lang]})
            stats[lang] = ready[lang].stats(lang)
            continue
        paths[lang] = sources.find_monolingual_files(data_dir, lang)
        stats[lang] = _sizes(cache, paths[lang], vocab, "mono",
                             lambda p=paths[lang]: sources.count_monolingual(p, vocab.encode))
    rates = _rates(stats, rate_by, alpha)

    segment_fn = record.from_documents.load()
    features = _features(vocab, record, len(language_list))
    tasks, task_defs = {}, {}
    for lang in languages:
        name = f"{name_prefix}_{lang}"
        definition = {"kind": kind, "lang_id": lang_ids[lang],
                      "languages": _digest(language_list), "sequence_length": sequence_length,
                      "shuffle_buffer_size": shuffle_buffer_size}
        preprocessors = [prep.bind(segment_fn, default_length=sequence_length),
                         prep.bind(prep.add_task_name, name=name)]
        if root:
            definition.update(prepared=root, digest=ready[lang].digest)
            source, corpora = prepared_source.source(ready[lang], lang, [lang_ids[lang]]), ()
        else:
            definition.update(file=file_key(paths[lang], vocab_fp, "mono"),
                              paths=[corpus_fs.abspath(p) for p in paths[lang]])
            source = sources.monolingual_source(paths[lang], lang_ids[lang],
                                                stats[lang] and stats[lang].examples)
            preprocessors.insert(0, prep.bind(prep.tokenize, keys={"lines": "tokens"}))
            corpora = (pf.Corpus(lang, "documents", tuple(paths[lang])),)
        _add(seqio.TaskRegistry, name, definition, lambda n=name, s=source, d=definition,
             pp=preprocessors, c=corpora: seqio.TaskRegistry.add(
                 n, source=s, output_features=features, preprocessors=pp, task_cls=XlmTask,
                 shuffle_buffer_size=_buffer(s, shuffle_buffer_size), xlm_jax_kind=kind,
                 xlm_jax_definition=d, xlm_jax_languages=language_list, xlm_jax_corpora=c))
        tasks[lang], task_defs[lang] = name, definition
    _register_mixture(name_prefix, kind, tasks, rates, task_defs)
    return Registration(name_prefix, kind, tasks, rates, stats)


def _buffer(source: Any, shuffle_buffer_size: int) -> Optional[int]:
    """A Task's shuffle buffer: none over a source that permutes the whole corpus itself (a
    `PreparedSource`), whose position then saves as a few integers (`data.pipeline`);
    `shuffle_buffer_size` over anything else. Our choice, as grain reads a globally shuffled
    source without a buffer: a prepared document's segments come out one after another."""
    return None if getattr(source, "performs_internal_shuffling", False) else shuffle_buffer_size


def _optional_file(find: Callable[[], Any]) -> Any:
    """What `find` finds, or None when the file is not there."""
    try:
        return find()
    except FileNotFoundError:
        return None


def _rates(stats: Mapping[str, Optional[CorpusStats]], rate_by: str, alpha: float
           ) -> dict[str, float]:
    """The alpha-smoothed rates of the members (equal while preparing: nothing is counted)."""
    return sampling.smoothed_rates(
        {m: getattr(st, rate_by) if st else 1 for m, st in stats.items()}, alpha)


def register_tfds_monolingual(
    name_prefix: str,
    tfds_name: str,
    languages: Sequence[str],
    vocab: VocabLike,
    sizes: Optional[Mapping[str, int]] = None,
    sequence_length: int = 512,
    alpha: float = sampling.ALPHA_XLMR,
    *,
    text_key: str = "text",
    split_template: str = "{lang}",
    tfds_data_dir: Optional[str] = None,
    language_list: Optional[Sequence[str]] = None,
    shuffle_buffer_size: int = 1000,
) -> Registration:
    """Registers a TFDS text dataset, one split per language (e.g. `c4/multilingual:3.1.0`).

    Each language reads split `split_template.format(lang=lang)`; an example's `text_key` is
    one document. Rates use `sizes` (examples per language) or, if None, the example counts
    of the TFDS metadata (which needs the prepared dataset in `tfds_data_dir`).
    """
    mono = _check_common(name_prefix, alpha, "examples", "mono", "register_tfds_monolingual",
                         "from_documents")
    language_list = list(language_list or default_language_list())
    lang_ids = _check_languages(languages, language_list)
    vocab = _as_vocab(vocab)
    features = _features(vocab, mono, len(language_list))
    tasks, task_defs, counts = {}, {}, {}
    for lang in languages:
        split = split_template.format(lang=lang)
        source = sources.tfds_source(tfds_name, split, tfds_data_dir)
        counts[lang] = int(sizes[lang]) if sizes and lang in sizes else \
            source.num_input_examples("train")
        name = f"{name_prefix}_{lang}"
        definition = {"kind": "mono", "tfds": tfds_name, "split": split, "text_key": text_key,
                      "lang_id": lang_ids[lang], "languages": _digest(language_list),
                      "sequence_length": sequence_length, "vocab": vocab_fingerprint(vocab)}
        preprocessors = [
            prep.bind(prep.rekey_text, text_key=text_key, lang_id=lang_ids[lang]),
            prep.bind(prep.tokenize, keys={"lines": "tokens"}),
            prep.bind(prep.monolingual_segments, default_length=sequence_length),
            prep.bind(prep.add_task_name, name=name),
        ]
        _add(seqio.TaskRegistry, name, definition, lambda n=name, s=source, d=definition,
             pp=preprocessors: seqio.TaskRegistry.add(
                 n, source=s, output_features=features, preprocessors=pp, task_cls=XlmTask,
                 shuffle_buffer_size=shuffle_buffer_size, xlm_jax_kind="mono",
                 xlm_jax_definition=d, xlm_jax_languages=language_list))
        tasks[lang], task_defs[lang] = name, definition
    rates = sampling.smoothed_rates(counts, alpha)
    _register_mixture(name_prefix, "mono", tasks, rates, task_defs)
    stats = {lang: CorpusStats(examples=counts[lang], tokens=0, lines=0, bytes=0)
             for lang in languages}
    return Registration(name_prefix, "mono", tasks, rates, stats)


# ----------------------------------------------------------------------------- parallel

def _parse_pair(pair: Union[str, Sequence[str]]) -> tuple[str, str]:
    if isinstance(pair, str):
        parts = pair.split("-")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"invalid language pair {pair!r}: expected 'src-tgt', e.g. 'en-fr'")
        return parts[0], parts[1]
    if len(pair) != 2:
        raise ValueError(f"invalid language pair {pair!r}: expected (src, tgt)")
    return str(pair[0]), str(pair[1])


@_replayable
def register_parallel(
    name_prefix: str,
    data_dir: str,
    pairs: Sequence[Union[str, Sequence[str]]],
    vocab: VocabLike,
    sequence_length: int = 256,
    alpha: float = sampling.ALPHA_XLMR,
    *,
    kind: str = "pair",
    language_list: Optional[Sequence[str]] = None,
    max_side_length: int = 128,
    max_total_length: int = 256,
    random_order: bool = True,
    rate_by: str = "tokens",
    shuffle_buffer_size: int = 1000,
    prepared_dir: Optional[str] = None,
) -> Registration:
    """Registers OPUS/Moses (`{src}-{tgt}.{src|tgt}`) or TSV corpora, one Task per pair.

    kind: a kind with `from_pairs` (`features.EXAMPLE_KINDS`): "pair" (`<s> a </s></s> b
      </s>`, packed), "split_pair" (x = one side, y = the other) or "mixup_pair" (InfoXLM
      XLCo; needs >= 2 pairs). A kind that `mixes_corpora` (mixup_pair) registers a single
      Task named `{prefix}` (no Mixture): each example joins a pair of corpus c ~ the
      alpha-smoothed rates with a pair of another corpus d (`sources.mixup_source`), so no
      example belongs to one pair.
    pairs: "src-tgt" strings or (src, tgt) tuples; task names are `{prefix}_{src}_{tgt}`.
    max_side_length / max_total_length: per-side and total truncation (with specials).
    prepared_dir: as in `register_monolingual`.
    Raises: FileNotFoundError for a missing pair, ValueError for files with different line
    counts (naming both files and counts), an empty corpus, an unknown language or alpha <= 0.
    """
    record = _check_common(name_prefix, alpha, rate_by, kind, "register_parallel",
                           "from_pairs")
    kind = record.name
    prep.check_pair_limits(max_side_length, max_total_length)
    if not pairs:
        raise ValueError(f"register_parallel({name_prefix!r}): no language pairs given")
    parsed = [_parse_pair(p) for p in pairs]
    if len(set(parsed)) != len(parsed):
        raise ValueError(f"register_parallel({name_prefix!r}): duplicate pairs in {list(pairs)}")
    if record.mixes_corpora and len(parsed) < 2:
        raise ValueError(f"register_parallel({name_prefix!r}, kind={kind!r}) needs >= 2 pairs "
                         f"(the mixup partner comes from another corpus), got {len(parsed)}")
    language_list = list(language_list or default_language_list())
    lang_ids = _check_languages(sorted({x for p in parsed for x in p}), language_list)
    vocab = _as_vocab(vocab)
    data_dir = os.fspath(data_dir)
    cache = StatsCache(data_dir)

    members = [f"{src}-{tgt}" for src, tgt in parsed]
    task_names = {m: name_prefix if record.mixes_corpora else
                  f"{name_prefix}_{m.replace('-', '_')}" for m in members}
    root = choice.root_for(prepared_dir, sorted(set(task_names.values())))
    vocab_fp = vocab_fingerprint(vocab)
    files, stats, ready = {}, {}, {}
    for member in members:
        src, tgt = member.split("-")
        if root:  # the raw files are optional then (see register_monolingual)
            files[member] = _optional_file(
                lambda src=src, tgt=tgt: sources.find_parallel_files(data_dir, src, tgt))
            continue
        files[member] = sources.find_parallel_files(data_dir, src, tgt)
        stats[member] = _sizes(cache, files[member].paths, vocab, "pair",
                               lambda f=files[member]: sources.count_parallel(f, vocab.encode))
    if root:  # a mixup task's members are the corpora of its one prepared task
        groups = ([(name_prefix, members)] if record.mixes_corpora
                  else [(task_names[m], [m]) for m in members])
        for name, group in groups:
            loaded = prepared_source.load_task(root, name, "pairs", vocab_fp,
                                        {m: files[m] and files[m].paths for m in group})
            for m in group:
                ready[m], stats[m] = loaded, loaded.stats(m)
    rates = _rates(stats, rate_by, alpha)

    def pair_source(member):
        ids = [lang_ids[x] for x in member.split("-")]
        if root:
            return prepared_source.source(ready[member], member, ids)
        return sources.parallel_source(files[member], *ids,
                                       stats[member] and stats[member].examples)

    def corpus(member):
        f = files[member]
        return pf.Corpus(member, "pairs", f.paths, f.swapped)

    features = _features(vocab, record, len(language_list))
    tok, build = record.from_pairs(max_side_length, max_total_length, random_order)

    def definition_of(member):
        where = ({"prepared": root, "digest": ready[member].digest} if root
                 else {"files": [corpus_fs.abspath(p) for p in files[member].paths],
                       "key": file_key(files[member].paths, vocab_fp, "pair")})
        return {"kind": kind, **where, "langs": [lang_ids[x] for x in member.split("-")],
                "languages": _digest(language_list), "max_side_length": max_side_length,
                "max_total_length": max_total_length, "random_order": random_order,
                "sequence_length": sequence_length, "shuffle_buffer_size": shuffle_buffer_size}

    def add_task(name, source, definition, corpora):
        preprocessors = [build, prep.bind(prep.add_task_name, name=name)]
        if not root:
            preprocessors.insert(0, prep.bind(prep.tokenize, keys=tok))
        _add(seqio.TaskRegistry, name, definition, lambda: seqio.TaskRegistry.add(
            name, source=source, output_features=features, preprocessors=preprocessors,
            task_cls=XlmTask, shuffle_buffer_size=_buffer(source, shuffle_buffer_size),
            xlm_jax_kind=kind, xlm_jax_definition=definition, xlm_jax_languages=language_list,
            xlm_jax_corpora=() if root else corpora))

    if record.mixes_corpora:
        # One Task: every example spans two corpora, so there is no per-pair task; the
        # corpora are drawn inside the source with the alpha-smoothed rates.
        definition = {"members": {m: definition_of(m) for m in members}, "rates": rates,
                      "prepared": root}
        source = sources.mixup_source([pair_source(m) for m in members],
                                      [rates[m] for m in members], name_prefix)
        add_task(name_prefix, source, definition, [corpus(m) for m in members if not root])
        return Registration(name_prefix, kind, {m: name_prefix for m in members}, rates, stats)
    tasks, task_defs = {}, {}
    for member in members:
        task_defs[member] = definition_of(member)
        add_task(task_names[member], pair_source(member), task_defs[member],
                 [] if root else [corpus(member)])
        tasks[member] = task_names[member]
    _register_mixture(name_prefix, kind, tasks, rates, task_defs)
    return Registration(name_prefix, kind, tasks, rates, stats)


# ----------------------------------------------------------------------------- lookup

def get_provider(name: str) -> Union[seqio.Task, seqio.Mixture]:
    """The registered Task or Mixture `name`, with an error that lists what is registered."""
    if name in seqio.MixtureRegistry.names():
        return seqio.MixtureRegistry.get(name)
    if name in seqio.TaskRegistry.names():
        return seqio.TaskRegistry.get(name)
    known = sorted(set(seqio.MixtureRegistry.names()) | set(seqio.TaskRegistry.names()))
    shown = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
    raise ValueError(
        f"unknown task or mixture {name!r} (registered: {shown or 'none'}); import the module "
        "that registers it first (e.g. xlm_jax_tasks.demo)"
    )


def provider_kind(provider: Union[str, seqio.Task, seqio.Mixture]) -> ExampleKind:
    """The example kind of a Task or Mixture: the one its registration recorded (a Mixture's
    own, else the one all its Tasks share). Our choice: a Task registered without recording
    one is an error, not a guess from its features (mono and pair rows have the same)."""
    if isinstance(provider, str):
        provider = get_provider(provider)
    kind = getattr(provider, "xlm_jax_kind", None)
    if kind:
        return example_kind(kind)
    if not isinstance(provider, seqio.Mixture):
        raise ValueError(f"task {provider.name} records no example kind: register it through "
                         "xlm_jax.data.registry, or with task_cls=registry.XlmTask and "
                         f"xlm_jax_kind=KIND, KIND one of {valid_kinds()}")
    kinds = {t.name: provider_kind(t).name for t in provider.tasks}
    if len(set(kinds.values())) != 1:
        raise ValueError(f"mixture {provider.name}: its tasks have different example kinds "
                         f"({', '.join(f'{t}: {k}' for t, k in sorted(kinds.items()))})")
    return example_kind(next(iter(kinds.values())))


def prepared_root(task: seqio.Task) -> Optional[str]:
    """The prepared directory a Task registered here reads (`prepared_dir`), or None when it
    reads its raw files (or was registered elsewhere)."""
    return (getattr(task, "xlm_jax_definition", None) or {}).get("prepared")


def mixture_rates(name: str) -> dict[str, float]:
    """Normalized sampling rate of every Task of a Mixture (a Task alone has rate 1)."""
    provider = get_provider(name)
    if isinstance(provider, seqio.Task):
        return {provider.name: 1.0}
    rates = {t.name: float(provider.get_rate(t)) for t in provider.tasks}
    total = sum(rates.values())
    return {k: v / total for k, v in rates.items()}
