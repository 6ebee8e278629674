"""Every CLI x {no arguments, --help, a bad value}: the exit status and the one line it prints
(the last line of stderr; --help: the first line of stdout), run as users run them. The same
table is in docs/NOTES.md ("CLI table"), checked here against this one."""
import concurrent.futures
import os
import re
import subprocess
import sys

from tests.testlib.cli_run import ROOT, env
from xlm_jax.cli_help import MOVED, MOVED_MODULES, REMOVED_AFTER

# (module, case, arguments, exit status, the line; a line ending in "..." is a prefix).
# None as arguments: not run (the command does real work without arguments).
TABLE = [
    ("xlm_jax.train", "no args", [], 2, "python -m xlm_jax.train: error: the following arguments "
     "are required: --model_dir (--help lists every flag)"),
    ("xlm_jax.train", "bad value", ["--gin_file=demo/mmlm_tlm.gin", "--model_dir=/nonexistent/run",
                                    "--gin.TRIAN_STEPS=3"], 1,
     "error: GinConfigError: gin macro TRIAN_STEPS (--gin.TRIAN_STEPS=3) is not used by any "
     "configurable or macro; did you mean TRAIN_STEPS?"),
    ("xlm_jax.finetune", "no args", [], 2, "python -m xlm_jax.finetune: error: the following "
     "arguments are required: --init_from, --model_dir (--help lists every flag)"),
    ("xlm_jax.finetune", "bad value", ["--gin_file=finetune/demo_pawsx.gin",
                                       "--init_from=/nonexistent/model",
                                       "--model_dir=/nonexistent/ft"], 1,
     "error: FileNotFoundError: /nonexistent/model: not a directory"),
    ("xlm_jax.data.inspect", "no args", [], 2, "python -m xlm_jax.data.inspect: error: one of the "
     "arguments --task --mixture is required (--help lists every flag)"),
    ("xlm_jax.data.inspect", "bad value", ["--task", "no_such_task"], 1,
     "error: ValueError: unknown task or mixture 'no_such_task' (registered: demo_mixup, ..."),
    ("xlm_jax.data.train_spm", "no args", [], 2, "python -m xlm_jax.data.train_spm: error: the "
     "following arguments are required: --input_dir, --model_prefix (--help lists every flag)"),
    ("xlm_jax.data.train_spm", "bad value", ["--input_dir", "/nonexistent/corpus",
                                             "--model_prefix", "/nonexistent/spm"], 2,
     "train_spm: error: --input_dir '/nonexistent/corpus' is not a directory"),
    ("xlm_jax.data.prepared.verify", "no args", [], 2, "python -m xlm_jax.data.prepared.verify: error: the "
     "following arguments are required: directory (--help lists every flag)"),
    ("xlm_jax.data.prepared.verify", "bad value", ["/nonexistent/prepared"], 2,
     "error: verify: /nonexistent/prepared is not a directory"),
    ("xlm_jax.data.prepared.prepare", "no args", [], 2, "python -m xlm_jax.data.prepared.prepare: error: the "
     "following arguments are required: --tasks, --output_dir (--help lists every flag)"),
    ("xlm_jax.data.prepared.prepare", "bad value", ["--tasks", "no_such_task", "--output_dir",
                                           "/nonexistent/prepared"], 2,
     "prepare: --tasks 'no_such_task' names no registered task or mixture (did --module import "
     "the module that registers it?)"),
    ("xlm_jax.evaluation.retrieval", "no args", [], 2, "python -m xlm_jax.evaluation.retrieval: "
     "error: the following arguments are required: --checkpoint, --tatoeba_dir, --layer "
     "(--help lists every flag)"),
    ("xlm_jax.evaluation.retrieval", "bad value", [
        "--checkpoint", "/nonexistent/model", "--tatoeba_dir", "tasks/demo_data/tatoeba",
        "--layer", "8", "--output_json", "/nonexistent/r.json"], 2,
     "error: /nonexistent/model: not a directory"),
    ("xlm_jax.evaluation.bucc", "no args", [], 2, "python -m xlm_jax.evaluation.bucc: error: the "
     "following arguments are required: --checkpoint, --bucc_dir, --layer"
     " (--help lists every flag)"),
    ("xlm_jax.evaluation.bucc", "bad value", [
        "--checkpoint", "/nonexistent/model", "--bucc_dir", "/nonexistent/bucc", "--layer", "8",
        "--output_json", "/nonexistent/b.json"], 2,
     "error: bucc_dir /nonexistent/bucc: not a directory (expected files {xx}-en.{split}.{xx} + "
     "{xx}-en.{split}.en + {xx}-en.{split}.gold)"),
    ("xlm_jax.evaluation.word_alignment", "no args", [], 2, "python -m "
     "xlm_jax.evaluation.word_alignment: error: the following arguments are required: "
     "--checkpoint, --src, --tgt, --layer, --out (--help lists every flag)"),
    ("xlm_jax.evaluation.word_alignment", "bad value", [
        "--checkpoint", "/nonexistent/model", "--src", "/nonexistent/src.txt", "--tgt",
        "/nonexistent/tgt.txt", "--layer", "8", "--out", "/nonexistent/a.txt"], 2,
     "error: /nonexistent/src.txt: sentence file not found"),
    ("xlm_jax.evaluation.metrics", "no args", [], 2, "python -m xlm_jax.evaluation.metrics: "
     "error: the following arguments are required: METRIC (--help lists every flag)"),
    ("xlm_jax.evaluation.metrics", "bad value", ["squad", "--gold", "/nonexistent/gold.json",
                                                 "--pred", "/nonexistent/pred.json"], 2,
     "error: [Errno 2] No such file or directory: '/nonexistent/gold.json'"),
    ("xlm_jax.translate", "no args", [], 2, "python -m xlm_jax.translate: error: the following "
     "arguments are required: --gin_file, --model_dir (--help lists every flag)"),
    ("xlm_jax.translate", "bad value", ["--gin_file=demo/veco_translate.gin",
                                        "--model_dir=/nonexistent/tr", "--gin.TRIAN_STEPS=3"], 2,
     "error: gin macro TRIAN_STEPS (--gin.TRIAN_STEPS=3) is not used by any configurable or "
     "macro; did you mean TRAIN_STEPS?"),
    ("xlm_jax.convert", "no args", [], 2, "python -m xlm_jax.convert: error: the following "
     "arguments are required: command (--help lists every flag)"),
    ("xlm_jax.convert", "bad value", ["import-hf", "--hf_dir", "/nonexistent/hf", "--out",
                                      "/nonexistent/out"], 2,
     "error: /nonexistent/hf/config.json: not found (an HF model directory needs config.json)"),
    ("xlm_jax.embed", "no args", [], 2, "python -m xlm_jax.embed: error: the following "
     "arguments are required: --model, --input, --out (--help lists every flag)"),
    ("xlm_jax.embed", "bad value", ["--model", "/nonexistent/model", "--input",
                                     "/nonexistent/in.txt", "--out", "/nonexistent/out.npy"], 2,
     "error: [Errno 2] No such file or directory: '/nonexistent/in.txt'"),
    ("xlm_jax.accelerator.bench", "no args", [], 2, "python -m xlm_jax.accelerator.bench: "
     "error: --gin_file is required (or --table, or --pipeline TASK) (--help lists every flag)"),
    ("xlm_jax.accelerator.bench", "bad value", ["--gin_file=demo/mmlm_tlm.gin", "--steps=0"], 2,
     "python -m xlm_jax.accelerator.bench: error: --steps 0: must be >= 1 (--help lists every "
     "flag)"),
    ("xlm_jax.demo", "no args", None, 0, "(trains and scores the demo: what make demo runs)"),
    ("xlm_jax.demo", "bad value", ["--gin_file=nope.gin", "--model_dir=/nonexistent/demo"], 1,
     "error: FileNotFoundError: gin file 'nope.gin' not found; looked in: ..."),
    ("xlm_jax.league", "no args", None, 0, "(trains the base and every recipe x 3 seeds: about "
     "1.5 hours on 2 cores)"),
    ("xlm_jax.league", "bad value", ["--recipes=nosuch", "--out=/nonexistent/league"], 1,
     "error: ValueError: --recipes=nosuch: unknown recipe 'nosuch' (recipes: mmlm, xlm, "
     "infoxlm, xlme, xlme_no_trtd, ernie_m, veco)"),
    ("xlm_jax.accelerator.pod_memory", "no args", [], 2, "python -m "
     "xlm_jax.accelerator.pod_memory: error: the following arguments are required: --gin_file "
     "(--help lists every flag)"),
    ("xlm_jax.accelerator.pod_memory", "bad value", ["--gin_file=demo/mmlm_tlm.gin",
                                                     "--mesh=pipe=2", "--devices=2"], 2,
     "error: --mesh 'pipe=2': expected AXIS=SIZE[,AXIS=SIZE] with axes data, fsdp, tensor"),
    ("xlm_jax.accelerator.lower", "no args", [], 2, "error: --gin_file is required (a run file, "
     "e.g. runs/xlme_base.gin)"),
    ("xlm_jax.accelerator.lower", "bad value", ["--gin_file=demo/mmlm_tlm.gin",
                                                "--platform=abc"], 2,
     "error: --platform 'abc': expected one of cuda, tpu"),
    ("xlm_jax.accelerator.compile", "no args", [], 2, "error: --gin_file is required (a run "
     "file, e.g. runs/xlme_base.gin)"),
    ("xlm_jax.accelerator.compile", "bad value", ["--gin_file=runs/xlme_base.gin",
                                                  "--target=v9z:2x2"], 2,
     "error: --target 'v9z:2x2': unknown chip 'v9z'; known: v4:AxB[xC], ..."),
    ("xlm_jax.accelerator.cost", "no args", [], 2, "error: --gin_file is required (a run "
     "file, e.g. runs/xlme_base.gin)"),
    ("xlm_jax.accelerator.cost", "bad value", ["--gin_file=runs/xlmr_base_mmlm.gin",
                                               "--target=v9z:2x2"], 2,
     "error: --target 'v9z:2x2': unknown chip 'v9z'; known: v4:AxB[xC], ..."),
    ("xlm_jax.accelerator.check", "no args", [], 2, "python -m xlm_jax.accelerator.check: "
     "error: the following arguments are required: --budget_s (--help lists every flag)"),
    ("xlm_jax.accelerator.check", "bad value", ["--budget_s=60", "--only=warp"], 2,
     "error: --only 'warp': not steps of env, smoke, kernels, mmlm, xlme, mmlm_tuned, "
     "xlme_tuned, infoxlm, ernie_m, veco, mmlm_b64, transformers"),
    ("xlm_jax.accelerator.kernel_sweep", "no args", None, 0, "(times the attention kernels "
     "over 40 launches on this host)"),
    ("xlm_jax.accelerator.kernel_sweep", "bad value", ["--launches=64x64"], 2,
     "error: --launches: '64x64' is not BQxBKwWARPSsSTAGES (e.g. 128x64w4s3)"),
    ("xlm_jax.accelerator.kernel_ptx", "no args", [], 2, "error: the CUDA plugin is not "
     "installed: ..."),
    ("xlm_jax.accelerator.kernel_ptx", "bad value", ["--bias=alibi"], 2,
     "error: --dtype 'bfloat16' / --bias 'alibi': dtype one of float32, bfloat16, float16, "
     "bias of none, gated"),
    ("xlm_jax.accelerator.profile_summary", "no args", [], 2, "python -m "
     "xlm_jax.accelerator.profile_summary: error: the following arguments are required: "
     "TRACE_OR_DIR, --steps (--help lists every flag)"),
    ("xlm_jax.accelerator.profile_summary", "bad value", ["/nonexistent/t.xplane.pb",
                                                          "--steps=1"], 2,
     "error: /nonexistent/t.xplane.pb: ..."),
    ("xlm_jax.accelerator.smoke", "no args", None, 0, "(runs the tiny smoke comparison on this "
     "host)"),
    ("xlm_jax.accelerator.smoke", "bad value", ["--sizes=huge"], 2,
     "error: --sizes huge: not one of tiny, small, base, large, xl"),
]
MODULES = list(dict.fromkeys(row[0] for row in TABLE))
ROWS = TABLE + [(m, "--help", ["--help"], 0, f"usage: python -m {m} ...") for m in MODULES]
# The moved commands (`cli_help.MOVED`): the new name's --help, and the old name's, which prints
# the new name's usage after one WARNING that names it (old names of modules only aside).
MOVED_ROWS = [(new, "--help", ["--help"], 0, f"usage: python -m {new} ...")
              for old, new in MOVED.items() if new not in MODULES and old not in MOVED_MODULES]
