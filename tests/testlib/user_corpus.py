"""A user's own corpus, tokenizer and task module, made as docs/adding_a_corpus.md says, in a
directory outside the repository: the demo corpus's German and English text (the first lines
of the shipped files), a SentencePiece model of their own trained with
`python -m xlm_jax.data.train_spm`, and `my_tasks.py` registering it."""
import lzma
import os
import subprocess
import sys

from tests.testlib.cli_run import ROOT, env

DEMO = os.path.join(ROOT, "tasks", "demo_data")
LANGUAGES = ("en", "de")
# `train_spm` at test size: the documents' `--vocab_size 8000` becomes these arguments (the
# default 300,000 sampled sentences would repeat a test corpus of a few hundred lines per
# language hundreds of times: ~33 s of SentencePiece).
SPM_VOCAB, SPM_SENTENCES = 150, 2000
TINY_SPM = f"--vocab_size {SPM_VOCAB} --sentences {SPM_SENTENCES}"

# The task module of the walk-through (docs/adding_a_corpus.md), with the paths filled in.
TASK_MODULE = '''\
from xlm_jax_tasks.cc100 import register_cc100
from xlm_jax_tasks.parallel import register_opus

SPM = {spm!r}
register_cc100({mono!r}, languages=["en", "de"], spm_path=SPM, name_prefix="my_mono",
               alpha=0.3, sequence_length=64)
register_opus({parallel!r}, pairs=["en-de"], spm_path=SPM, name_prefix="my_opus",
              alpha=0.3, sequence_length=64)
'''


def _lines(path: str, n: int) -> list[str]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def python(args: list[str], cwd: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` on one CPU device, as a user runs it."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def write_corpus(root: str, lines: int = 400) -> dict[str, str]:
    """`root/mono/{en,de}.txt` (CC-100 layout) and `root/parallel/en-de.{en,de}` (OPUS
    layout); returns their directories."""
    mono, parallel = os.path.join(root, "mono"), os.path.join(root, "parallel")
    os.makedirs(mono, exist_ok=True)
    os.makedirs(parallel, exist_ok=True)
    for lang in LANGUAGES:
        text = _lines(os.path.join(DEMO, "mono", f"{lang}.txt.xz"), lines)
        with open(os.path.join(mono, f"{lang}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")
        side = _lines(os.path.join(DEMO, "parallel", f"en-de.{lang}.xz"), lines)
        with open(os.path.join(parallel, f"en-de.{lang}"), "w", encoding="utf-8") as f:
            f.write("\n".join(side) + "\n")
    return {"mono": mono, "parallel": parallel}


def train_tokenizer(root: str, mono: str, vocab_size: int = SPM_VOCAB) -> str:
    """`python -m xlm_jax.data.train_spm` on `mono`; returns the model file."""
    prefix = os.path.join(root, "my_spm")
    r = python(["-m", "xlm_jax.data.train_spm", "--input_dir", mono, "--model_prefix", prefix,
                "--vocab_size", str(vocab_size), "--sentences", str(SPM_SENTENCES)], cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return prefix + ".model"


def make(root: str) -> dict[str, str]:
    """The corpus, the tokenizer and `root/my_tasks.py`; returns their paths."""
    dirs = write_corpus(root)
    spm = train_tokenizer(root, dirs["mono"])
    with open(os.path.join(root, "my_tasks.py"), "w", encoding="utf-8") as f:
        f.write(TASK_MODULE.format(spm=spm, mono=dirs["mono"], parallel=dirs["parallel"]))
    return {**dirs, "spm": spm, "root": root}


# The run of the walk-through: the demo's MMLM + TLM recipe on the user's tasks.
RUN = ["--gin_file=demo/mmlm_tlm.gin", "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=4",
       "--gin.MONO_TASK='my_mono'", "--gin.PAIR_TASK='my_opus'",
       "--gin.loop.train.task_modules=['my_tasks']"]
