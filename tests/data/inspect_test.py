"""The inspect CLI (example tables, mixture statistics) and the pipeline benchmark CLI.

The printed tables are checked against independent references: the pieces against the
SentencePiece model itself, and each run of pieces between specials against the corpus
file's own token stream (it must be a contiguous window of it).
"""

import lzma
import os
import random
import re
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
spm = pytest.importorskip("sentencepiece")

from tests.testlib import temp_modules  # noqa: E402
from xlm_jax.data import inspect as data_inspect  # noqa: E402
from xlm_jax.data import pipeline_bench  # noqa: E402

DEMO_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data")
needs_demo = pytest.mark.skipif(not os.path.isfile(os.path.join(DEMO_DIR, "spm.model")),
                                reason="tasks/demo_data not built yet")
ROW = re.compile(r"^\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)$")


def _tables(text):
    """Parses the printed tables: a list (per example) of dicts prefix -> rows."""
    examples = []
    for line in text.splitlines():
        if line.startswith("example "):
            examples.append({})
            prefix = ""
        elif line.strip().startswith("[") and line.strip().endswith("]"):
            prefix = line.strip()[1:-1]
        elif ROW.match(line):
            i, piece, tid, pos, seg, side, lang = ROW.match(line).groups()
            examples[-1].setdefault(prefix, []).append(
                (int(i), piece, int(tid), int(pos), int(seg), int(side), lang))
    return examples


@needs_demo
def test_task_tables_match_spm_and_the_corpus_stream(capsys):
    assert data_inspect.main(["--task", "demo_mono_en", "--n", "2", "--sequence_length", "24",
                              "--seed", "5"]) == 0
    examples = _tables(capsys.readouterr().out)
    assert len(examples) == 2
    sp = spm.SentencePieceProcessor(model_file=os.path.join(DEMO_DIR, "spm.model"))
    with lzma.open(os.path.join(DEMO_DIR, "mono", "en.txt.xz"), "rt", encoding="utf-8") as f:
        stream = "".join("".join(sp.encode(line, out_type=str)) for line in f if line.strip())
    specials = {0: "<s>", 2: "</s>", 1: "<pad>", 3: "<unk>"}
    for ex in examples:
        rows = ex[""]
        assert len(rows) == 24 and rows[0][1:3] == ("<s>", 0) and rows[-1][1:3] == ("</s>", 2)
        assert [r[3] for r in rows] == list(range(24))  # positions
        assert {r[4] for r in rows} == {1} and {r[5] for r in rows} == {1}  # segment, side
        assert {r[6] for r in rows} == {"en"}
        run = []
        for _, piece, tid, *_ in rows:
            if tid in specials:
                assert piece == specials[tid]
                assert "".join(run) in stream  # a contiguous window of the corpus tokens
                run = []
            else:
                assert piece == sp.id_to_piece(tid - 1)  # fairseq id = spm id + 1
                run.append(piece)


@needs_demo
def test_pair_and_veco_tables(capsys):
    data_inspect.main(["--task", "demo_parallel_en_fr", "--n", "1", "--sequence_length", "64"])
    (ex,) = _tables(capsys.readouterr().out)
    rows = ex[""]
    first_seg = [r for r in rows if r[4] == 1]
    sides = [r[5] for r in first_seg]
    junction = [i for i in range(len(first_seg) - 1)
                if first_seg[i][2] == 2 and first_seg[i + 1][2] == 2][0]
    assert sides == [1] * (junction + 1) + [2] * (len(first_seg) - junction - 1)
    langs = {r[6] for r in first_seg[: junction + 1]}, {r[6] for r in first_seg[junction + 1:]}
    assert {next(iter(langs[0])), next(iter(langs[1]))} == {"en", "fr"}
    data_inspect.main(["--task", "demo_veco_de", "--n", "1", "--sequence_length", "16"])
    (ex,) = _tables(capsys.readouterr().out)
    assert set(ex) == {"x", "y"} and len(ex["x"]) == len(ex["y"]) == 16


@pytest.fixture(scope="module")
def registering_module(tmp_path_factory, train_xlmr_spm):
    """A module `insp_reg` that registers a two-language mixture from temp corpora."""
    root = tmp_path_factory.mktemp("insp")
    rnd = random.Random(0)
    words = {l: [f"{l}{i}" for i in range(10)] for l in ("en", "fr")}
    (root / "spm.txt").write_text(
        "\n".join(" ".join(rnd.choice(words[l]) for _ in range(6)) for l in words
                  for _ in range(80)))
    train_xlmr_spm(root / "spm.txt", root / "spm", 40)
    tokens = {}
    tok = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    for lang, n in (("en", 60), ("fr", 6)):
        docs = [" ".join(rnd.choice(words[lang]) for _ in range(5)) for _ in range(n)]
        (root / f"{lang}.txt").write_text("".join(d + "\n\n" for d in docs))
        tokens[lang] = sum(len(tok.encode(d)) for d in docs) + n
    (root / "insp_reg.py").write_text(textwrap.dedent(f"""
        from xlm_jax.data import registry
        registry.register_monolingual("insp_mix", {str(root)!r}, ["en", "fr"],
                                      {str(root / "spm.model")!r}, alpha=0.5)
    """))
    return {"dir": str(root), "tokens": tokens}


