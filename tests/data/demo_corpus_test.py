"""Tests for the committed demo corpus (tasks/demo_data) and the builder's parts.

The committed-files tests re-read every file and check the layout, the held-out split and the
cleaning with checks written here (not the builder's own regexes), so a bad rebuild fails.
"""

import io
import json
import lzma
import pathlib
import re
import sys
import zipfile

import pytest

from xlm_jax.data import vocab

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `tasks` is a plain package at the repository root
    sys.path.insert(0, str(REPO))
from xlm_jax_tasks import build_demo_corpus as bdc  # noqa: E402

DATA = REPO / "tasks" / "demo_data"
REQUIRED = ("ru", "ar", "zh", "ja", "hi", "el", "he")

# Independent of the builder: anything that looks like a format placeholder, template syntax,
# an HTML tag or an entity.
PLACEHOLDER = re.compile(
    r"%\(\w*\)|%[-+#0]*\d*(?:\.\d+)?[sdif]\b|%\d+\$|\{\{|\}\}|\{%|%\}|\{\w*\}|\$\{"
    r"|<\s*/?\s*(?:a|b|i|p|br|em|strong|span|code|div|ul|li|kbd|abbr)\b[^>]*>"
    r"|&(?:amp|nbsp|lt|gt|quot|#\d+|#x[0-9a-f]+);",
    re.IGNORECASE,
)