MOVED_ROWS += [(old, "--help (old name)", ["--help"], 0, f"usage: python -m {new} ...")
               for old, new in MOVED.items() if old not in MOVED_MODULES]


def _run(args):
    env_ = env(COLUMNS="100")
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env_,
                          capture_output=True, text=True, timeout=300)


def _line(case, done):
    if case.startswith("--help"):
        return done.stdout.strip().splitlines()[0]
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def _matches(line, want):
    return line.startswith(want[:-3]) if want.endswith("...") else line == want


def test_every_cli_row():
    runnable = [row for row in ROWS + MOVED_ROWS if row[2] is not None]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda row: _run([row[0], *row[2]]), runnable))
    for (module, case, _, code, want), d in zip(runnable, done):
        where = f"{module} {case}: rc {d.returncode}\n{d.stderr[-2000:]}"
        assert d.returncode == code, where
        assert _matches(_line(case, d), want), where
        assert "Traceback" not in d.stderr, where
        if case == "--help (old name)":  # one line on stderr: the WARNING naming the new command
            moved = (f"WARNING: `python -m {module}` has moved to `python -m {MOVED[module]}`; "
                     f"the old name is removed in the release after "
                     f"{REMOVED_AFTER.get(module, '0.2')}")
            assert d.stderr.strip().splitlines() == [moved], where
        elif case != "--help":  # the one line is all of stderr: no usage block, no start-up noise
            assert len(d.stderr.strip().splitlines()) == 1, where


