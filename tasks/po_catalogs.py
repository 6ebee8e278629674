"""Parsing of gettext `.po` catalogs for the demo corpus builder (`tasks/build_demo_corpus.py`).

`parse_po(text)` reads a catalog into `PoEntry`s (strings unescaped, plural and context
entries kept, a malformed line is a ValueError naming file and line); `translated_pairs`
keeps the real translations (no header, fuzzy or empty entries).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable



@dataclasses.dataclass(frozen=True)
class PoEntry:
    """One gettext catalog entry (strings unescaped, as in the file)."""

    msgid: str
    msgstr: str  # msgstr, or msgstr[0] for plural entries
    msgctxt: str | None = None
    msgid_plural: str | None = None
    flags: frozenset[str] = frozenset()
    line: int = 0  # 1-based line of the entry's msgid

    @property
    def is_header(self) -> bool:
        return self.msgid == "" and self.msgctxt is None

    @property
    def is_fuzzy(self) -> bool:
        return "fuzzy" in self.flags


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}
_KEYWORD_RE = re.compile(r'^(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d+)\])?)\s+"(.*)"\s*$')
_CONT_RE = re.compile(r'^"(.*)"\s*$')


def _unescape(s: str, source: str, line: int) -> str:
    def repl(m: re.Match) -> str:
        c = m.group(1)
        if c not in _ESCAPES:
            raise ValueError(f"{source}:{line}: unknown escape \\{c} in .po string")
        return _ESCAPES[c]

    if s.endswith("\\") and not s.endswith("\\\\"):
        raise ValueError(f"{source}:{line}: .po string ends with a lone backslash")
    return re.sub(r"\\(.)", repl, s)


def parse_po(text: str, source: str = "<string>") -> list[PoEntry]:
    """Parses the text of a gettext .po file into entries, in file order.

    Handles msgctxt, multi-line strings, msgid_plural/msgstr[n] (msgstr[0] is kept) and
    `#,` flags; obsolete `#~` entries are ignored. The header and fuzzy entries are returned
    (see `is_header`, `is_fuzzy`) and dropped by `translated_pairs`. A malformed line raises
    ValueError naming `source` and the line number.
    """
    entries: list[PoEntry] = []
    fields: dict[str, str] = {}
    flags: set[str] = set()
    pending_flags: set[str] = set()
    current: str | None = None
    entry_line = 0

    def flush() -> None:
        nonlocal fields, flags, current
        if "msgid" in fields:
            if "msgstr" not in fields:
                raise ValueError(f"{source}:{entry_line}: msgid without msgstr")
            entries.append(PoEntry(
                msgid=fields["msgid"], msgstr=fields["msgstr"], msgctxt=fields.get("msgctxt"),
                msgid_plural=fields.get("msgid_plural"), flags=frozenset(flags), line=entry_line,
            ))
        elif fields:
            raise ValueError(f"{source}:{entry_line}: entry without msgid")
        fields, flags, current = {}, set(), None

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("#,"):
                pending_flags.update(f.strip() for f in line[2:].split(",") if f.strip())
            continue  # comments, references, previous (#|) and obsolete (#~) entries
        m = _KEYWORD_RE.match(line)
        if m:
            keyword, plural_index, value = m.group(1), m.group(2), m.group(3)
            value = _unescape(value, source, lineno)
            if keyword in ("msgctxt", "msgid") and ("msgstr" in fields or
                                                    (keyword == "msgctxt" and "msgid" in fields)):
                flush()
            if keyword in ("msgctxt", "msgid") and not fields:
                flags, pending_flags = pending_flags, set()
            if keyword == "msgid":
                entry_line = lineno
                if "msgid" in fields:
                    raise ValueError(f"{source}:{lineno}: second msgid before a msgstr")
            if plural_index is not None:
                # Only msgstr[0] is kept; the other plural forms are parsed and dropped.
                keyword = "msgstr" if plural_index == "0" else f"msgstr[{plural_index}]"
            elif keyword == "msgstr" and "msgid" not in fields:
                raise ValueError(f"{source}:{lineno}: msgstr without msgid")
            fields[keyword] = value
            current = keyword
            continue
        m = _CONT_RE.match(line)
        if m and current is not None:
            fields[current] += _unescape(m.group(1), source, lineno)
            continue
        raise ValueError(f"{source}:{lineno}: cannot parse .po line: {raw[:60]!r}")
    flush()
    return entries


def translated_pairs(entries: Iterable[PoEntry]) -> list[tuple[str, str]]:
    """(msgid, msgstr) of the real translations: no header, fuzzy or empty-msgstr entries."""
    return [(e.msgid, e.msgstr) for e in entries
            if not e.is_header and not e.is_fuzzy and e.msgstr.strip()]
