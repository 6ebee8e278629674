"""`python -m xlm_jax.data.prepared.prepare`: tokenise registered tasks once, on Apache Beam, into
sharded random-access files that every training process reads its own share of.

  python -m xlm_jax.data.prepared.prepare --module xlm_jax_tasks.demo --tasks demo_mono \\
      --output_dir /data/prepared [--runner DataflowRunner --project ... (Beam's options)]

`--tasks` takes task names, mixture names (their tasks) and globs (`'cc100_*'`), comma
separated. Each task is written to `OUTPUT_DIR/TASK/` (`xlm_jax.data.prepared.shard_files` says
what is there). A training run reads it with one binding, `loop.train.prepared_data =
'/data/prepared'`; the tasks keep their names.

How the work is split: every corpus file is cut into work units
(`xlm_jax.data.prepared.corpus_units`): a plain-text file into byte ranges of `--split_bytes` at
document (or line) boundaries, a compressed file or a pair of line-aligned files into one unit
(a compressed stream cannot be entered in the middle: decompress a large one first,
docs/scaling.md). Each unit is one Beam element, tokenised by whichever worker
takes it, and written as one shard; a shard is written under a temporary name and renamed, and
its counts file comes last, so a unit with a counts file is done. After the pipeline, this
process writes each task's `manifest.json` from the counts files. Rerun after a kill, the
same command skips the finished units and writes files identical to an uninterrupted run's.
Nothing already prepared is overwritten: a directory that holds another preparation of a
task (another vocabulary, other files) is refused, naming what differs.

The registration is run without counting the corpora (`choice.preparing`); the counts come
from the preparation. Beam's DirectRunner with one worker per core is the default here (in
`multi_processing` mode); `--runner` and every other Beam pipeline option pass through; a
flag that is neither prepare's nor a Beam option is refused (`unknown_flags`).
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

from xlm_jax import cli_help
from xlm_jax.data import corpus_fs
from xlm_jax.data.prepared import corpus_units as cu
from xlm_jax.data.prepared import choice, prepare_console, prepare_lock
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared.prepare_worker import WorkItem, run_unit
from xlm_jax.data.sources import CorpusStats, ParallelFiles

__all__ = ["TaskPlan", "plan_task", "check_existing", "finish_task", "resolve_tasks", "prepare",
           "main"]

DEFAULT_SPLIT_BYTES = 256 << 20
logger = logging.getLogger("xlm_jax.data.prepared.prepare")  # also when run as __main__


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """A task to prepare: its directory, plan and work units per member."""

    directory: str
    plan: pf.Plan
    spm_path: str
    corpora: dict[str, pf.Corpus]
    units: dict[str, list[cu.Unit]]

    def items(self) -> list[WorkItem]:
        return [WorkItem(os.path.join(self.directory, member), self.plan.records, self.spm_path,
                         unit, k, len(units), self.plan.digest,
                         pf.vocab_size(self.plan.vocabulary))
                for member, units in sorted(self.units.items()) for k, unit in enumerate(units)]


# ----------------------------------------------------------------------------- planning

def _units(corpus: pf.Corpus, split_bytes: int) -> list[cu.Unit]:
    """The corpus's work units in reading order (a language in several files: file by
    file)."""
    if corpus.records == "documents":
        return [u for path in corpus.paths for u in cu.document_units(path, split_bytes)]
    tgt = corpus.paths[1] if len(corpus.paths) > 1 else None
    return cu.pair_units(ParallelFiles(corpus.paths[0], tgt, corpus.swapped), split_bytes)


def warn_serial_units(units: Sequence[cu.Unit], split_bytes: int) -> None:
    """A WARNING for each file (or pair) that one worker must read whole although it holds more
    than a unit's bytes: a compressed file (a stream cannot be entered in the middle) or a pair of
    line-aligned files (a byte offset in one says nothing of the line in the other) larger
    than `split_bytes`. Its memory is bounded (the shard is written as it is read); its time
    is one worker's, while the other workers wait at the end of the pipeline."""
    seen = set()  # two tasks over one file: one warning
    for unit in units:
        if unit.start or unit.end is not None or unit.paths in seen:
            continue  # a byte range of a plain file: split already
        seen.add(unit.paths)
        aligned = unit.layout == cu.ALIGNED
        if not aligned and not unit.paths[0].endswith((".xz", ".gz")):
            continue
        size = sum(corpus_fs.getsize(p) for p in unit.paths)
        if size <= split_bytes:
            continue
        fix = ("paste them into one TSV file (`paste SRC TGT > PAIR.tsv`), which prepare "
               "splits at lines" if aligned else
               "decompress it, or recompress it in parts: `mkdir en && xz -dc en.txt.xz | "
               "split -C 2G -d -a 4 --additional-suffix=.txt - en/part- && xz -T0 "
               "en/part-*.txt` (docs/scaling.md, \"Preparing a corpus\")")
        logger.warning("%s (%s) is read by one worker from start to end, more than a work "
                       "unit's %s: %s", " + ".join(unit.paths), _size(size), _size(split_bytes),
                       fix)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n:,} bytes"


