"""Builds the small, real, multilingual demo corpus in `tasks/demo_data` from gettext catalogs.

The text is the user-interface strings of Django and Wagtail: each `locale/{code}/LC_MESSAGES/
*.po` file inside their wheels pairs an English source string (msgid) with its human
translation (msgstr), so one download gives monolingual text in ~90 languages, English-centred
parallel data, and a held-out retrieval test set, all under BSD licences. Get the wheels with

    pip download --no-deps django==5.2.19 wagtail==8.0.1 -d wheels/
    python -m xlm_jax_tasks.build_demo_corpus --wheels wheels/ --out tasks/demo_data

run from the repository root (`tasks` is a plain package there, not an installed one).

Choices (also written to the generated README.md):
  * Language codes are normalised to the part before `_` (pt_BR -> pt, zh_Hans -> zh,
    he_IL -> he, sr_Latn -> sr); English variants (en_GB, ...) are dropped since the msgids
    already are English. Monolingual files keep every variant's strings; a parallel or
    Tatoeba pair takes one translation per English string, from the preferred variant
    (the bare code first, zh_Hans before zh_Hant, then sorted).
  * Placeholders are stripped (see `strip_placeholders`), whitespace collapsed. An entry is
    kept when its English string has >= 2 words and >= 8 characters and its translation is
    non-empty, not equal to the English, and >= 2 characters long (no word rule there: zh, ja,
    th, ... do not separate words). Header, fuzzy and obsolete entries are skipped; plural
    entries use msgid and msgstr[0].
  * Held out globally: the English strings of the Tatoeba split, their translations in every
    language, and any line equal to one of them never occur in the mono/parallel files.
  * Output: mono/{lang}.txt.xz (CC-100 layout: one string per line, one document per .po file,
    documents separated by a blank line, English from the `en` catalogs' msgids),
    parallel/en-{xx}.{en,xx}.xz (line aligned), tatoeba/tatoeba.{xx}-eng.{xx,eng} (plain
    text; {xx} is our code, as in the file names above), spm.model/.vocab (8000 pieces, trained
    by `xlm_jax.data.train_spm` on the mono files), stats.json, README.md, licences.
Everything is sorted and seeded, so the same wheels give byte-identical files.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import lzma
import os
import re
import sys
import zipfile
from typing import Iterable, Sequence

from xlm_jax import cli_help
from xlm_jax.data import sampling

__all__ = [
    "PoEntry",
    "parse_po",
    "translated_pairs",
    "strip_placeholders",
    "normalize_language",
    "keep_english",
    "keep_translation",
    "Catalog",
    "read_wheel_catalogs",
    "build",
    "main",
]

# The versions the committed data was built from.
PINNED_WHEELS = ("django==5.2.19", "wagtail==8.0.1")
SPM_VOCAB_SIZE = 8000
SPM_SENTENCES = 300_000
TATOEBA_MIN_PAIRS = 200
TATOEBA_MAX_PAIRS = 300
TATOEBA_REQUIRED = ("ru", "ar", "zh", "ja", "hi", "el", "he")
# The Tatoeba split covers the languages of XTREME's Tatoeba task that have enough pairs here.
XTREME_TATOEBA = frozenset(
    "af ar bg bn de el es et eu fa fi fr he hi hu id it ja jv ka kk ko ml mr nl pt ru sw ta te "
    "th tl tr ur vi zh".split())
HELDOUT_SIZE = 300
MIN_LINES = 20  # languages/pairs with fewer kept lines are left out of mono/parallel

from xlm_jax_tasks.po_catalogs import PoEntry, parse_po, translated_pairs  # noqa: E402,F401  (re-exported)


# ----------------------------------------------------------------------------------------------
# Cleaning

_PLACEHOLDER_RES = [
    re.compile(r"\{\{.*?\}\}", re.S),  # {{ template var }}
    re.compile(r"\{%.*?%\}", re.S),  # {% template tag %}
    re.compile(r"%\([^)]*\)[-+#0]*\d*(?:\.\d+)?[a-zA-Z]?"),  # %(name)s, %(n).2f
    re.compile(r"%(?:\d+\$)?[-+#0]*\d*(?:\.\d+)?[sdifFeEgGxXocru]"),  # %s %d %1$s %.2f
    re.compile(r"\$\{[^{}]*\}"),  # ${x} (JavaScript templates)
    re.compile(r"\{[^{}]*\}"),  # {x} {0} {count}
    re.compile(r"<!--.*?-->|<\s*/?\s*[^\s<>=/][^<>]*>", re.S),  # HTML tags (even translated)
    re.compile(r"<\s*/?\s*[a-zA-Z]+\s*$"),  # a tag cut off at the end of the string
    re.compile(r"&(?:[a-zA-Z][a-zA-Z0-9]*|#\d+|#[xX][0-9a-fA-F]+);"),  # &amp; &nbsp; &#39;
]
# Brackets and quotes left empty once a placeholder is gone: "(%s)" -> "()" -> "".
_EMPTY_PAIRS_RE = re.compile(r"\(\s*\)|\[\s*\]|\"\s*\"|“\s*”|„\s*“|«\s*»|「\s*」|『\s*』|‘\s*’|'\s*'")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,;:!?…)\]])")
_SPACE_AFTER_OPEN_RE = re.compile(r"([(\[])\s+")
# What must never survive (checked by the tests over every committed file).
LEFTOVER_RE = re.compile(
    r"%\(|%[sd]\b|\{|\}|\\|<\s*/?\s*[^\s<>=/][^<>]*>|"
    r"&(?:[a-zA-Z][a-zA-Z0-9]*|#\d+|#[xX][0-9a-fA-F]+);")


def strip_placeholders(text: str) -> str:
    """Removes format placeholders, template tags, HTML tags/entities; collapses whitespace.

    `%s %d %(name)s {x} {{ x }} {% tag %} ${x} <b> &amp; &nbsp;` are all removed (an entity is
    removed, not decoded, so `&lt;b&gt;` cannot turn into a tag; tags with translated names
    such as `<코드>` go too), `%%` becomes `%`, stray braces and backslashes are dropped,
    brackets/quotes left empty are removed, and whitespace (including escaped newlines)
    collapses to single spaces, without a space before closing punctuation.
    """
    s = text
    for pattern in _PLACEHOLDER_RES:
        s = pattern.sub(" ", s)
    # Stray braces, and backslashes left by over-escaped quotes (`\\"` in a .po string).
    s = s.replace("%%", "%").replace("{", " ").replace("}", " ").replace("\\", " ")
    while True:  # nested: “"%(x)s"” -> “""” -> “” -> ""
        s, n = _EMPTY_PAIRS_RE.subn(" ", s)
        if not n:
            break
    s = " ".join(s.split())
    s = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", s)
    s = _SPACE_AFTER_OPEN_RE.sub(r"\1", s)
    return s.strip()


def keep_english(s: str) -> bool:
    """English source strings: >= 2 words and >= 8 characters after stripping."""
    return len(s) >= 8 and len(s.split()) >= 2


def keep_translation(english: str, translation: str) -> bool:
    """A translation: >= 2 characters and not a copy of the English (untranslated)."""
    return len(translation) >= 2 and translation != english


# Variant preference when one language has several catalogs (lower rank wins).
_VARIANT_FIRST = {"zh": ("zh_Hans", "zh", "zh_Hant")}


def normalize_language(code: str) -> str | None:
    """Normalised language of a locale directory name, or None for English variants.

    `pt_BR` -> `pt`, `zh_Hans` -> `zh`, `he_IL` -> `he`, `sr_Latn` -> `sr`, `es_419` -> `es`;
    `en_GB`/`en_AU`/`en_IN` -> None (the msgids are English already). Raises ValueError
    naming the code if it is not a language code.
    """
    if re.fullmatch(r"[A-Za-z]{2,3}(_[A-Za-z0-9]+)?", code) is None:
        raise ValueError(f"invalid locale directory name {code!r}: expected e.g. 'pt_BR'")
    base = sampling.validate_language_code(code.split("_")[0].lower())
    if base == "en" and code != "en":
        return None
    return base


def _variant_rank(lang: str, code: str) -> tuple[int, str]:
    first = _VARIANT_FIRST.get(lang, (lang,))
    return (first.index(code), "") if code in first else (len(first), code)


# ----------------------------------------------------------------------------------------------
# Reading wheels


@dataclasses.dataclass(frozen=True)
class Catalog:
    """The kept strings of one .po file (one document)."""

    wheel: str  # wheel file name
    path: str  # .po path inside the wheel
    code: str  # locale directory name, e.g. pt_BR
    lang: str  # normalised language, e.g. pt
    pairs: tuple[tuple[str, str], ...]  # (english, translation), cleaned; english-only for `en`

    @property
    def doc_id(self) -> str:
        return f"{self.wheel}:{self.path}"


_LOCALE_RE = re.compile(r"(?:^|/)locale/([^/]+)/LC_MESSAGES/[^/]+\.po$")


def read_wheel_catalogs(wheel_path: str) -> list[Catalog]:
    """Parses and cleans every `locale/*/LC_MESSAGES/*.po` in a wheel, sorted by path."""
    name = os.path.basename(wheel_path)
    catalogs = []
    try:
        zf = zipfile.ZipFile(wheel_path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{wheel_path}: not a readable wheel ({e})") from None
    with zf:
        for path in sorted(zf.namelist()):
            m = _LOCALE_RE.search(path)
            if not m:
                continue
            code = m.group(1)
            lang = normalize_language(code)
            if lang is None:
                continue
            text = zf.read(path).decode("utf-8")
            entries = parse_po(text, source=f"{name}:{path}")
            if lang == "en":
                # Source catalogs: msgstr is empty, the msgids are the English text.
                pairs = []
                for e in entries:
                    if e.is_header or e.is_fuzzy:
                        continue
                    en = strip_placeholders(e.msgid)
                    if keep_english(en):
                        pairs.append((en, en))
            else:
                pairs = []
                for msgid, msgstr in translated_pairs(entries):
                    en, tr = strip_placeholders(msgid), strip_placeholders(msgstr)
                    if keep_english(en) and keep_translation(en, tr):
                        pairs.append((en, tr))
            catalogs.append(Catalog(name, path, code, lang, tuple(pairs)))
    return catalogs


def find_wheels(paths: Sequence[str]) -> list[str]:
    """Expands directories to the `.whl` files in them; sorted by file name."""
    wheels = []
    for p in paths:
        if os.path.isdir(p):
            wheels += [os.path.join(p, n) for n in os.listdir(p) if n.endswith(".whl")]
        elif os.path.isfile(p) and p.endswith(".whl"):
            wheels.append(p)
        else:
            raise ValueError(f"--wheels {p!r} is neither a .whl file nor a directory")
    if not wheels:
        raise ValueError(f"--wheels {list(paths)!r}: no .whl files found")
    return sorted(wheels, key=os.path.basename)


# ----------------------------------------------------------------------------------------------
# Splitting


@dataclasses.dataclass
class Corpus:
    """The split corpus, before writing."""

    mono: dict[str, list[list[str]]]  # lang -> documents -> lines
    parallel: dict[str, list[tuple[str, str]]]  # xx -> (en, xx) pairs
    tatoeba: dict[str, list[tuple[str, str]]]  # xx -> (en, xx) pairs
    heldout_english: frozenset[str]
    skipped: dict[str, str]  # lang -> why it has no mono file


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def split_corpus(catalogs: Sequence[Catalog], heldout_size: int) -> Corpus:
    """Chooses the held-out English strings and splits everything else into mono/parallel.

    The held-out set is the `heldout_size` English strings translated into the most languages
    (ties by hash), so that many languages get >= TATOEBA_MIN_PAIRS test pairs.
    """
    # Preferred translation per (language, English string).
    best: dict[str, dict[str, tuple[tuple, str]]] = collections.defaultdict(dict)
    for order, cat in enumerate(catalogs):
        if cat.lang == "en":
            continue
        rank = _variant_rank(cat.lang, cat.code)
        for i, (en, tr) in enumerate(cat.pairs):
            key = (rank, order, i)
            old = best[cat.lang].get(en)
            if old is None or key < old[0]:
                best[cat.lang][en] = (key, tr)
    # Pairs in order of first appearance of the preferred translation.
    pairs = {lang: [(en, tr) for en, (_, tr) in sorted(d.items(), key=lambda kv: kv[1][0])]
             for lang, d in best.items()}

    coverage = collections.Counter(en for lang in pairs for en, _ in pairs[lang])
    ranked = sorted(coverage, key=lambda en: (-coverage[en], _sha(en)))
    heldout = ranked[:heldout_size]
    heldout_set = frozenset(heldout)
    position = {en: i for i, en in enumerate(heldout)}

    # Tatoeba: held-out pairs, unique on both sides, capped.
    tatoeba: dict[str, list[tuple[str, str]]] = {}
    heldout_targets: dict[str, set[str]] = collections.defaultdict(set)
    for lang in sorted(pairs):
        held = sorted(((en, tr) for en, tr in pairs[lang] if en in heldout_set),
                      key=lambda p: position[p[0]])
        heldout_targets[lang].update(tr for _, tr in held)
        counts = collections.Counter(tr for _, tr in held)
        unique = [(en, tr) for en, tr in held if counts[tr] == 1 and tr not in heldout_set]
        if lang in XTREME_TATOEBA and len(unique) >= TATOEBA_MIN_PAIRS:
            tatoeba[lang] = unique[:TATOEBA_MAX_PAIRS]

    def training_ok(lang: str, line: str) -> bool:
        return line not in heldout_set and line not in heldout_targets[lang]

    parallel = {}
    for lang in sorted(pairs):
        train = [(en, tr) for en, tr in pairs[lang]
                 if en not in heldout_set and training_ok(lang, tr)]
        if len(train) >= MIN_LINES:
            parallel[lang] = train

    mono: dict[str, list[list[str]]] = collections.defaultdict(list)
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for cat in catalogs:
        doc = []
        for en, tr in cat.pairs:
            line = en if cat.lang == "en" else tr
            if en in heldout_set or not training_ok(cat.lang, line) or line in seen[cat.lang]:
                continue
            seen[cat.lang].add(line)
            doc.append(line)
        if doc:
            mono[cat.lang].append(doc)
    skipped = {}
    for lang in sorted(mono):
        n = sum(len(d) for d in mono[lang])
        if n < MIN_LINES:
            skipped[lang] = f"only {n} lines"
            del mono[lang]
    return Corpus(dict(mono), parallel, tatoeba, heldout_set, skipped)


# ----------------------------------------------------------------------------------------------
# Writing


def _write_xz(path: str, lines: Iterable[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    with open(path, "wb") as f:
        f.write(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9))


def _write_text(path: str, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def _copy_license(wheels: Sequence[str], project: str, dest: str) -> str | None:
    for wheel in wheels:
        if not os.path.basename(wheel).lower().startswith(project + "-"):
            continue
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist()
                     if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
            if names:
                with open(dest, "wb") as f:
                    f.write(zf.read(sorted(names)[0]))
                return os.path.basename(wheel)
    return None


def _readme(stats: dict) -> str:
    rows = []
    for lang in sorted(set(stats["mono"]) | set(stats["parallel"]) | set(stats["tatoeba"])):
        rows.append(f"| {lang} | {stats['mono'].get(lang, 0)} | {stats['parallel'].get(lang, '')} "
                    f"| {stats['tatoeba'].get(lang, '')} |")
    wheels = ", ".join(stats["wheels"])
    return f"""# Demo corpus: Django and Wagtail translations

