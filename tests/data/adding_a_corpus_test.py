"""docs/quickstart.md's walk-through ("Your own corpus, start to finish"), executed as written
from a directory outside the repository: train_spm -> my_tasks.py -> inspect -> train (with
the untrained model kept as step 0) -> retrieval of step 0 and of the trained model -> prepare
(Beam) -> train on the prepared data -> export-hf, loaded with transformers; on tiny data (400
lines per file, 150 pieces, 2 steps: the only changes to the doc's commands, each checked to
apply)."""
import json
import os
import re
import shlex

import pytest

from tests.testlib import user_corpus

pytest.importorskip("seqio")
DOC = os.path.join(user_corpus.ROOT, "docs", "quickstart.md")
SECTION = "## Your own corpus, start to finish"
# (command, doc text, what the test runs instead): tiny sizes only.
TINY = [("xlm_jax.data.train_spm", "--vocab_size 8000", user_corpus.TINY_SPM),
        ("xlm_jax.train", "--gin_file=demo/mmlm_tlm.gin",
         "--gin_file=demo/mmlm_tlm.gin --gin.TRAIN_STEPS=2 --gin.BATCH_SIZE=4")]


def _walkthrough():
    """(shell commands, my_tasks.py) of the doc's walk-through section."""
    text = open(DOC, encoding="utf-8").read().split(SECTION, 1)[1].split("\n## ")[0]
    bash = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    module = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    joined = bash.replace("\\\n", " ")
    commands = [line.strip() for line in joined.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    return commands, module


def test_the_walkthrough_runs_from_outside_the_repository(tmp_path):
    root = str(tmp_path / "mine")
    os.makedirs(root)
    assert not root.startswith(user_corpus.ROOT)
    user_corpus.write_corpus(root)
    tatoeba = os.path.join(root, "tatoeba")
    os.makedirs(tatoeba)
    for lang in ("de", "en"):  # held-out pairs: the parallel files' last 20 lines
        lines = open(os.path.join(root, "parallel", f"en-de.{lang}"), encoding="utf-8"
                     ).read().splitlines()[-20:]
        name = "eng" if lang == "en" else "de"
        with open(os.path.join(tatoeba, f"tatoeba.de-eng.{name}"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    commands, module = _walkthrough()
    with open(os.path.join(root, "my_tasks.py"), "w", encoding="utf-8") as f:
        f.write(module)
    assert [shlex.split(c)[2] for c in commands] == [
        "xlm_jax.data.train_spm", "xlm_jax.data.inspect", "xlm_jax.train",
        "xlm_jax.evaluation.retrieval", "xlm_jax.evaluation.retrieval", "xlm_jax.data.prepared.prepare",
        "xlm_jax.train", "xlm_jax.convert"]
    outputs = {}
    for command in commands:
        for name, doc_text, tiny in TINY:
            if shlex.split(command)[2] == name:
                assert doc_text in command, (name, command)
                command = command.replace(doc_text, tiny)
        args = shlex.split(command)
        assert args[0] == "python"
        r = user_corpus.python(args[1:], cwd=root)
        assert r.returncode == 0, (command, r.stderr[-3000:])
        outputs.setdefault(args[2], []).append(r.stdout)
    assert "my_mono_de" in outputs["xlm_jax.data.inspect"][0]
    assert all("done: 2 steps" in out for out in outputs["xlm_jax.train"])
    prepared = outputs["xlm_jax.data.prepared.prepare"][0]
    counted = {}  # what the raw registrations counted (the stats files beside the data)
    for sub in ("mono", "parallel"):
        entries = json.load(open(os.path.join(root, sub, "xlm_jax_stats.json")))["entries"]
        counted.update({tuple(e["files"]): e["stats"] for e in entries.values()})
    for task, member, files in (("my_mono_en", "en", ("en.txt",)),
                                ("my_mono_de", "de", ("de.txt",)),
                                ("my_opus_en_de", "en-de", ("en-de.en", "en-de.de"))):
        assert os.path.join("prepared", task) in prepared  # each task prepared, its counts
        manifest = json.load(open(os.path.join(root, "prepared", task, "manifest.json")))
        assert manifest["corpora"][member]["stats"] == counted[files]  # those of the raw path
    assert counted[("en-de.en", "en-de.de")]["examples"] == 400
    run = os.path.join(root, "run")
    with open(os.path.join(run, "spm.model"), "rb") as a, \
            open(os.path.join(root, "my_spm.model"), "rb") as b:
        assert a.read() == b.read()  # the model directory carries the user's tokenizer
    result = json.load(open(os.path.join(run, "retrieval.json")))
    assert list(result["per_language"]) == ["de"]
    baseline = json.load(open(os.path.join(run, "retrieval_step0.json")))  # save_initial
    assert baseline["step"] == 0 and result["step"] == 2  # the latest checkpoint
    import jax

    from xlm_jax.encoder import load_encoder

    untrained, trained = (jax.tree_util.tree_leaves(load_encoder(run, step=k).params)
                          for k in (0, 2))
    assert any(float(abs(a - b).max()) > 0 for a, b in zip(untrained, trained))  # step 0 kept
    assert all("acc@1 (%) per layer" in out for out in outputs["xlm_jax.evaluation.retrieval"])
    # the export: transformers loads it offline and its hidden states are load_encoder's
    import numpy as np
    import torch
    from transformers import AutoModel

    enc = load_encoder(run)
    ids, mask = enc.tokenizer.encode_batch(["Hallo Welt", "hello world, again"], 8)
    want = enc.hidden_states(ids, mask)
    hf = AutoModel.from_pretrained(os.path.join(root, "run_hf"), trust_remote_code=True,
                                   local_files_only=True)
    with torch.no_grad():
        got = hf(input_ids=torch.tensor(np.asarray(ids)), attention_mask=torch.tensor(
            np.asarray(mask)), output_hidden_states=True).hidden_states
    assert len(got) == len(want)
    m = np.asarray(mask, bool)
    for layer, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.numpy()[m], np.asarray(w)[m], atol=1e-4, err_msg=layer)