def plan_task(task: Any, output_dir: str, split_bytes: int) -> TaskPlan:
    """The plan of one registered task (an `registry.XlmTask` with its corpora)."""
    from xlm_jax.data.stats_cache import vocab_fingerprint  # pylint: disable=g-import-not-at-top

    corpora = getattr(task, "xlm_jax_corpora", None)
    if not corpora:
        raise ValueError(f"task {task.name} has no corpus files to prepare: prepare reads tasks "
                         "registered by xlm_jax.data.registry.register_monolingual / "
                         "register_parallel (for other seqio tasks use seqio's cache_tasks_main)")
    vocab = next(f.vocabulary for k, f in task.output_features.items() if k.endswith("input_ids"))
    spm_path = getattr(vocab, "sentencepiece_model_file", None)
    if not spm_path:
        raise ValueError(f"task {task.name}: prepare tokenises with a SentencePiece model, and "
                         f"its vocabulary ({type(vocab).__name__}) has none")
    units = {c.member: _units(c, split_bytes) for c in corpora}
    plan = pf.Plan(task=task.name, records=corpora[0].records,
                   vocabulary=vocab_fingerprint(vocab),
                   corpora={c.member: {"sources": pf.source_entries(c.paths),
                                       "swapped": c.swapped, "units": len(units[c.member])}
                            for c in corpora})
    return TaskPlan(os.path.join(output_dir, task.name), plan, os.fspath(spm_path),
                    {c.member: c for c in corpora}, units)


def check_existing(tp: TaskPlan, out=sys.stdout) -> bool:
    """True when the task is already prepared with this plan; raises when the directory holds
    another finished preparation (nothing prepared is overwritten); False when there is work
    to do. An unfinished preparation of another plan (the corpus was fixed after a worker
    failed) is unusable as it is, and is started over."""
    manifest, plan = os.path.join(tp.directory, pf.MANIFEST), os.path.join(tp.directory, pf.PLAN)
    if pf.exists(manifest):
        differs = tp.plan.differences(pf.Plan.from_json(pf.read_json(manifest)))
        if differs:
            raise pf.PreparedError(
                f"{tp.directory} holds another preparation of {tp.plan.task} "
                f"({'; '.join(differs)}); nothing was overwritten: use another --output_dir "
                "or delete that directory")
        return True
    if pf.exists(plan):
        raw = pf.read_json(plan)
        old = pf.Plan.from_json(raw)
        differs = tp.plan.differences(old)
        if raw.get("format") != pf.FORMAT:  # its shards are of the old format
            differs.append(f"format {raw.get('format')} vs {pf.FORMAT}")
        if differs or old.digest != tp.plan.digest:  # (its shards carry the old digest)
            why = "; ".join(differs) or "planned before corpus samples were recorded"
            print(f"{tp.directory}: an unfinished preparation of another plan ({why}) is "
                  "started over", file=out, flush=True)
            pf.rmtree(tp.directory)
    return False


def finish_task(tp: TaskPlan) -> dict[str, Any]:
    """Writes the task's manifest from its units' counts files; returns it. A corpus that
    `stats_cache.check_stats` refuses (mostly not UTF-8, no usable example) gets none."""
    from xlm_jax.data.stats_cache import check_stats  # pylint: disable=g-import-not-at-top

    manifest = tp.plan.to_json()
    for member, units in sorted(tp.units.items()):
        entry = manifest["corpora"][member]
        shards = []
        for k in range(len(units)):
            name = pf.shard_name(k, len(units))
            path = os.path.join(tp.directory, member, name + ".json")
            if not pf.exists(path):
                raise pf.PreparedError(f"{path} is missing after the pipeline ran: a worker "
                                       "failed; run the same command again to finish")
            counts = pf.read_json(path)
            if counts.get("plan", tp.plan.digest) != tp.plan.digest:
                raise pf.PreparedError(
                    f"{path} was written by another preparation (plan {counts['plan']}, this "
                    f"one is {tp.plan.digest}): two prepare runs wrote {tp.directory}; delete "
                    "it and prepare again")
            shards.append({"name": name, **counts})
        entry["shards"] = shards
        total = {k: sum(s[k] for s in shards) for k in
                 ("records", "tokens", "lines", "invalid_utf8", "malformed", "empty_pairs")}
        entry["stats"] = {
            "examples": total["records"], "tokens": total["tokens"], "lines": total["lines"],
            "bytes": sum(s["bytes"] for s in entry["sources"]),
            "invalid_utf8_lines": total["invalid_utf8"], "malformed_lines": total["malformed"],
            "empty_pairs": total["empty_pairs"]}
        check_stats(CorpusStats.from_json(entry["stats"]), tp.corpora[member].paths,
                    "mono" if tp.plan.records == "documents" else "pair")
    pf.write_json(os.path.join(tp.directory, pf.MANIFEST), manifest)
    return manifest


