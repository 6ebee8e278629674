"""Fine-tuning end to end on small files in the XTREME layout: each task kind learns its split
beyond the majority baseline, the table's arithmetic, exact resume after SIGKILL through the
CLI, and the bad-input errors. The "pre-trained" model is a tiny random one with the demo
corpus's SentencePiece model: what is tested is the fine-tuning machinery, not transfer."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from testlib import cli_run
from testlib.tiny_run import TINY_MODEL
from xlm_jax.finetune import rows as rows_lib
from xlm_jax.finetune import run
from xlm_jax.finetune import tasks as tasks_lib

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

ROOT = cli_run.ROOT
SPM = os.path.join(ROOT, "tasks", "demo_data", "spm.model")
NAMES = ["Anna", "Peter", "Maria", "Jonas", "Lena", "Paul", "Sofia", "Karl"]
CITIES = ["Berlin", "Paris", "Rom", "Madrid", "Wien", "Prag", "Oslo", "Lima"]
FILLER = ["heute", "gestern", "wohnt", "in", "und", "arbeitet", "oft", "gern", "mit", "bei"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny random xlm_jax model directory (what `convert import-hf` writes) with the demo
    SentencePiece model; no training step to compile."""
    import flax.linen
    import jax

    from xlm_jax.convert import hf
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.train import loop

    path = str(tmp_path_factory.mktemp("pretrained"))
    cfg = loop.model_config("tiny", {**TINY_MODEL, "vocab_size": 8002, "max_positions": 130})
    params = flax.linen.meta.unbox(
        Transformer(cfg).init(jax.random.PRNGKey(0), np.ones((1, 8), np.int32))["params"])
    hf.save_xlm_jax(path, cfg, params)
    import shutil

    shutil.copy(SPM, os.path.join(path, "sentencepiece.bpe.model"))
    return path


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _nli_rows(rng, n):
    """A learnable XNLI-format task: the label is set by a keyword of the hypothesis."""
    rows = []
    for _ in range(n):
        label = rng.choice(["entailment", "neutral", "contradiction"])
        word = {"entailment": "ja", "neutral": "vielleicht", "contradiction": "nein"}[label]
        a = " ".join(rng.choice(FILLER, 4))
        b = " ".join(list(rng.choice(FILLER, 2)) + [word] + list(rng.choice(FILLER, 2)))
        rows.append(f"{a}\t{b}\t{label}")
    return rows


def _ner_rows(rng, n):
    """A learnable PAN-X-format task: names are B-PER, cities B-LOC, the rest O."""
    lines = []
    for _ in range(n):
        for _ in range(6):
            kind = rng.integers(3)
            word = (rng.choice(NAMES), "B-PER") if kind == 0 else (
                (rng.choice(CITIES), "B-LOC") if kind == 1 else (rng.choice(FILLER), "O"))
            lines.append(f"{word[0]}\t{word[1]}")
        lines.append("")
    return lines[:-1]


def _qa_file(path, rng, n, prefix):
    """A learnable SQuAD v1.1 file: the answer is the one city of the context."""
    paragraphs = []
    for i in range(n):
        city = rng.choice(CITIES)
        words = list(rng.choice(FILLER + NAMES, 8))
        at = int(rng.integers(len(words)))
        context = " ".join(words[:at] + [city] + words[at:])
        start = context.index(city) if words[:at] == [] else len(" ".join(words[:at])) + 1
        paragraphs.append({"context": context, "qas": [{
            "id": f"{prefix}{i}", "question": "Wo wohnt sie?",
            "answers": [{"text": city, "answer_start": start}]}]})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}, f)