def test_mixture_stats_table(registering_module, seqio_isolated, capsys):
    with temp_modules.importable(registering_module["dir"]):
        assert data_inspect.main(["--mixture", "insp_mix", "--stats", "3000", "--module",
                                  "insp_reg", "--sequence_length", "16"]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), int(m.group(5))) for m in
            re.finditer(r"^\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)\s+(\d+)$", out, re.M)}
    n = registering_module["tokens"]
    total = n["en"] ** 0.5 + n["fr"] ** 0.5
    assert set(rows) == {"insp_mix_en", "insp_mix_fr"}
    for lang in ("en", "fr"):
        expected, observed, _ = rows[f"insp_mix_{lang}"]
        assert expected == pytest.approx(n[lang] ** 0.5 / total, abs=1e-4)
        assert abs(observed - expected) < 0.03
    assert sum(r[2] for r in rows.values()) == 3000


def test_pipeline_bench_cli(registering_module, seqio_isolated, capsys):
    with temp_modules.importable(registering_module["dir"]):
        res = pipeline_bench.main(["--pipeline", "insp_mix", "--module", "insp_reg",
                                   "--batches", "4", "--warmup", "1", "--batch_size", "4",
                                   "--sequence_length", "32"])
    out = capsys.readouterr().out
    assert "pipeline insp_mix: batch 4 x 32, 4 batches" in out and "tokens/s (non-pad)" in out
    assert res.examples_per_s > 0 and res.tokens_per_s > 0 and 0 <= res.pad_fraction < 1
    assert res.tokens_per_s == pytest.approx(res.examples_per_s * 32 * (1 - res.pad_fraction))
    # the same through `python -m xlm_jax.accelerator.bench --pipeline`, whose own --batch_size must
    # reach the pipeline (it once stayed with the training benchmark's parser: batch 32 was timed)
    from xlm_jax.accelerator import bench

    with temp_modules.importable(registering_module["dir"]):
        assert bench.main(["--pipeline", "insp_mix", "--module", "insp_reg", "--batches",
                           "4", "--warmup", "1", "--batch_size", "4",
                           "--sequence_length", "32"]) == 0
    assert "pipeline insp_mix: batch 4 x 32, 4 batches" in capsys.readouterr().out


def test_count_tokens_counts_non_pad_over_all_rows():
    batch = {"x_input_ids": np.array([[0, 5, 2, 1], [0, 2, 1, 1]]),
             "x_positions": np.zeros((2, 4)), "y_input_ids": np.array([[0, 7, 8, 2]] * 2)}
    assert pipeline_bench.count_tokens(batch) == (5 + 8, 16)


def test_cli_errors_are_one_line(capsys):
    with pytest.raises(SystemExit, match="cannot import --module 'no_such_module_xyz'"):
        data_inspect.main(["--task", "x", "--module", "no_such_module_xyz"])
    with pytest.raises(SystemExit, match="cannot import --module 'no_such_module_xyz'"):
        pipeline_bench.main(["--pipeline", "x", "--module", "no_such_module_xyz"])
    assert data_inspect.main(["--task", "nope", "--module", "xlm_jax.data.registry"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: ValueError: unknown task or mixture 'nope'")


def test_task_length_by_default_and_no_cache_in_the_data_folder(tmp_path, monkeypatch, capsys,
                                                               train_xlmr_spm, seqio_isolated):
    """Without --sequence_length the examples are built at the task's registered length, and
    inspecting a corpus writes nothing into its folder (the size cache goes to the cache dir)."""
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "en.txt").write_text("".join(f"word{i} word{i + 1} word{i + 2}\n\n" for i in range(30)))
    train_xlmr_spm(data / "en.txt", tmp_path / "spm", 30)
    (tmp_path / "insp_len_reg.py").write_text(textwrap.dedent(f"""
        from xlm_jax.data import registry
        registry.register_monolingual("insp_len", {str(data)!r}, ["en"],
                                      {str(tmp_path / "spm.model")!r}, sequence_length=24)
    """))
    monkeypatch.setenv("XLM_JAX_STATS_DIR", str(tmp_path / "cache"))
    with temp_modules.importable(str(tmp_path)):
        assert data_inspect.main(["--task", "insp_len", "--n", "1", "--module",
                                  "insp_len_reg"]) == 0
    assert "(kind mono, length 24)" in capsys.readouterr().out
    assert sorted(p.name for p in data.iterdir()) == ["en.txt"]
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_prepared_tasks_are_read_from_the_prepared_directory(tmp_path, seqio_isolated, capsys):
    """issue 55 item 6: `--prepared DIR` shows what a run on prepared data reads. The raw
    German file is removed after the preparation, so the tables can only come from the
    prepared records; each run of pieces is a contiguous window of that file's own tokens."""
    from tests.testlib import prepared_corpus as pc

    root = pc.write(str(tmp_path / "corpus"))
    out = os.path.join(root, "prepared")
    pc.prepare_here(root, out)
    raw = os.path.join(root, "mono", "de.txt")
    sp = spm.SentencePieceProcessor(model_file=pc.SPM)
    with open(raw, encoding="utf-8") as f:
        stream = "".join("".join(sp.encode(line, out_type=str)) for line in f if line.strip())
    os.remove(raw)
    with pc.on_path(root):
        assert data_inspect.main(["--task", "pd_mono_de", "--module", pc.MODULE, "--prepared",
                                  out, "--n", "2", "--sequence_length", "24"]) == 0
    examples = _tables(capsys.readouterr().out)
    assert len(examples) == 2
    for ex in examples:
        rows = ex[""]
        assert rows[0][1:3] == ("<s>", 0) and {r[6] for r in rows} == {"de"}
        runs = _runs(rows)
        assert sum(map(len, runs)) > 20 and all(run in stream for run in runs), runs


def _runs(rows):
    """The runs of pieces between special tokens."""
    run, out = [], []
    for _, piece, tid, *_ in rows:
        if tid <= 3:
            out.append("".join(run))
            run = []
        else:
            run.append(piece)
    return [r for r in out + ["".join(run)] if r]