# ----------------------------------------------------------------------------- the command

def resolve_tasks(patterns: Sequence[str]) -> list[Any]:
    """The registered seqio Tasks named by `patterns`: task names, mixture names (their
    tasks) and globs over both; a pattern that names nothing is a ValueError."""
    import seqio  # pylint: disable=g-import-not-at-top

    tasks, seen = [], set()
    names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
    for pattern in patterns:
        matched = fnmatch.filter(names, pattern) if any(c in pattern for c in "*?[") else (
            [pattern] if pattern in names else [])
        if not matched:
            raise ValueError(f"--tasks {pattern!r} names no registered task or mixture "
                             "(did --module import the module that registers it?)")
        for name in matched:
            provider = (seqio.MixtureRegistry.get(name) if name in seqio.MixtureRegistry.names()
                        else seqio.TaskRegistry.get(name))
            for task in getattr(provider, "tasks", [provider]):
                if task.name not in seen:
                    seen.add(task.name)
                    tasks.append(task)
    return tasks


def run_pipeline(items: Sequence[WorkItem], beam_args: Sequence[str]) -> None:
    """Runs `run_unit` over `items` on Beam (the runner and options of `beam_args`)."""
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top

    args = list(beam_args)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in args):
        args.append("--default_sdk_harness_log_level=WARNING")  # the workers' start/stop lines
    if not any(a.startswith("--runner") for a in args):
        args += ["--runner=DirectRunner", "--direct_running_mode=multi_processing"]
        if not any(a.startswith("--direct_num_workers") for a in args):
            args.append(f"--direct_num_workers={os.cpu_count() or 1}")
    with (prepare_console.beam_notes_hidden(),
          beam.Pipeline(options=PipelineOptions(args)) as pipeline):
        _ = (pipeline
             | "units" >> beam.Create(list(items))
             | "spread" >> beam.Reshuffle()
             | "tokenise and write" >> beam.Map(run_unit))


class WorkerFailed(RuntimeError):
    """The pipeline failed; what it finished is kept for the next run."""