def _data(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "xtreme"
    for split, n in (("train", 200), ("dev", 40), ("test", 60)):
        for lang in ("en", "de"):
            _write(str(root / "xnli" / f"{split}-{lang}.tsv"), _nli_rows(rng, n))
            _write(str(root / "panx" / f"{split}-{lang}.tsv"), _ner_rows(rng, n // 2))
    _qa_file(str(root / "squad" / "train-v1.1.json"), rng, 200, "t")
    _qa_file(str(root / "squad" / "dev-v1.1.json"), rng, 30, "d")
    for lang in ("en", "de"):
        _qa_file(str(root / "xquad" / f"xquad.{lang}.json"), rng, 40, f"x{lang}")
    return str(root)


TASKS = {
    "classification": dict(xtreme_task="xnli", kind="classification", metric="accuracy",
                           max_length=32),
    "tagging": dict(xtreme_task="panx", kind="tagging", metric="f1", max_length=32,
                    labels=("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")),
    "qa": dict(xtreme_task="xquad", train_task="squad", dev_task="squad", kind="qa",
               metric="exact_match", max_length=48, doc_stride=16, max_query_length=12),
}
# What always predicting one answer scores on these files: XNLI's majority label (~1/3 of
# the test rows; 40% bound), span F1 of all-O predictions (0), exact match of a constant
# guess (one city of 8 in a random position: 12.5% at most).
BASELINE = {"classification": 40.0, "tagging": 0.0, "qa": 12.5}
# Steps each kind needs on these files (measured: 71.7 / 87.5 / 87.5 on English at 150 / 100 /
# 150 steps; classification must route the keyword to <s> and learns slowest).
STEPS = {"classification": 150, "tagging": 80, "qa": 120}


@pytest.mark.parametrize("kind", list(TASKS))
def test_each_task_learns_beyond_the_majority_baseline(tmp_path, pretrained, kind):
    task = tasks_lib.FinetuneTask(data_dir=_data(tmp_path), **TASKS[kind])
    steps = STEPS[kind]
    res = run.finetune(str(tmp_path / "ft"), init_from=pretrained, task=task, train_steps=steps,
                       batch_size=16, learning_rate=3e-3, warmup_fraction=0.1, seeds=(1,),
                       eval_every=steps // 2, dropout_rate=0.0, num_devices=1,
                       out=open(os.devnull, "w"))
    for lang in ("en", "de"):
        assert res["languages"][lang]["mean"] > BASELINE[kind] + 20.0, res["languages"]
    # Selection read the dev scores of both checkpoints and picked one of them.
    assert res["selected"][0]["step"] in (steps // 2, steps)
    cached = json.load(open(tmp_path / "ft" / "seed_1" / "eval" /
                            f"{res['selected'][0]['step']}.json"))
    assert set(cached) == {"dev", "test"} and cached["test"]["de"] == res["languages"]["de"]["mean"]
    md_text = open(tmp_path / "ft" / run.RESULTS_MD).read()
    assert "| model | en | de | avg | gap |" in md_text


def test_summary_means_average_and_transfer_gap():
    s = run.summarise([{"de": 50.0, "en": 80.0, "fr": 60.0}, {"de": 40.0, "en": 90.0, "fr": 70.0}])
    assert list(s["languages"]) == ["en", "de", "fr"]  # English first, as the papers' tables
    assert s["languages"]["de"] == {"mean": 45.0, "std": 5.0, "per_seed": [50.0, 40.0]}
    assert s["average"] == pytest.approx((85 + 45 + 65) / 3)
    assert s["transfer_gap"] == pytest.approx(85 - (45 + 65) / 2)
    assert run.summarise([{"de": 1.0}])["transfer_gap"] is None
    table = run.markdown("m", s, "accuracy")
    assert "| m | 85.0 | 45.0 | 65.0 | 65.0 | 30.0 |" in table


class _Tok:
    """Word -> one id per character; enough to check the row layouts by hand."""
    pad_id, bos_id, eos_id, unk_id = 1, 0, 2, 3

    def encode(self, text):
        return [10 + ord(c) - ord("a") for c in text.replace(" ", "")]


def test_pair_and_tagged_rows_by_hand():
    from xlm_jax.data.xtreme_readers import PairExample, TaggedSentence

    rows = rows_lib.pair_rows([PairExample("abc", "de", "1", "en")], _Tok(), 8, ["0", "1"])
    # longest first: "abc" loses its last piece to fit 8 - 4 = 4 pieces
    assert rows.arrays["input_ids"].tolist() == [[0, 10, 11, 2, 2, 13, 14, 2]]
    assert rows.arrays["label"].tolist() == [1]
    tagged = rows_lib.tagged_rows([TaggedSentence(("ab", "c", "dd"), ("B-PER", "O", "O"), "en")],
                               _Tok(), 6, ["O", "B-PER"], lang_id=4)
    assert tagged.arrays["input_ids"].tolist() == [[0, 10, 11, 12, 2, 1]]  # "dd" cut
    assert tagged.arrays["labels"].tolist() == [[-1, 1, -1, 0, -1, -1]]
    assert tagged.arrays["lang_ids"].tolist() == [[4, 4, 4, 4, 4, 0]]
    assert (tagged.arrays["labels"] >= 0).sum(axis=1).tolist() == [2]  # two words kept


def test_epoch_stream_resumes_at_any_step_and_covers_every_row_per_epoch():
    arrays = {"x": np.arange(10)}
    full = [b["x"] for b, _ in zip(rows_lib.epoch_batches(arrays, 4, 7, 0), range(10))]
    late = [b["x"] for b, _ in zip(rows_lib.epoch_batches(arrays, 4, 7, 6), range(4))]
    np.testing.assert_array_equal(np.stack(late), np.stack(full[6:]))
    flat = np.concatenate(full)  # 40 rows = 4 epochs of 10
    for e in range(4):
        assert sorted(flat[e * 10:(e + 1) * 10]) == list(range(10))
    assert not np.array_equal(flat[:10], flat[10:20])  # each epoch is reshuffled


def _cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "xlm_jax.finetune", *args], cwd=ROOT,
                            env=cli_run.env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _task_bindings(data_dir):
    return ["--gin_file=finetune/base.gin", f"--gin.tasks.FinetuneTask.data_dir='{data_dir}'",
            "--gin.tasks.FinetuneTask.xtreme_task='xnli'", "--gin.tasks.FinetuneTask.max_length=32",
            "--gin.run.finetune.train_steps=12", "--gin.run.finetune.batch_size=8",
            "--gin.run.finetune.seeds=(1,)", "--gin.run.finetune.eval_every=4",
            "--gin.run.finetune.log_every=1"]


def test_sigkill_then_rerun_resumes_exactly(tmp_path, pretrained):
    data = _data(tmp_path)
    common = _task_bindings(data) + [f"--init_from={pretrained}"]
    straight = _cli(common + [f"--model_dir={tmp_path / 'straight'}"])
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err
    # The same run parked after step 10 (its step-8 checkpoint written), killed, and rerun.
    killed = _cli(common + [f"--model_dir={tmp_path / 'killed'}",
                            "--gin_file=tests/testlib/stall_at_10.gin"])
    state_dir = tmp_path / "killed" / "seed_1" / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline:
        if state_dir.exists() and '"step": 10' in state_dir.read_text():
            break
        time.sleep(0.5)
    time.sleep(1.0)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    again = _cli(common + [f"--model_dir={tmp_path / 'killed'}"])
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    a = cli_run.state(str(tmp_path / "straight" / "seed_1"))
    b = cli_run.state(str(tmp_path / "killed" / "seed_1"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    ra = json.load(open(tmp_path / "straight" / run.RESULTS_JSON))
    rb = json.load(open(tmp_path / "killed" / run.RESULTS_JSON))
    assert ra["languages"] == rb["languages"] and ra["selected"] == rb["selected"]


def test_bad_inputs_name_what_is_wrong(tmp_path, pretrained):
    data = _data(tmp_path)
    base = dict(data_dir=data, xtreme_task="xnli", max_length=32)
    # a checkpoint step the init_from run does not have, through the CLI (one line, exit 1)
    p = _cli(_task_bindings(data) + [f"--init_from={pretrained}", "--gin.run.finetune.init_step=7",
                                     f"--model_dir={tmp_path / 'x'}"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1 and err.strip().count("\n") == 0
    assert "finetune.init_step=7" in err and "checkpoints: none" in err
    # a test label training never saw
    with open(os.path.join(data, "xnli", "test-de.tsv"), "a", encoding="utf-8") as f:
        f.write("a\tb\tneutral\n")
    with open(os.path.join(data, "xnli", "train-en.tsv"), "w", encoding="utf-8") as f:
        f.write("a\tb\tentailment\nc\td\tcontradiction\n")
    with pytest.raises(ValueError, match=r"labels 'neutral' of .*\(xnli dev, en\) do not occur"):
        tasks_lib.load(tasks_lib.FinetuneTask(**base))
    # a language with no test file
    with pytest.raises(ValueError, match=r"no xnli test file for language 'sw'.*found: de, en"):
        tasks_lib.load(tasks_lib.FinetuneTask(**base, eval_languages=("sw",)))
    # a metric that does not score the kind; an unknown setting
    with pytest.raises(ValueError, match=r"FinetuneTask.metric='f1'.*classification"):
        tasks_lib.FinetuneTask(**base, metric="f1")
    with pytest.raises(ValueError, match=r"FinetuneTask.setting='few_shot'"):
        tasks_lib.FinetuneTask(**base, setting="few_shot")
    # an unknown kind: one line naming it and the kinds (gin adds a line naming its call)
    with pytest.raises(ValueError) as e:
        tasks_lib.FinetuneTask(**{**base, "kind": "ner"})
    assert str(e.value).splitlines()[0] == (
        "FinetuneTask.kind='ner': expected one of classification, tagging, qa")


def test_each_finetune_kind_is_one_record():
    """What run.finetune switches on is the kind's record: its objective name, metrics, head,
    rows and scoring; each kind accepts exactly its own metrics."""
    kinds = tasks_lib.FINETUNE_KINDS
    assert list(kinds) == ["classification", "tagging", "qa"] == list(tasks_lib.KINDS)
    assert len({k.objective for k in kinds.values()}) == len(kinds)
    for name, kind in kinds.items():
        assert tasks_lib.finetune_kind(name) is kind
        assert all(callable(f) for f in (kind.head, kind.rows, kind.score))
        for metric in kind.metrics:
            assert tasks_lib.FinetuneTask(xtreme_task="xnli", data_dir="d", kind=name,
                                          metric=metric).metric == metric


def test_translate_train_all_reads_every_languages_training_file(tmp_path):
    data = _data(tmp_path)
    zero = tasks_lib.load(tasks_lib.FinetuneTask(data_dir=data, xtreme_task="xnli"))
    every = tasks_lib.load(tasks_lib.FinetuneTask(data_dir=data, xtreme_task="xnli",
                                                  setting="translate_train_all"))
    assert list(zero.train) == ["en"] and sorted(every.train) == ["de", "en"]
    assert every.train["de"][0].sentence1 == open(
        os.path.join(data, "xnli", "train-de.tsv"), encoding="utf-8").readline().split("\t")[0]
    assert list(zero.dev) == ["en"]  # selection on English dev
    all_dev = tasks_lib.load(tasks_lib.FinetuneTask(data_dir=data, xtreme_task="xnli",
                                                    select_on="all"))
    assert sorted(all_dev.dev) == ["de", "en"]


def test_mlqa_files_are_scored_with_mlqa_normalisation():
    """A Spanish gold answer "el perro" and the predicted span "perro": SQuAD's normalisation
    keeps the Spanish article (exact match 0), MLQA's drops it (100)."""
    from xlm_jax.data.vocab import XLMRTokenizer
    from xlm_jax.data.xtreme_readers import Answer, QAExample
    from xlm_jax.finetune import evaluate as ev
    from xlm_jax.finetune import qa

    context = "Ayer vi el perro en la calle."
    ex = QAExample("q1", "¿Qué viste?", context, (Answer("el perro", 8),), "es")
    f = qa.featurize([ex], XLMRTokenizer(SPM), max_length=48, doc_stride=16,
                     max_query_length=12, training=False)
    spans = f.context_spans[0]
    begin = context.index("perro")
    first = int(np.flatnonzero(spans[:, 0] == begin)[0])
    last = int(np.flatnonzero(spans[:, 1] == begin + len("perro"))[0])
    start = np.full(f.input_ids.shape, -5.0)
    end = np.full(f.input_ids.shape, -5.0)
    start[0, first], end[0, last] = 5.0, 5.0
    rows = rows_lib.Rows({"input_ids": f.input_ids}, qa_features=f)
    assert ev.score_qa((start, end), rows, [ex], "exact_match") == 0.0
    assert ev.score_qa((start, end), rows, [ex], "exact_match", lang="es") == 100.0


@pytest.mark.parametrize("name", ["xnli", "pawsx", "panx", "udpos", "xquad", "mlqa",
                                  "demo_pawsx"])
def test_each_shipped_task_file_builds_a_valid_task(name):
    """Each finetune gin file binds a FinetuneTask its own checks accept (kind, metric,
    setting) and the run settings `finetune` reads."""
    import gin

    from xlm_jax.train import gin_utils

    gin.clear_config()
    try:
        gin_utils.parse([f"finetune/{name}.gin"], ["XTREME_DIR = '/data/xtreme'"]
                        if name != "demo_pawsx" else [])
        task = gin.get_configurable(tasks_lib.FinetuneTask)()
        steps = gin.query_parameter("run.finetune.train_steps")
        seeds = gin.query_parameter("run.finetune.seeds")
    finally:
        gin.clear_config()
    assert task.xtreme_task == {"demo_pawsx": "pawsx"}.get(name, name)
    assert task.data_dir == ("tasks/demo_data" if name == "demo_pawsx" else "/data/xtreme") or (
        name == "demo_pawsx" and task.data_dir.endswith(os.path.join("tasks", "demo_data")))
    assert steps > 0 and len(seeds) == 3
