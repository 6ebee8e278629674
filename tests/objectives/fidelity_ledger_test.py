"""docs/fidelity.md, the fidelity ledger: it covers MMLM/TLM and the four papers, every file,
name and test it points to exists, and every gin value that a run or objective file marks
"paper" names a table, section, equation, figure or appendix (or says that the paper gives
none: then it is marked our choice or released code)."""
import glob
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LEDGER = os.path.join(ROOT, "docs", "fidelity.md")
CITES = re.compile(r"(Table|§|Eqs?\.|Fig\.|Figure|Appendix|App\.)\s*\S", re.I)
NOT_THE_PAPERS = re.compile(r"our choice|released|our reading|not given|gives none", re.I)


def _ledger() -> str:
    with open(LEDGER, encoding="utf-8") as f:
        return f.read()


def test_the_ledger_has_a_table_per_paper_and_the_effective_weights():
    text = _ledger()
    for heading in ("## MMLM and TLM", "## InfoXLM", "## XLM-E", "## ERNIE-M", "## VECO",
                    "## Effective weights"):
        assert heading in text, heading
    for section in re.split(r"\n## ", text)[1:6]:
        rows = [r for r in section.splitlines() if r.startswith("| ") and "---" not in r]
        assert len(rows) >= 8, section.splitlines()[0]  # a header and its items


def _rows(section: str) -> dict[str, str]:
    """Item -> its row's source column, for the ledger section whose heading starts with
    `section` (e.g. "## VECO")."""
    text = _ledger()
    body = text.split("\n" + section, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and "---" not in line:
            rows[cells[0]] = cells[3]
    return rows


# Statements the papers make (and choices they leave open) that each need a ledger row, with
# what the row's source must say: (section, item, phrases of its source column).
STATEMENTS = [
    ("## MMLM and TLM", "Selection", ("fairseq", "our choice")),
    ("## InfoXLM", "Queue", ("§3.3", "released code", "fill_queue")),
    ("## InfoXLM", "Queue fill", ("our choice", "released code")),
    ("## InfoXLM", "Enqueueing", ("our choice", "micro-batch")),
    ("## InfoXLM", "Projection", ("§3.3", "released code")),
    ("## InfoXLM", "Mixup", ("§3.3",)),
    ("## InfoXLM", "Ablations (Table 7)", ("§4.3", "Table 7")),
    ("## InfoXLM", "-TLM rows' XLCo layer", ("Table 7", "Table 6", "§4.3")),
    ("## InfoXLM", "-Universal; -TLM at layer 8", ("Table 7", "Table 6")),
    ("## InfoXLM", "Pre-LN state", ("our choice", "XLCo on pre-LN models")),
    ("## InfoXLM", "League infoxlm vs xlm", ("our choice",)),
    ("## XLM-E", "Sampling alpha", ("§4.1",)),
    ("## XLM-E", "Vocabulary (Large)", ("Appendix A", "our choice")),
    ("## XLM-E", "Dropout", ("our choice",)),
    ("## XLM-E", "Relative-bias table", ("our choice",)),
    ("## XLM-E", "TRTD selection", ("our choice", "§3.1")),
    ("## XLM-E", "Sampling", ("ELECTRA", "our choice")),
    ("## ERNIE-M", "CAMLM loss", ("CAMLM paragraph", "our choice")),
    ("## ERNIE-M", "BTMLM stage 2 corruption", ("our choice",)),
    ("## ERNIE-M", "Model, steps, batch, lr", ("Table 11", "Table 8", "our choice")),
    ("## ERNIE-M", "Sequence length", ("§4.1",)),
    ("## ERNIE-M", "Dropout", ("Table 11",)),
    ("## ERNIE-M", "Language embeddings", ("§3",)),
    ("## ERNIE-M", "CAMLM passes", ("§4.3", "1.075x", "our reading", "ernie_m_cost_test")),
    ("## ERNIE-M", "BTMLM placeholder layout", ("our reading", "BTMLM paragraph")),
    ("## ERNIE-M", "TLM/CAMLM/BTMLM positions", ("our choice", "§3.3")),
    ("## VECO", "Loss", ("Eq. 8", "our choice")),
    ("## VECO", "IS corruption", ("§2.2",)),
    ("## VECO", "CS-MLM answer", ("our reading", "footnote 3", "§2.2")),
    ("## VECO", "Segment lengths", ("our choice",)),
    ("## VECO", "Sampling alpha", ("§3", "our choice")),
    ("## VECO", "Language embeddings", ("§3",)),
    ("## VECO", "LayerNorm", ("paper",)),
]


@pytest.mark.parametrize("section, item, phrases", STATEMENTS,
                         ids=[f"{s[3:]}: {i}" for s, i, _ in STATEMENTS])
def test_the_ledger_records_the_papers_statements(section, item, phrases):
    rows = _rows(section)
    assert item in rows, f"{section}: no row {item!r}"
    for phrase in phrases:
        assert phrase in rows[item], (section, item, phrase)


def test_the_ledger_cites_sections_the_papers_have():
    """ERNIE-M has no §3.1/§3.2 (its objectives are paragraphs of §3); InfoXLM's ablations are
    §4.3 (§5 is its conclusion); XLM-E's alpha is set where the tasks are registered."""
    for source in _rows("## ERNIE-M").values():
        assert "§3.1" not in source and "§3.2" not in source, source
    assert not any("§5" in source for source in _rows("## InfoXLM").values())
    with open(os.path.join(ROOT, "gin_configs", "runs", "xlme_base.gin"), encoding="utf-8") as f:
        assert "alpha=0.7" in f.read()


def _pointed(text: str) -> tuple[set[tuple[str, str]], set[tuple[str, str | None]]]:
    """(file, name) pairs of `path.py:Name[.attr]` and (test file, test) of
    `tests/x.py[::test]` in backticks."""
    code = set(re.findall(r"`(xlm_jax/[\w/]+\.py):(\w+)", text))
    tests = {(f, t or None) for f, t in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)}
    return code, tests