def markdown() -> str:
    """The table as docs/NOTES.md shows it."""
    out = ["| CLI | no arguments | --help | a bad value |", "|---|---|---|---|"]
    for m in MODULES:
        cells = []
        for case in ("no args", "--help", "bad value"):
            row = next(r for r in ROWS if r[0] == m and r[1] == case)
            args = "" if not row[2] or case == "--help" else " `" + " ".join(row[2]) + "`"
            shown = "not run" if row[2] is None else f"exit {row[3]}"
            cells.append(f"{shown}{args}: {row[4]}".replace("|", "\\|"))
        out.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return "\n".join(out)


def test_every_command_the_readme_names_is_a_row():
    """README's commands (`python -m xlm_jax...`) are all in the table: each answers --help,
    a moved one from its new name and its old one (MOVED_ROWS)."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    named = set(re.findall(r"python -m (xlm_jax[\w.]*)", readme))
    assert len(named) > 15, named
    rows = {row[0] for row in ROWS + MOVED_ROWS if row[1].startswith("--help")}
    assert named <= rows, sorted(named - rows)


def test_notes_hold_the_same_table():
    notes = open(os.path.join(ROOT, "docs", "NOTES.md"), encoding="utf-8").read()
    assert markdown() in notes, "docs/NOTES.md's CLI table differs; paste:\n" + markdown()