def _xz_lines(path):
    return lzma.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def stats():
    return json.loads((DATA / "stats.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def mono():
    # Only the data files: the seqio registry may cache its counts beside them.
    files = sorted((DATA / "mono").glob("*.txt.xz"))
    return {p.name[: -len(".txt.xz")]: _xz_lines(p) for p in files}


@pytest.fixture(scope="module")
def parallel():
    out = {}
    for p in sorted((DATA / "parallel").glob("en-*.en.xz")):
        xx = p.name[len("en-"): -len(".en.xz")]
        out[xx] = (_xz_lines(p), _xz_lines(DATA / "parallel" / f"en-{xx}.{xx}.xz"))
    return out


@pytest.fixture(scope="module")
def tatoeba():
    out = {}
    for p in sorted((DATA / "tatoeba").glob("tatoeba.*-eng.eng")):
        xx = p.name[len("tatoeba."): -len("-eng.eng")]
        other = DATA / "tatoeba" / f"tatoeba.{xx}-eng.{xx}"
        out[xx] = (p.read_text(encoding="utf-8").split("\n")[:-1],
                   other.read_text(encoding="utf-8").split("\n")[:-1])
    return out


# ------------------------------------------------------------------------ committed files


def test_files_exist_and_size(stats):
    for name in ("README.md", "LICENSE-django.txt", "LICENSE-wagtail.txt", "spm.model",
                 "spm.vocab", "stats.json"):
        assert (DATA / name).is_file(), name
    for name in ("LICENSE-django.txt", "LICENSE-wagtail.txt"):
        assert "Redistribution and use in source and binary forms" in (DATA / name).read_text()
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "django==5.2.19" in readme and "wagtail==8.0.1" in readme
    assert "python -m xlm_jax_tasks.build_demo_corpus" in readme
    base = DATA / "league_base"  # the league's base model, shipped beside the corpus
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file() and base not in p.parents)
    assert total <= 10 * 1024 * 1024, total
    shipped = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
    assert 0 < shipped <= 8 * 1024 * 1024, shipped  # parameters only: a few MB
    expected = {f"{lang}.txt.xz" for lang in stats["mono"]}
    assert {p.name for p in (DATA / "mono").glob("*.xz")} == expected
    expected = {f"en-{xx}.{side}.xz" for xx in stats["parallel"] for side in ("en", xx)}
    assert {p.name for p in (DATA / "parallel").glob("*.xz")} == expected
    expected = {f"tatoeba.{xx}-eng.{side}" for xx in stats["tatoeba"] for side in ("eng", xx)}
    assert {p.name for p in (DATA / "tatoeba").iterdir()} == expected


def test_mono_layout_and_counts(mono, stats):
    assert "en" in mono and len(mono) >= 60
    for lang, lines in mono.items():
        assert lines[0] and lines[-1], f"{lang}: leading/trailing blank line"
        assert all(a or b for a, b in zip(lines, lines[1:])), f"{lang}: double blank line"
        sentences = [s for s in lines if s]
        assert len(sentences) == stats["mono"][lang], lang
        assert lines.count("") + 1 == stats["mono_documents"][lang], lang
        assert len(set(sentences)) == len(sentences), f"{lang}: duplicate lines"
        assert all(s == s.strip() and "  " not in s for s in sentences), lang


def test_parallel_line_aligned(parallel, stats):
    assert set(parallel) == set(stats["parallel"]) and len(parallel) >= 60
    for xx, (en, other) in parallel.items():
        assert len(en) == len(other) == stats["parallel"][xx], xx
        assert all(en) and all(other), f"{xx}: empty line"
        assert len(set(en)) == len(en), f"{xx}: repeated English line"
        assert sum(a == b for a, b in zip(en, other)) == 0, f"{xx}: untranslated pair"


def test_parallel_pairs_are_translations(parallel):
    # Line alignment check on content: an English line and its translation in a language
    # with a non-Latin script must not be in the same script.
    en, ru = parallel["ru"]
    assert en.index("Enter a valid domain name.") == ru.index("Введите правильное имя домена.")
    assert all(re.search("[А-Яа-яЁё]", line) for line in ru[:200])


def test_tatoeba_split(tatoeba, stats):
    assert set(tatoeba) == set(stats["tatoeba"])
    big = {xx for xx, (eng, _) in tatoeba.items() if len(eng) >= 200}
    assert len(big) >= 20 and set(REQUIRED) <= big, sorted(big)
    for xx, (eng, other) in tatoeba.items():
        assert len(eng) == len(other) == stats["tatoeba"][xx] <= 300, xx
        assert all(eng) and all(other), xx
        assert len(set(eng)) == len(eng) and len(set(other)) == len(other), xx


def test_tatoeba_disjoint_from_training(tatoeba, mono, parallel):
    training_lines = set()
    for lines in mono.values():
        training_lines.update(lines)
    for en, other in parallel.values():
        training_lines.update(en)
        training_lines.update(other)
    training_lines.discard("")
    held_english = {line for eng, _ in tatoeba.values() for line in eng}
    assert len(held_english) >= 200
    assert not held_english & training_lines, sorted(held_english & training_lines)[:5]
    for xx, (_, other) in tatoeba.items():
        train_xx = set(mono.get(xx, ())) | set(parallel.get(xx, ((), ()))[1])
        assert not set(other) & train_xx, (xx, sorted(set(other) & train_xx)[:5])


def test_no_placeholders_survive(mono, parallel, tatoeba):
    every = [("mono/" + k, v) for k, v in mono.items()]
    every += [(f"parallel/{k}", en + other) for k, (en, other) in parallel.items()]
    every += [(f"tatoeba/{k}", eng + other) for k, (eng, other) in tatoeba.items()]
    bad = [(name, line) for name, lines in every for line in lines
           if PLACEHOLDER.search(line) or "\\" in line]
    assert not bad, bad[:5]
    # Raw catalogs do contain them, so this check can fail.
    assert PLACEHOLDER.search('Select %(name)s to change <a href="x">{count}</a> &amp;')


def test_spm_model_loads(mono):
    tok = vocab.XLMRTokenizer(str(DATA / "spm.model"))
    assert tok.vocab_size == 8002 and tok.mask_id == 8001
    sample = [line for line in mono["ru"] if line][:50]
    ids = [i for s in sample for i in tok.encode(s)]
    assert ids.count(tok.unk_id) / len(ids) < 0.01


# ------------------------------------------------------------------------ builder units

PO_SNIPPET = r'''# Translation header comment
msgid ""
msgstr ""
"Project-Id-Version: demo\n"
"Language: de\n"

#: views.py:10
#, python-format
msgid ""
"Select %(name)s to "
"change"
msgstr ""
"Wählen Sie %(name)s zum "
"Ändern"

#, fuzzy
msgid "A fuzzy entry here"
msgstr "Ein unscharfer Eintrag"

msgctxt "button"
msgid "Save the page"
msgstr "Seite \"speichern\"\tjetzt"

msgid "%(count)s page was deleted"
msgid_plural "%(count)s pages were deleted"
msgstr[0] "%(count)s Seite wurde gelöscht"
msgstr[1] "%(count)s Seiten wurden gelöscht"

msgid "Not translated yet"
msgstr ""

#~ msgid "Obsolete entry text"
#~ msgstr "Veralteter Eintrag"
'''


def test_parse_po_snippet():
    entries = bdc.parse_po(PO_SNIPPET, "snippet.po")
    assert len(entries) == 6
    header = entries[0]
    assert header.is_header and "Language: de\n" in header.msgstr
    assert entries[1].msgid == "Select %(name)s to change"
    assert entries[1].msgstr == "Wählen Sie %(name)s zum Ändern"
    assert entries[1].flags == frozenset({"python-format"}) and entries[1].line == 9
    assert entries[2].is_fuzzy and not entries[1].is_fuzzy
    assert entries[3].msgctxt == "button" and entries[3].msgstr == 'Seite "speichern"\tjetzt'
    assert entries[4].msgid_plural == "%(count)s pages were deleted"
    assert entries[4].msgstr == "%(count)s Seite wurde gelöscht"
    assert bdc.translated_pairs(entries) == [
        ("Select %(name)s to change", "Wählen Sie %(name)s zum Ändern"),
        ("Save the page", 'Seite "speichern"\tjetzt'),
        ("%(count)s page was deleted", "%(count)s Seite wurde gelöscht"),
    ]


@pytest.mark.parametrize("text, line", [
    ('msgid "a"\nmsgstr "b"\nbogus line\n', 3),
    ('msgid "a"\nmsgid "b"\nmsgstr "c"\n', 2),
    ('msgstr "orphan"\n', 1),
    ('msgid "bad \\q escape"\nmsgstr ""\n', 1),
    ('msgid "no msgstr"\n', 1),
])
def test_parse_po_errors_name_file_and_line(text, line):
    with pytest.raises(ValueError, match=rf"^broken\.po:{line}: "):
        bdc.parse_po(text, "broken.po")


@pytest.mark.parametrize("raw, clean", [
    ("Select %(name)s to change", "Select to change"),
    ("%s of %d selected", "of selected"),
    ("Delete {count} items from {{ site_name }}", "Delete items from"),
    ("{% trans 'x' %}Hello   world", "Hello world"),
    ('Click <a href="%(url)s">here</a>&nbsp;now &amp; then', "Click here now then"),
    ("Page “%(title)s” was saved.", "Page was saved."),
    ("Edit (%(count)s) items", "Edit items"),
    ("100%% done in %1$s seconds", "100% done in seconds"),
    ("Line one\nline two\t tab", "Line one line two tab"),
    ("Ya “\\\"%(name)s\\\"” existe", "Ya existe"),
    ("이 필터를 <코드> 템플릿에", "이 필터를 템플릿에"),
    ("Resultados para « </em", "Resultados para «"),
    ("Title: (A -> Z)", "Title: (A -> Z)"),  # an arrow is not a tag
])
def test_strip_placeholders(raw, clean):
    assert bdc.strip_placeholders(raw) == clean


def test_filters_and_languages():
    assert bdc.keep_english("Save the page") and not bdc.keep_english("Save")
    assert not bdc.keep_english("Go on")  # 5 characters
    assert bdc.keep_translation("Save the page", "保存页面")
    assert not bdc.keep_translation("Save the page", "Save the page")
    assert not bdc.keep_translation("Save the page", "x")
    assert [bdc.normalize_language(c) for c in ("pt_BR", "zh_Hans", "he_IL", "es_419", "sr_Latn",
                                                  "ast", "en", "en_GB")] == [
        "pt", "zh", "he", "es", "sr", "ast", "en", None]
    with pytest.raises(ValueError, match="'de-DE'"):
        bdc.normalize_language("de-DE")


def _po(pairs):
    body = 'msgid ""\nmsgstr ""\n"Language: x\\n"\n\n'
    return body + "".join(f'msgid "{a}"\nmsgstr "{b}"\n\n' for a, b in pairs)


def test_read_wheel_catalogs_and_split(tmp_path, monkeypatch):
    english = [f"Open the page number {i}" for i in range(30)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("app/locale/en/LC_MESSAGES/django.po", _po([(e, "") for e in english]))
        zf.writestr("app/locale/en_GB/LC_MESSAGES/django.po", _po([(e, e + "!") for e in english]))
        zf.writestr("app/locale/zh_Hant/LC_MESSAGES/django.po",
                    _po([(e, f"打開頁面 {i}") for i, e in enumerate(english)]))
        zf.writestr("app/locale/zh_Hans/LC_MESSAGES/django.po",
                    _po([(e, f"打开页面 {i}") for i, e in enumerate(english[:20])]))
        zf.writestr("app/locale/de/LC_MESSAGES/django.po",
                    _po([(e, f"Seite {i} öffnen") for i, e in enumerate(english)]
                        + [("Save", "Speichern")]))
        zf.writestr("app/locale/fr/LC_MESSAGES/django.po",
                    _po([(e, f"Ouvrir la page {i}") for i, e in enumerate(english[:10])]))
        zf.writestr("app/other/file.txt", "not a catalog")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(buf.getvalue())
    catalogs = bdc.read_wheel_catalogs(str(wheel))
    assert [c.code for c in catalogs] == ["de", "en", "fr", "zh_Hans", "zh_Hant"]  # no en_GB
    assert [c.lang for c in catalogs] == ["de", "en", "fr", "zh", "zh"]
    assert len(catalogs[0].pairs) == 30  # "Save" fails the English filter

    monkeypatch.setattr(bdc, "TATOEBA_MIN_PAIRS", 5)
    monkeypatch.setattr(bdc, "MIN_LINES", 1)
    corpus = bdc.split_corpus(catalogs, heldout_size=8)
    assert len(corpus.heldout_english) == 8
    # The 10 strings translated into all three languages rank first.
    assert corpus.heldout_english <= set(english[:10])
    # Preferred variant: zh_Hans where it exists.
    assert all(tr.startswith("打开") for _, tr in corpus.tatoeba["zh"])
    assert len(corpus.tatoeba["de"]) == 8
    # Nothing held out leaks into training: not the English, not the zh_Hant variant.
    held_idx = {english.index(e) for e in corpus.heldout_english}
    for i in held_idx:
        for lines in (corpus.mono["en"], corpus.mono["de"], corpus.mono["zh"]):
            flat = {line for doc in lines for line in doc}
            assert english[i] not in flat and f"打開頁面 {i}" not in flat
    assert len(corpus.parallel["de"]) == 22 and len(corpus.parallel["zh"]) == 22
    assert len(corpus.parallel["fr"]) == 2 and len(corpus.tatoeba["fr"]) == 8
    # Mono keeps both zh variants' non-held-out strings, one document per catalog.
    assert len(corpus.mono["zh"]) == 2


def test_find_wheels_errors(tmp_path):
    with pytest.raises(ValueError, match="no .whl files"):
        bdc.find_wheels([str(tmp_path)])
    with pytest.raises(ValueError, match="nothing.zip"):
        bdc.find_wheels([str(tmp_path / "nothing.zip")])
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad-1.0-py3-none-any.whl: not a readable wheel"):
        bdc.read_wheel_catalogs(str(bad))