def _last_line(e: BaseException) -> str:
    """The innermost error of a Beam failure, in one line (Beam nests the worker's traceback
    in its message and appends where it ran)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    return lines[-1].split(" [while running")[0]


def prepare(patterns: Sequence[str], output_dir: str, split_bytes: int = DEFAULT_SPLIT_BYTES,
            beam_args: Sequence[str] = (), out=sys.stdout,
            run_units: Callable[[Sequence[WorkItem], Sequence[str]], None] = run_pipeline
            ) -> list[str]:
    """Prepares the tasks of `patterns` (registered already) into `output_dir`; returns the
    names of the tasks it prepared or completed (the ones already prepared are skipped).
    `run_units(items, beam_args)` runs `run_unit` over the items: Beam (`run_pipeline`), or
    a plain loop where Beam is not wanted (tests whose subject is the reading)."""
    plans = [plan_task(t, output_dir, split_bytes) for t in resolve_tasks(patterns)]
    with prepare_lock.held(output_dir, patterns):  # one prepare per directory at a time
        return _prepare(plans, split_bytes, beam_args, out, run_units)


def _prepare(plans: Sequence[TaskPlan], split_bytes: int, beam_args: Sequence[str], out,
             run_units: Callable[[Sequence[WorkItem], Sequence[str]], None]) -> list[str]:
    """`prepare`'s writing part, under the directory's lock."""
    todo = [tp for tp in plans if not check_existing(tp, out)]
    for tp in plans:
        if tp not in todo:
            print(f"{tp.directory}: already prepared", file=out, flush=True)
    for tp in todo:  # a killed run's temporary files go; its finished units stay
        pf.makedirs(tp.directory)
        pf.remove_temporaries(tp.directory)
        pf.write_json(os.path.join(tp.directory, pf.PLAN), tp.plan.to_json())
    items = [item for tp in todo for item in tp.items()
             if not pf.exists(item.prefix + ".json")]
    warn_serial_units([item.unit for item in items], split_bytes)
    if items:
        print(f"prepare: {len(items)} work units of {len(todo)} tasks on Beam", file=out,
              flush=True)
        try:
            with prepare_console.progress(items, out):
                run_units(items, beam_args)
        except Exception as e:  # pylint: disable=broad-except
            done = sum(pf.exists(item.prefix + ".json") for item in items)
            raise WorkerFailed(f"a Beam worker failed: {_last_line(e)}; {done} of {len(items)} "
                               "work units are written and kept: fix the cause and run the "
                               "same command again to finish") from e
    for tp in todo:  # the workers' files, written after any listing made here
        pf.forget_listings(tp.directory)
    errors = [(item, pf.read_json(item.prefix + ".error")["error"]) for item in items
              if pf.exists(item.prefix + ".error")]
    failed = {item.directory.rsplit("/", 1)[0] for item, _ in errors}
    refused, finished = [], []
    for tp in todo:
        if tp.directory in failed:
            continue
        try:
            manifest = finish_task(tp)
        except pf.PreparedError:  # shards of another preparation: nothing is finished here
            raise
        except ValueError as e:  # an empty corpus, one not UTF-8: the other tasks go on
            refused.append(f"{tp.plan.task}: {e}")
            continue
        finished.append(tp.plan.task)
        stats = [c["stats"] for c in manifest["corpora"].values()]
        print(f"{tp.directory}: {sum(s['examples'] for s in stats)} {tp.plan.records}, "
              f"{sum(s['tokens'] for s in stats)} tokens", file=out, flush=True)
    if refused:  # one line: the first refusal, and what was prepared and kept
        also = f"; {len(errors)} work unit(s) failed too" if errors else ""
        raise WorkerFailed(
            f"{refused[0]} ({len(refused)} task(s) refused{also}; prepared and kept: "
            f"{', '.join(finished) or 'none'}; fix the corpus and run the same command again "
            "to finish the rest)")
    if errors:  # the tasks that finished have their manifests; these can be rerun
        (item, message), done = errors[0], sum(pf.exists(i.prefix + ".json") for i in items)
        raise WorkerFailed(f"{item.prefix}: {message} ({len(errors)} work unit(s) failed, "
                           f"{done} of {len(items)} are written and kept: fix the corpus and "
                           "run the same command again to finish)")
    return [tp.plan.task for tp in todo]


def unknown_flags(beam_args: Sequence[str]) -> list[str]:
    """The arguments left after prepare's own flags that no Beam pipeline option takes
    (Beam logs "Discarding unparseable args" and goes on: `--splitbytes 1000` prepared with
    the default unit size and exit 0, issue 54)."""
    import argparse  # pylint: disable=g-import-not-at-top

    if not beam_args:
        return []
    level = logging.root.level  # Beam's import warns on the root logger that apitools is absent
    logging.root.setLevel(logging.ERROR)
    try:
        from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
    finally:
        logging.root.setLevel(level)

    def subclasses(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    parser = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve",
                                     add_help=False)
    for cls in [PipelineOptions, *set(subclasses(PipelineOptions))]:
        cls._add_argparse_args(parser)  # pylint: disable=protected-access  (Beam's own way)
    return parser.parse_known_args(list(beam_args))[1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli_help.Parser(prog="python -m xlm_jax.data.prepared.prepare",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True,
                        help="comma-separated task names, mixture names or globs")
    parser.add_argument("--output_dir", required=True, help="local or gs:// directory")
    parser.add_argument("--module", default="xlm_jax_tasks.demo",
                        help="comma-separated modules that register the tasks")
    parser.add_argument("--split_bytes", type=int, default=DEFAULT_SPLIT_BYTES,
                        help="bytes of a plain-text file per work unit (default 256 MiB)")
    args, beam_args = parser.parse_known_args(argv)
    unknown = unknown_flags(beam_args)
    if unknown:
        ours = [o for a in parser._actions for o in a.option_strings]  # pylint: disable=protected-access
        close = difflib.get_close_matches(unknown[0].split("=", 1)[0], ours, n=1)
        parser.error(f"{unknown[0]} is neither a flag of prepare nor a Beam pipeline option"
                     + (f"; did you mean {close[0]}?" if close else ""))
    cli_help.quiet_tensorflow()
    logging.getLogger("apache_beam").setLevel(logging.ERROR)  # Beam's own notes, relayed
    with choice.preparing():
        for name in args.module.split(","):
            try:
                importlib.import_module(name)
            except ImportError as e:
                parser.error(f"--module {name!r} cannot be imported ({e})")
            except (OSError, ValueError) as e:  # a registration refused: a missing corpus file
                if cli_help.debug_wanted():
                    raise
                print(f"prepare: --module {name}: {type(e).__name__}: {e}", file=sys.stderr)
                return 1
    try:
        prepare(args.tasks.split(","), args.output_dir, args.split_bytes, beam_args)
    except (ValueError, OSError, WorkerFailed) as e:
        if cli_help.debug_wanted():
            raise
        print(f"prepare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    cli_help.exit_with(main)
