"""What `prepare` shows while Beam runs (`data/prepare_console.py`): Beam's start-up notes are
left out of stderr, at the file-descriptor level that worker processes inherit, and nothing
else is; progress lines count the units written. The whole command's quiet stderr is checked
in prepare_test.py (`test_prepared_tasks_give_the_raw_tasks_examples_and_counts`)."""
import os
import subprocess
import sys
import time

from xlm_jax.data.prepared import prepare_console
from xlm_jax.data.prepared.corpus_units import Unit
from xlm_jax.data.prepared.prepare_worker import WorkItem

# The lines a DirectRunner worker of Beam 2.x printed at start (copied from a run of prepare).
BEAM_NOTES = [
    "WARNING:root:apitools not found, and bigquery client libraries are not available despite "
    "the import not raising an ImportError.",
    "INFO:__main__:Logging handler created.",
    "WARNING:__main__:No semi_persistent_directory found:  User registered objects (e.g. "
    "schema, logical type) throughregisteries may not be effective",
    "WARNING:apache_beam.options.pipeline_options:Discarding unparseable args: "
    "['--pipeline_type_check', '--direct_runner_use_stacked_bundle']",
]
KEPT = [
    "WARNING:xlm_jax.data.stats_cache:/data/de.txt: skipped 77 lines that are not valid UTF-8",
    "WARNING:apache_beam.options.pipeline_options:Discarding unparseable args: "
    "['--splitbytes', '1000']",
    "Traceback (most recent call last):",
    "OSError: [Errno 5] Input/output error: '/data/de.txt'",
]


def test_exactly_beams_start_up_notes_are_noise():
    assert [prepare_console.is_noise(line) for line in BEAM_NOTES] == [True] * len(BEAM_NOTES)
    assert [prepare_console.is_noise(line) for line in KEPT] == [False] * len(KEPT)


def test_a_child_process_s_notes_are_dropped_and_its_other_lines_kept(capfd, monkeypatch):
    """A worker process inherits file descriptor 2: what it writes there goes through the
    filter, in order, and stderr is the terminal's again after the block."""
    monkeypatch.delenv("XLM_JAX_DEBUG", raising=False)
    lines = [BEAM_NOTES[0], KEPT[0], BEAM_NOTES[3], KEPT[1], BEAM_NOTES[1], KEPT[3]]
    script = "import sys\nfor line in sys.argv[1:]: print(line, file=sys.stderr)"
    with prepare_console.beam_notes_hidden():
        subprocess.run([sys.executable, "-c", script, *lines], check=True)
    os.write(2, b"after the block\n")
    err = capfd.readouterr().err.splitlines()
    assert err == [KEPT[0], KEPT[1], KEPT[3], "after the block"]


def test_debug_keeps_every_line(capfd, monkeypatch):
    monkeypatch.setenv("XLM_JAX_DEBUG", "1")
    with prepare_console.beam_notes_hidden():
        subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1], file=sys.stderr)",
                        BEAM_NOTES[1]], check=True)
    assert capfd.readouterr().err.splitlines() == [BEAM_NOTES[1]]


def _items(directory, n):
    return [WorkItem(str(directory), "documents", "spm.model", Unit("documents", ("de.txt",), False, 0, None),
                     k, n) for k in range(n)]


def test_progress_counts_units_whose_counts_file_is_written(tmp_path, capsys):
    a, b = tmp_path / "task" / "de", tmp_path / "task" / "fr"
    items = _items(a, 3) + _items(b, 2)  # fr's directory does not exist yet
    a.mkdir(parents=True)
    assert prepare_console.written_units(items) == 0
    for item in (items[0], items[2]):
        with open(item.prefix + ".json", "w") as f:
            f.write("{}")
    with open(items[1].prefix + ".bin", "w") as f:  # data without its counts: not written
        f.write("x")
    assert prepare_console.written_units(items) == 2
    with prepare_console.progress(items, every_s=0.05):
        time.sleep(0.3)
        b.mkdir(parents=True)
        with open(items[4].prefix + ".json", "w") as f:
            f.write("{}")
        time.sleep(0.3)
    out = [line.rsplit(",", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert out == ["prepare: 2 of 5 work units written", "prepare: 3 of 5 work units written"]
