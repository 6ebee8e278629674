"""One `prepare` at a time per output directory (issue 54; `xlm_jax/data/prepare_lock.py`):
a second run is refused at once naming the first, the lock dies with its process, and a
manifest is never written over shards of another plan."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from tests.testlib.cli_run import ROOT, env
from xlm_jax.data.prepared import prepare_lock
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared import verify
from xlm_jax.data.stats_cache import vocab_fingerprint
from xlm_jax.data.vocab import get_vocabulary

pytestmark = pytest.mark.usefixtures("seqio_isolated")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return pc.write(str(tmp_path_factory.mktemp("corpus")))


def _lock_holder(out):
    """The lock file's record of who holds (or held) `out`'s lock, or None."""
    try:
        return json.load(open(os.path.join(out, prepare_lock.LOCK)))
    except (OSError, ValueError):
        return None


def _other_model_corpus(root: str, train_xlmr_spm) -> str:
    """The same corpus and tasks as `root`'s, registered with another SentencePiece model
    (trained on its German text: another vocabulary, another fingerprint)."""
    pc.write(root)
    model = train_xlmr_spm(os.path.join(root, "mono", "de.txt"), os.path.join(root, "other"),
                           400)
    module = os.path.join(root, f"{pc.MODULE}.py")
    with open(module, encoding="utf-8") as f:
        text = f.read()
    assert repr(pc.SPM) in text
    with open(module, "w", encoding="utf-8") as f:
        f.write(text.replace(repr(pc.SPM), repr(model)))
    return root


def _prepare(root: str, out: str) -> subprocess.Popen:
    """A prepare run of many small units: the winner holds the lock for a while."""
    return subprocess.Popen(
        [sys.executable, "-m", "xlm_jax.data.prepared.prepare", "--module", pc.MODULE, "--tasks",
         pc.PATTERN, "--output_dir", out, "--split_bytes", "512", "--direct_num_workers=2"],
        cwd=root, env=env(PYTHONPATH=os.pathsep.join([root, ROOT])),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_prepares_with_different_models_into_one_directory_one_is_refused_at_once(
        corpus, tmp_path, train_xlmr_spm):
    """Issue 54, must-show 2: two real prepare runs (Beam, small units so that they run a
    while) started together into one directory, the second with another SentencePiece model:
    whichever takes the lock first prepares, the other is refused in one line naming it while
    it runs; the finished directory verifies and every shard was written under the winner's
    plan, with the winner's vocabulary only."""
    other = _other_model_corpus(str(tmp_path / "other"), train_xlmr_spm)
    out = str(tmp_path / "prepared")
    runs = {pc.SPM: _prepare(corpus, out), os.path.join(other, "other.model"): _prepare(other, out)}
    done = {model: (p, *p.communicate(timeout=600)) for model, p in runs.items()}
    winners = [m for m, (p, _, _) in done.items() if p.returncode == 0]
    assert len(winners) == 1, {m: (p.returncode, err[-2000:]) for m, (p, _, err) in done.items()}
    (winner,), (loser,) = winners, [m for m in done if m not in winners]
    lost, _, err = done[loser]
    assert lost.returncode == 2, err[-3000:]
    refusal = err.strip().splitlines()[-1]
    assert refusal.startswith(f"prepare: {out}: another prepare is writing there (pid "
                              f"{done[winner][0].pid} on "), err[-3000:]
    assert (f"tasks {pc.PATTERN}); wait for it to finish, or use another --output_dir"
            in refusal)
    assert not verify.verify(out, ["*"]).problems
    ours, theirs = (vocab_fingerprint(get_vocabulary(m)) for m in (winner, loser))
    assert ours != theirs
    tasks = [n for n in os.listdir(out) if os.path.isdir(os.path.join(out, n))]
    assert len(tasks) == 6
    for task in tasks:
        manifest = pf.read_json(os.path.join(out, task, pf.MANIFEST))
        assert manifest["vocabulary"] == ours
        digest = pf.Plan.from_json(manifest).digest
        for corpus_entry in manifest["corpora"].values():
            assert {s["plan"] for s in corpus_entry["shards"]} == {digest}
    with prepare_lock.held(out, ["pd_mono"]):  # free again once both runs have ended
        pass


def test_the_lock_dies_with_its_process(tmp_path):
    out = str(tmp_path / "prepared")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom xlm_jax.data import prepare_lock\n"
         "with prepare_lock.held(sys.argv[1], ['t']):\n    print('held', flush=True)\n"
         "    time.sleep(600)", out], cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(pf.PreparedError, match=f"pid {holder.pid} on "):
        with prepare_lock.held(out, ["t"]):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(60)
    with prepare_lock.held(out, ["t"]):  # no stale lock to delete by hand
        assert _lock_holder(out)["pid"] == os.getpid()


def test_a_manifest_is_not_written_over_shards_of_another_plan(corpus, tmp_path):
    """Shards interleaved by two preparations where no lock could stop them (a bucket): the
    counts file of a shard written under another plan stops the manifest, naming it."""
    out = str(tmp_path / "prepared")
    with process_state.restored("seqio", "prepared data"), pc.on_path(corpus):
        pc.prepare_here(corpus, out, pattern="pd_mono")
        counts = sorted(p for p in os.listdir(os.path.join(out, "pd_mono_de", "de"))
                        if p.endswith(".json"))
        path = os.path.join(out, "pd_mono_de", "de", counts[1])
        data = json.load(open(path))
        assert len(data["plan"]) == 16
        data["plan"] = "0123456789abcdef"
        json.dump(data, open(path, "w"))
        os.remove(os.path.join(out, "pd_mono_de", pf.MANIFEST))
        with pytest.raises(pf.PreparedError) as e:
            pc.prepare_here(corpus, out, pattern="pd_mono")
    assert str(e.value).startswith(f"{path} was written by another preparation (plan "
                                   "0123456789abcdef, this one is ")
    assert not os.path.exists(os.path.join(out, "pd_mono_de", pf.MANIFEST))


def test_a_flag_neither_ours_nor_beams_is_refused_before_anything_is_written(tmp_path, capsys):
    """`--splitbytes` was passed to Beam, which logged "Discarding unparseable args" and went
    on: the preparation ran with the default unit size, exit 0 (issue 54)."""
    from xlm_jax.data.prepared import prepare

    out = tmp_path / "prepared"
    with pytest.raises(SystemExit) as e:
        prepare.main(["--tasks", "demo_mono", "--output_dir", str(out), "--splitbytes", "1000",
                      "--direct_num_workers=2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m xlm_jax.data.prepared.prepare: error: --splitbytes is neither a flag of prepare nor a "
        "Beam pipeline option; did you mean --split_bytes? (--help lists every flag)"]
    assert not out.exists()
    # Beam's own options pass, in both spellings
    assert prepare.unknown_flags(["--direct_num_workers=2", "--runner", "DirectRunner",
                                  "--project", "p", "--temp_location=gs://b/t"]) == []
