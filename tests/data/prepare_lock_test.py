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
from xlm_jax.data import prepare_lock
from xlm_jax.data import prepared_files as pf
from xlm_jax.data import verify

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


def test_a_prepare_into_a_directory_another_prepare_holds_is_refused_at_once(corpus, tmp_path):
    """A real prepare run (Beam, small units so that it runs a while) holds the directory; a
    second attempt while it runs is refused naming it; the finished directory verifies."""
    out = str(tmp_path / "prepared")
    first = subprocess.Popen(
        [sys.executable, "-m", "xlm_jax.data.prepare", "--module", pc.MODULE, "--tasks",
         pc.PATTERN, "--output_dir", out, "--split_bytes", "1024", "--direct_num_workers=2"],
        cwd=corpus, env=env(PYTHONPATH=os.pathsep.join([corpus, ROOT])),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and (_lock_holder(out) or {}).get("pid") != first.pid:
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.05)
    assert first.poll() is None, "the first run ended before the second could try"
    with pytest.raises(pf.PreparedError) as e:
        with prepare_lock.held(out, ["pd_mono"]):
            pass
    assert str(e.value).startswith(
        f"{out}: another prepare is writing there (pid {first.pid} on ")
    assert f"tasks {pc.PATTERN}); wait for it to finish, or use another --output_dir" in str(e.value)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert not verify.verify(out, ["*"]).problems
    with prepare_lock.held(out, ["pd_mono"]):  # free again once the first run has ended
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
    from xlm_jax.data import prepare

    out = tmp_path / "prepared"
    with pytest.raises(SystemExit) as e:
        prepare.main(["--tasks", "demo_mono", "--output_dir", str(out), "--splitbytes", "1000",
                      "--direct_num_workers=2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m xlm_jax.data.prepare: error: --splitbytes is neither a flag of prepare nor a "
        "Beam pipeline option; did you mean --split_bytes? (--help lists every flag)"]
    assert not out.exists()
    # Beam's own options pass, in both spellings
    assert prepare.unknown_flags(["--direct_num_workers=2", "--runner", "DirectRunner",
                                  "--project", "p", "--temp_location=gs://b/t"]) == []