Real multilingual text for the demo and the tests: the user-interface strings of
[Django](https://www.djangoproject.com/) and [Wagtail](https://wagtail.org/) and their
translations by the two projects' volunteer translators, taken from the gettext catalogs
(`locale/*/LC_MESSAGES/*.po`) inside the wheels {wheels}. Both projects are BSD-licensed;
their licences are in `LICENSE-django.txt` and `LICENSE-wagtail.txt`.

## Rebuild

```
pip download --no-deps {' '.join(PINNED_WHEELS)} -d wheels/
python -m xlm_jax_tasks.build_demo_corpus --wheels wheels/ --out tasks/demo_data
```

The build is deterministic: the same wheels give byte-identical files (the SentencePiece model
included).

## Layout

* `mono/{{lang}}.txt.xz` — CC-100 layout: one string per line; one document per `.po` file,
  documents separated by a blank line. English comes from the `en` catalogs' msgids.
* `parallel/en-{{xx}}.en.xz`, `parallel/en-{{xx}}.{{xx}}.xz` — OPUS/Moses layout, line aligned.
* `tatoeba/tatoeba.{{xx}}-eng.{{xx}}`, `tatoeba/tatoeba.{{xx}}-eng.eng` — XTREME Tatoeba layout
  (plain text, line aligned; `{{xx}}` is the code used everywhere here, not ISO 639-3).
  A held-out split: the {stats['heldout_english']} English strings translated into the most
  languages are held out globally — neither they nor any of their translations occur in any
  mono or parallel file. {TATOEBA_MIN_PAIRS}–{TATOEBA_MAX_PAIRS} pairs per language,
  unique on both sides.
* `spm.model`, `spm.vocab` — unigram SentencePiece model, {SPM_VOCAB_SIZE} pieces, XLM-R special
  layout (unk=0, bos=1, eos=2, no pad), trained by `xlm_jax.data.train_spm` on the mono files
  with alpha=0.3 smoothing ({SPM_SENTENCES} sampled sentences).
* `stats.json` — the counts below.

## Cleaning

Language codes are normalised to the part before `_` (`pt_BR`→`pt`, `zh_Hans`/`zh_Hant`→`zh`,
`he_IL`→`he`, `sr_Latn`→`sr`); English variants (`en_GB`, …) are dropped. Mono files keep all
variants' strings (deduplicated); a parallel or Tatoeba pair takes one translation per English
string from the preferred variant (bare code first, `zh_Hans` before `zh_Hant`, then sorted).
Format placeholders (`%s`, `%(name)s`, `{{x}}`, `{{{{ x }}}}`, `{{% tag %}}`), HTML tags and entities
are removed and whitespace collapsed. Kept: English strings with ≥ 2 words and ≥ 8 characters
whose translation is not empty, not a copy of the English, and ≥ 2 characters; header, fuzzy
and obsolete entries are skipped, plurals use `msgstr[0]`; duplicate lines are dropped per
language. Languages with fewer than {MIN_LINES} lines (mono) or pairs (parallel) are left out:
{', '.join(f'{k} ({v})' for k, v in stats['skipped'].items()) or 'none'}.

## Counts

Lines per language (mono: sentences; parallel: training pairs with English; tatoeba: test pairs).
{stats['languages']['mono']} mono languages, {stats['languages']['parallel']} parallel pairs,
{stats['languages']['tatoeba']} Tatoeba languages.

| lang | mono | parallel | tatoeba |
|------|-----:|---------:|--------:|
""" + "\n".join(rows) + "\n"


def build(wheels: Sequence[str], out: str, heldout_size: int = HELDOUT_SIZE, train_model: bool = True,
          spm_sentences: int = SPM_SENTENCES) -> dict:
    """Builds the corpus from `wheels` into `out`; returns the stats that go to stats.json."""
    wheel_files = find_wheels(wheels)
    catalogs = [c for w in wheel_files for c in read_wheel_catalogs(w)]
    corpus = split_corpus(catalogs, heldout_size)
    missing = [lang for lang in TATOEBA_REQUIRED if lang not in corpus.tatoeba]
    if missing:
        raise ValueError(f"tatoeba split: languages {missing} have < {TATOEBA_MIN_PAIRS} "
                         f"held-out pairs with heldout_size={heldout_size}")

    for sub in ("mono", "parallel", "tatoeba"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
        for name in os.listdir(os.path.join(out, sub)):  # stale data files of an older build
            if name.endswith(".xz") or name.startswith("tatoeba."):
                os.remove(os.path.join(out, sub, name))
    for lang, docs in sorted(corpus.mono.items()):
        lines: list[str] = []
        for i, doc in enumerate(docs):
            lines += ([""] if i else []) + doc
        _write_xz(os.path.join(out, "mono", f"{lang}.txt.xz"), lines)
    for lang, pairs in sorted(corpus.parallel.items()):
        _write_xz(os.path.join(out, "parallel", f"en-{lang}.en.xz"), [en for en, _ in pairs])
        _write_xz(os.path.join(out, "parallel", f"en-{lang}.{lang}.xz"), [tr for _, tr in pairs])
    for lang, pairs in sorted(corpus.tatoeba.items()):
        base = os.path.join(out, "tatoeba", f"tatoeba.{lang}-eng")
        _write_text(f"{base}.{lang}", [tr for _, tr in pairs])
        _write_text(f"{base}.eng", [en for en, _ in pairs])

    licences = {p: _copy_license(wheel_files, p, os.path.join(out, f"LICENSE-{p}.txt"))
                for p in ("django", "wagtail")}
    stats = {
        "wheels": [os.path.basename(w) for w in wheel_files],
        "licences": licences,
        "heldout_english": len(corpus.heldout_english),
        "languages": {"mono": len(corpus.mono), "parallel": len(corpus.parallel),
                      "tatoeba": len(corpus.tatoeba)},
        "mono": {k: sum(len(d) for d in v) for k, v in sorted(corpus.mono.items())},
        "mono_documents": {k: len(v) for k, v in sorted(corpus.mono.items())},
        "parallel": {k: len(v) for k, v in sorted(corpus.parallel.items())},
        "tatoeba": {k: len(v) for k, v in sorted(corpus.tatoeba.items())},
        "skipped": corpus.skipped,
    }
    with open(os.path.join(out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(_readme(stats))
    if train_model:
        from xlm_jax.data import train_spm  # pylint: disable=g-import-not-at-top

        train_spm.train_spm(os.path.join(out, "mono"), os.path.join(out, "spm"),
                            vocab_size=SPM_VOCAB_SIZE, alpha=sampling.ALPHA_XLMR,
                            sentences=spm_sentences, seed=0, num_threads=1)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli_help.Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", nargs="+", required=True,
                        help="wheel files or directories of wheels (django, wagtail)")
    parser.add_argument("--out", required=True, help="output directory, e.g. tasks/demo_data")
    parser.add_argument("--heldout_size", type=int, default=HELDOUT_SIZE,
                        help="English strings held out for the Tatoeba split")
    parser.add_argument("--no_spm", action="store_true", help="skip training spm.model")
    args = parser.parse_args(argv)
    try:
        stats = build(args.wheels, args.out, args.heldout_size, train_model=not args.no_spm)
    except ValueError as e:
        print(f"build_demo_corpus: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats["languages"]), f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
