"""Every command of the fenced `bash` blocks of README.md, docs/quickstart.md and
docs/adding_a_corpus.md, as written, so the docs cannot drift from the code (issue 55).

The commands are read from the documents. Each one has an entry in `PLAN` (matched by the
start of the command): run here, from a scratch directory outside the repository, with the
tiny sizes the entry lists (each `(doc text, replacement)` must still be in the command), and
fail on a non-zero exit; or run by another test that reads it from the same document; or not
run in the suite, with the reason. A command the plan does not know, and an entry no
command matches, fail `test_every_documented_command_has_a_plan`: a new or changed command must
be placed on purpose. Paths: `/tmp/...` becomes the scratch directory's `tmp/...`; the
README's repository paths (`tasks/demo_data/...`) resolve through a link to the clone's
`tasks/`; `demo_output/model` (what `make demo` leaves) is the README's trained `/tmp/run`;
the inputs a command names and a user brings (sentences.txt, a BUCC folder, a SQuAD pair, a
corpus folder, an HF export) are written small by `_inputs` before the first command.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.testlib import user_corpus
from tests.testlib.cli_run import ROOT, env

DOCS = ("README.md", "docs/quickstart.md", "docs/adding_a_corpus.md")
WALKTHROUGH = "## Your own corpus, start to finish"  # docs/quickstart.md's section
WALK_TEST = "tests/data/adding_a_corpus_test.py"  # runs that section's commands
TINY_TRAIN = ("--gin.TRAIN_STEPS=100", "--gin.TRAIN_STEPS=2 --gin.BATCH_SIZE=4 --gin.SEQ_LEN=32")
# The README's run also stands in for what `make demo` leaves (demo_output/model, whose
# checkpoint 0 is the untrained model): it keeps its step 0 too.
README_TRAIN = (TINY_TRAIN[0], TINY_TRAIN[1] + " --gin.loop.train.save_initial=True")


@dataclasses.dataclass(frozen=True)
class Run:
    """Run here; `tiny`: (doc text, replacement) pairs, each checked to apply; `slow`: over
    half a minute even at tiny size, run by `make test-slow` only."""

    start: str
    tiny: tuple[tuple[str, str], ...] = ()
    expect: str = ""  # a text its stdout must hold
    slow: bool = False


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    """Run by `test` (which reads it from the same document)."""

    start: str
    test: str


@dataclasses.dataclass(frozen=True)
class NotHere:
    """Not run in the suite, and why."""

    start: str
    why: str


LAYER_2 = ("--layer 8", "--layer 2")  # the README's layer 8 of a base model; the run has 2
PLAN = (
    # README.md, "Two commands"; docs/quickstart.md's first block
    NotHere("make demo", "the demo itself: tests/train/demo_test.py runs it at a small size "
            "(make test-slow); docs/NOTES.md times `make demo` from a fresh clone"),
    NotHere("make test", "the suite itself (what CI runs)"),
    NotHere(". .venv/bin/activate", "a shell's own state"),
    # README.md, "Using it"
    Run("python -m xlm_jax.train --gin_file=demo/mmlm_tlm.gin --model_dir=/tmp/run ",
        (README_TRAIN,), "done: 2 steps"),
    Run("python -m xlm_jax.evaluation.retrieval --checkpoint /tmp/run --tatoeba_dir "
        "tasks/demo_data/tatoeba", (("--layer all", "--layer all --languages de,fr"),),
        "acc@1 (%) per layer"),
    Run("python -m xlm_jax.convert import-hf --hf_dir xlm-roberta-base/ --out /tmp/xlmr_jax"),
    Run("python -m xlm_jax.finetune --gin_file=finetune/demo_pawsx.gin "
        "--init_from=demo_output/model --model_dir=/tmp/transfer",
        (("--model_dir=/tmp/transfer", "--model_dir=/tmp/transfer --gin.run.finetune.train_steps=2 "
          "--gin.run.finetune.seeds=(1,)"),), slow=True),
    Run("python -m xlm_jax.evaluation.metrics squad", (), "exact_match"),
    Run("python -m xlm_jax.embed --model /tmp/xlmr_jax", (LAYER_2,)),
    Run("python -m xlm_jax.accelerator.bench --gin_file=runs/xlmr_base_mmlm.gin --steps 3 "
        "--batch_size 8 --seq_len 128", (("--steps 3 --batch_size 8 --seq_len 128",
                                          "--steps 2 --batch_size 4 --seq_len 32 "
                                          "--gin.SIZE=\"'tiny'\" --no_torch"),)),
    NotHere("python -m xlm_jax.accelerator.bench --gin_file=runs/xlmr_base_mmlm.gin --steps 10 "
            "--batch_size 32 --seq_len 512 --profile_dir", "a GPU's profile (# on a GPU); "
            "tests/accelerator/bench_test.py profiles a tiny step on the CPU"),
    NotHere("python -m xlm_jax.accelerator.bench --table", "every objective at base and large "
            "with transformers beside: tens of minutes on a CPU; bench_test.py runs a tiny table"),
    NotHere("python -m xlm_jax.accelerator.smoke", "every attention backend at base dimensions "
            "(# first on a new GPU/TPU host); tests/accelerator/smoke_test.py runs it small"),
    Run("python -m xlm_jax.accelerator.lower --gin_file=runs/xlme_base.gin --platform tpu",
        (("--seq_len 512", "--seq_len 64 --gin.SIZE=\"'tiny'\""),)),
    Run("python -m xlm_jax.accelerator.compile --gin_file=runs/xlme_base.gin --target v5p:2x2x1",
        (("--seq_len 512", "--seq_len 64 --gin.SIZE=\"'tiny'\""),), slow=True),
    NotHere("make compile-runs", "every run file at its full size on its TPU slice: an hour"),
    Run("python -m xlm_jax.accelerator.bench --pipeline demo_mono", (), "tokens/s", slow=True),
    NotHere("python -m xlm_jax.data.prepared.prepare --tasks demo_mono,demo_parallel",
            "Beam over the whole demo corpus (minutes); the walk-through's prepare runs it "
            "over a small corpus (tests/data/adding_a_corpus_test.py), as do "
            "tests/data/prepare_test.py and the prepared-data tests"),
    NotHere("python -m xlm_jax.data.prepared.verify /tmp/prepared", "needs the preparation above; "
            "tests/data/verify_test.py runs verify"),
    NotHere("python -m xlm_jax.train --gin_file=demo/mmlm_tlm.gin --model_dir=/tmp/run_p",
            "needs the preparation above; tests/train/prepared_train_test.py trains on one"),
    Run("python -m xlm_jax.data.inspect --task demo_parallel --n 3", (), "example 2 of",
        slow=True),
    Run("python -m xlm_jax.data.train_spm --input_dir my_corpus/mono",
        (("--vocab_size 8000", user_corpus.TINY_SPM),)),
    Run("python -m xlm_jax.accelerator.pod_memory --gin_file=runs/xlmr_base_mmlm.gin "
        "--devices 256", slow=True),
    NotHere("python -m xlm_jax.accelerator.pod_memory --gin_file=runs/xlmr_base_mmlm.gin "
            "--target v5p:8x8x4", "compiles XLM-R base for a 256-chip slice with libtpu (minutes); "
            "tests/accelerator/compile/compile_test.py compiles for TPU targets"),
    Run("python -m xlm_jax.evaluation.bucc --checkpoint /tmp/run --bucc_dir bucc2018",
        (LAYER_2,)),
    Run("python -m xlm_jax.evaluation.word_alignment --checkpoint /tmp/run", (LAYER_2,)),
    Run("python -m xlm_jax.translate --gin_file=demo/veco_translate.gin --model_dir=/tmp/translate",
        (("--model_dir=/tmp/translate", "--model_dir=/tmp/translate --gin.TRAIN_STEPS=2 "
          "--gin.BATCH_SIZE=4 --gin.SIZE=\"'tiny'\""),), slow=True),
    NotHere("python -m xlm_jax.demo", "what make demo runs (above)"),
    NotHere("python -m xlm_jax.league", "every recipe over seeds: hours; tests/league/ runs "
            "a small league"),
    # docs/quickstart.md
    Run("python -m xlm_jax.train --gin_file=my_run.gin --model_dir=/tmp/run",
        (("--gin.TRAIN_STEPS=1000", TINY_TRAIN[1]),), "done: 2 steps", slow=True),
    Elsewhere("python -m xlm_jax.data.train_spm --input_dir mono", WALK_TEST),
    Elsewhere("python -m xlm_jax.data.inspect --module my_tasks", WALK_TEST),
    Elsewhere("python -m xlm_jax.train --gin_file=demo/mmlm_tlm.gin --model_dir=run ",
              WALK_TEST),
    Elsewhere("python -m xlm_jax.evaluation.retrieval --checkpoint run ",
              WALK_TEST),
    Elsewhere("python -m xlm_jax.data.prepared.prepare --module my_tasks",
              WALK_TEST),
    Elsewhere("python -m xlm_jax.train --gin_file=demo/mmlm_tlm.gin --model_dir=run_prepared",
              WALK_TEST),
    Elsewhere("python -m xlm_jax.convert export-hf --checkpoint run --out run_hf",
              WALK_TEST),
    Run("python -m xlm_jax.accelerator.bench --gin_file=runs/xlme_base.gin --gin.SIZE=\"'tiny'\"",
        (("--batch_size 8 --seq_len 64", "--batch_size 4 --seq_len 32"),), slow=True),
    Run("python -m xlm_jax.convert export-hf --checkpoint /tmp/run --out /tmp/run_hf",
        (("[--step N]", ""),)),
    Run("python -m xlm_jax.convert import-hf --hf_dir /tmp/run_hf --out /tmp/run_again"),
    Run("python -m xlm_jax.finetune --gin_file=finetune/demo_pawsx.gin "
        "--init_from=demo_output/model --model_dir=/tmp/transfer0",
        (("--gin.run.finetune.init_step=0", "--gin.run.finetune.init_step=0 "
          "--gin.run.finetune.train_steps=2 --gin.run.finetune.seeds=(1,)"),), slow=True),
    NotHere("python -m xlm_jax.finetune --gin_file=finetune/xnli.gin", "XNLI from an XTREME "
            "download (/data/xtreme), which the suite cannot fetch; tests/finetune/ runs every "
            "task on small files of the same layout"),
    NotHere("python -m xlm_jax.finetune --gin_file=finetune/pawsx.gin", "PAWS-X prepared with "
            "`tfds build` (a download); tests/finetune/ reads TFDS-layout files it writes"),
)


def _blocks(doc: str) -> list[tuple[str, str]]:
    """(the heading it sits under, text) of each fenced bash block of `doc`."""
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    out, heading = [], ""
    for part in re.split(r"^(```[a-z]*\n.*?^```)$", text, flags=re.S | re.M):
        if part.startswith("```bash\n"):
            out.append((heading, part[len("```bash\n"):-3]))
        else:
            headings = re.findall(r"^#+ .*$", part, re.M)
            heading = headings[-1] if headings else heading
    return out


def doc_commands() -> list[tuple[str, str, str]]:
    """(document, heading, command) of every command, continuations joined, comments off."""
    out = []
    for doc in DOCS:
        for heading, block in _blocks(doc):
            for line in block.replace("\\\n", " ").splitlines():
                command = " ".join(shlex.split(line, comments=True)) if line.strip() else ""
                if command:
                    out.append((doc, heading, _normal(line)))
    return out


def _normal(line: str) -> str:
    """The line without its comment, spaces collapsed, quoting as written."""
    text = line.split("   #")[0].split("  #")[0].split(" # ")[0]
    return " ".join(text.split())


def plan_of(command: str) -> list:
    """The entries whose start `command` begins with, the longest (most specific) only."""
    found = [p for p in PLAN if command.startswith(p.start) or command == p.start.strip()]
    longest = max((len(p.start) for p in found), default=0)
    return [p for p in found if len(p.start) == longest]


def test_every_documented_command_has_a_plan():
    commands = doc_commands()
    assert len(commands) >= 40, len(commands)
    for doc, heading, command in commands:
        found = plan_of(command)
        assert len(found) == 1, f"{doc} ({heading}): {command!r} matches {len(found)} entries"
        entry = found[0]
        if isinstance(entry, Run):
            for doc_text, _ in entry.tiny:
                assert doc_text in command, (command, doc_text)
        if isinstance(entry, Elsewhere):
            assert heading == WALKTHROUGH and os.path.isfile(os.path.join(ROOT, entry.test))
    used = {id(p) for _, _, c in commands for p in plan_of(c)}
    assert [p.start for p in PLAN if id(p) not in used] == []  # no entry outlives its command
    runs = [plan_of(c)[0] for _, _, c in commands if isinstance(plan_of(c)[0], Run)]
    ran = f"{sum(not r.slow for r in runs)} + {sum(r.slow for r in runs)} (make test-slow)"
    print(f"{len(commands)} documented commands: {ran} run here, "
          f"{sum(isinstance(plan_of(c)[0], Elsewhere) for _, _, c in commands)} by the "
          "walk-through's test, the rest not in the suite (PLAN says why)")


# ----------------------------------------------------------------------------- running them

SQUAD_GOLD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
    "context": "The demo corpus comes from Django and Wagtail.",
    "qas": [{"id": "q1", "question": "Where from?", "answers": [
        {"text": "Django and Wagtail", "answer_start": 27}]}]}]}]}


def _inputs(root: str) -> None:
    """What the documented commands name and a user brings, written small into `root`."""
    import lzma

    demo = os.path.join(ROOT, "tasks", "demo_data")
    os.symlink(os.path.join(ROOT, "tasks"), os.path.join(root, "tasks"))
    os.makedirs(os.path.join(root, "tmp"))
    with open(os.path.join(root, "my_run.gin"), "w", encoding="utf-8") as f:  # "copy it"
        f.write(open(os.path.join(ROOT, "gin_configs", "demo", "mmlm_tlm.gin"),
                     encoding="utf-8").read())
    with open(os.path.join(root, "dev-v1.1.json"), "w", encoding="utf-8") as f:
        json.dump(SQUAD_GOLD, f)
    with open(os.path.join(root, "predictions.json"), "w", encoding="utf-8") as f:
        json.dump({"q1": "Django and Wagtail"}, f)
    eng = open(os.path.join(demo, "tatoeba", "tatoeba.de-eng.eng"), encoding="utf-8"
               ).read().splitlines()[:12]
    deu = open(os.path.join(demo, "tatoeba", "tatoeba.de-eng.de"), encoding="utf-8"
               ).read().splitlines()[:12]
    for name, lines in (("sentences.txt", eng), ("en.txt", eng), ("de.txt", deu)):
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    bucc = os.path.join(root, "bucc2018")
    os.makedirs(bucc)
    for split, rows in (("dev", range(0, 6)), ("test", range(6, 12))):
        files = {"de": [f"de-{i}\t{deu[i]}" for i in rows],
                 "en": [f"en-{i}\t{eng[i]}" for i in rows],
                 "gold": [f"de-{i}\ten-{i}" for i in rows]}
        for side, lines in files.items():
            with open(os.path.join(bucc, f"de-en.{split}.{side}"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    mono = os.path.join(root, "my_corpus", "mono")
    os.makedirs(mono)
    for lang in ("de", "en"):
        with lzma.open(os.path.join(demo, "mono", f"{lang}.txt.xz"), "rt", encoding="utf-8") as f:
            text = "".join(f.readlines()[:600])
        with open(os.path.join(mono, f"{lang}.txt"), "w", encoding="utf-8") as f:
            f.write(text)


def _python(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=900)


def _before(command: str, root: str) -> None:
    """What a command needs of the ones before it, as a user would have it."""
    if "--hf_dir xlm-roberta-base/" in command and not os.path.isdir(
            os.path.join(root, "xlm-roberta-base")):  # an HF directory: the run, exported
        r = _python(["-m", "xlm_jax.convert", "export-hf", "--checkpoint", "tmp/run", "--out",
                     "xlm-roberta-base"], root)
        assert r.returncode == 0, r.stderr[-3000:]
    if "demo_output/model" in command and not os.path.exists(
            os.path.join(root, "demo_output")):  # what make demo leaves: a trained model
        os.makedirs(os.path.join(root, "demo_output"))
        os.symlink(os.path.join(root, "tmp", "run"), os.path.join(root, "demo_output", "model"))


def _run_all(root: str, slow: bool) -> list[str]:
    """Runs the `Run` commands in document order (the slow ones only with `slow`) from `root`;
    returns the lines run."""
    os.makedirs(root)
    assert not os.path.realpath(root).startswith(os.path.realpath(ROOT) + os.sep)
    _inputs(root)
    ran = []
    for doc, heading, command in doc_commands():
        entry = plan_of(command)[0]
        if not isinstance(entry, Run) or (entry.slow and not slow):
            continue
        line = command
        for doc_text, tiny in entry.tiny:
            line = line.replace(doc_text, tiny)
        line = line.replace("/tmp/", "tmp/")
        _before(line, root)
        args = shlex.split(line)
        assert args[:2] == ["python", "-m"], line
        r = _python(args[1:], root)
        assert r.returncode == 0, f"{doc} ({heading}): {line}\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
        assert entry.expect in r.stdout, (line, r.stdout[-2000:])
        ran.append(line)
    return ran


def test_the_documented_commands_run_as_written(tmp_path):
    """The commands that take seconds at tiny size (the slow ones: the next test)."""
    ran = _run_all(str(tmp_path / "scratch"), slow=False)
    quick = [c for _, _, c in doc_commands()
             if isinstance(plan_of(c)[0], Run) and not plan_of(c)[0].slow]
    assert len(ran) == len(quick) >= 10


@pytest.mark.slow  # ten minutes on 2 cores: compiles, Beam-free pipelines, fine-tuning
def test_every_documented_command_runs_as_written(tmp_path):
    ran = _run_all(str(tmp_path / "scratch"), slow=True)
    assert len(ran) == sum(isinstance(plan_of(c)[0], Run) for _, _, c in doc_commands())