def test_every_file_name_and_test_in_the_ledger_exists():
    code, tests = _pointed(_ledger())
    assert len(code) >= 12 and len(tests) >= 30
    for path, name in sorted(code):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert re.search(rf"^\s*(def|class) {name}\b", f.read(), re.M), f"{path}:{name}"
    for path, name in sorted(tests, key=str):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            body = f.read()
        if name:
            assert re.search(rf"^def {name}\(", body, re.M), f"{path}::{name}"
    for path in re.findall(r"`(gin_configs/[\w/]+\.gin)`", _ledger()):
        assert os.path.isfile(os.path.join(ROOT, path)), path


def _paper_values(path: str) -> list[tuple[int, str]]:
    """(line number, line) of every value line whose comment mentions the paper but cites
    nothing and does not say the value is someone else's."""
    bad = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            code, _, comment = line.partition("#")
            if not code.strip() or not re.search(r"\bpapers?\b", comment):
                continue
            if not CITES.search(comment) and not NOT_THE_PAPERS.search(comment):
                bad.append((i, line.rstrip()))
    return bad


GIN_FILES = sorted(glob.glob(os.path.join(ROOT, "gin_configs", "runs", "**", "*.gin"),
                             recursive=True)
                   + glob.glob(os.path.join(ROOT, "gin_configs", "objectives", "*.gin")))


@pytest.mark.parametrize("path", GIN_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_run_file_values_marked_paper_cite_a_table_or_section(path):
    assert not _paper_values(path)


def test_the_check_finds_a_value_that_says_paper_without_a_citation(tmp_path):
    f = tmp_path / "x.gin"
    f.write_text("A = 1  # paper Table 3\nB = 2  # as in the paper\nC = 3  # our choice; the "
                 "paper gives none\n# the paper, in a comment line\n")
    assert _paper_values(str(f)) == [(2, "B = 2  # as in the paper")]
