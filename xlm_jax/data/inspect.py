"""Look at what a task feeds the model, or check a mixture's sampling rates.

  python -m xlm_jax.data.inspect --task demo_mono_en --n 3
      prints 3 converted examples, one aligned table each: token piece, id, position,
      segment, pair side, language (VECO / mixup examples print their two rows).
  python -m xlm_jax.data.inspect --mixture demo_mono --stats 2000
      samples 2000 examples and prints each member's observed frequency next to the
      expected alpha-smoothed rate n^alpha / sum n^alpha.

`--module` (default `xlm_jax_tasks.demo`) is imported first: it registers the tasks. Run from the
repository root so that `tasks` is importable. `--prepared DIR` has the task read what
`python -m xlm_jax.data.prepared.prepare` wrote in DIR (`loop.train.prepared_data`), so the
tables show what a run on prepared data reads (its records, in its global shuffle).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
from typing import Optional, Sequence

import numpy as np

from xlm_jax import cli_help
from xlm_jax.data.features import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ExampleKind, example_kind

__all__ = ["MemberFrequency", "format_example", "mixture_frequencies", "main"]


def _import_registering_module(module: str, prepared_dir: str | None, name: str) -> None:
    from xlm_jax.data import registry  # pylint: disable=g-import-not-at-top

    try:
        registry.import_tasks(module, prepared_dir, [name])
    except ImportError as e:
        raise SystemExit(f"inspect: cannot import --module {module!r} ({e}); run from the "
                         "repository root or pass the module that registers your tasks") from e


def _piece(vocab, token_id: int) -> str:
    """The piece of a fairseq/XLM-R id (specials by name), for display."""
    specials = {BOS_ID: "<s>", PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}
    if token_id in specials:
        return specials[token_id]
    if token_id == getattr(vocab, "mask_id", None):
        return "<mask>"
    tokenizer = getattr(vocab, "tokenizer", None)
    if tokenizer is not None and 0 < token_id - 1 < tokenizer.GetPieceSize():
        return tokenizer.IdToPiece(token_id - 1)
    return vocab.decode([token_id])


def format_example(example: dict[str, np.ndarray], kind: str | ExampleKind, vocab,
                   languages: Sequence[str] = ()) -> str:
    """One aligned table per row of a converted example (padding omitted, then counted)."""
    lines = []
    for prefix in example_kind(kind).prefixes:
        ids = example[prefix + "input_ids"]
        real = np.nonzero(example[prefix + "segment_ids"])[0]
        n = int(real[-1]) + 1 if real.size else 0
        if prefix:
            lines.append(f"  [{prefix.rstrip('_')}]")
        lines.append(f"  {'i':>4}  {'piece':<16} {'id':>7} {'pos':>4} {'seg':>4} {'side':>4}"
                     f"  lang")
        for i in range(n):
            lang = int(example[prefix + "lang_ids"][i])
            lang_name = languages[lang - 1] if 0 < lang <= len(languages) else str(lang)
            lines.append(
                f"  {i:>4}  {_piece(vocab, int(ids[i]))[:16]:<16} {int(ids[i]):>7} "
                f"{int(example[prefix + 'positions'][i]):>4} "
                f"{int(example[prefix + 'segment_ids'][i]):>4} "
                f"{int(example[prefix + 'pair_side'][i]):>4}  {lang_name}")
        lines.append(f"  ... {len(ids) - n} padding positions (id {PAD_ID})")
    return "\n".join(lines)


def _user_cache() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def registered_length(name: str, default: int = 64) -> int:
    """The sequence length task or mixture `name` was registered with (its first task's), or
    `default` for a task registered without one."""
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.data import registry  # pylint: disable=g-import-not-at-top

    provider = registry.get_provider(name)
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    definition = getattr(tasks[0], "xlm_jax_definition", None) or {}
    length = definition.get("sequence_length") if isinstance(definition, dict) else None
    return int(length) if length else default


def print_examples(name: str, n: int, sequence_length: int, seed: int) -> None:
    """Prints `n` converted examples of a task or mixture."""
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.data import converters, registry  # pylint: disable=g-import-not-at-top

    provider = registry.get_provider(name)
    kind = registry.provider_kind(provider)
    tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
    vocab = tasks[0].output_features[kind.prefixes[0] + "input_ids"].vocabulary
    languages = getattr(tasks[0], "xlm_jax_languages", ())
    ds = seqio.get_dataset(provider, converters.task_feature_lengths(kind, sequence_length),
                           kind.converter(), shuffle=True, seed=seed,
                           num_epochs=None, verbose=False)
    for i, ex in enumerate(ds.take(n).as_numpy_iterator()):
        print(f"example {i} of {name} (kind {kind.name}, length {sequence_length})")
        print(format_example(ex, kind, vocab, languages))


@dataclasses.dataclass(frozen=True)
class MemberFrequency:
    """Expected (alpha-smoothed) and observed share of one mixture member's examples."""

    task: str
    expected: float
    observed: float
    count: int


def mixture_frequencies(name: str, num_examples: int, sequence_length: int = 64,
                        seed: int = 0) -> list[MemberFrequency]:
    """Samples `num_examples` task examples from mixture `name` (before conversion, so one
    example = one segment / pair) and counts which member each came from."""
    from xlm_jax.data import converters, registry  # pylint: disable=g-import-not-at-top

    if num_examples < 1:
        raise ValueError(f"--stats must be >= 1, got {num_examples}")
    provider = registry.get_provider(name)
    kind = registry.provider_kind(provider)
    expected = registry.mixture_rates(name)
    lengths = converters.task_feature_lengths(kind, sequence_length)
    kwargs = dict(sequence_length=lengths, split="train", shuffle=True, seed=seed,
                  num_epochs=None)
    if hasattr(provider, "tasks"):
        kwargs["passthrough_features"] = ["task"]
    ds = provider.get_dataset(**kwargs).map(lambda ex: ex["task"]).take(num_examples)
    counts: collections.Counter = collections.Counter()
    for block in ds.batch(4096).as_numpy_iterator():
        counts.update(t.decode() for t in block)
    return [MemberFrequency(t, expected[t], counts.get(t, 0) / num_examples, counts.get(t, 0))
            for t in sorted(expected)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli_help.Parser(prog="python -m xlm_jax.data.inspect",
                             description=__doc__.split("\n\n")[0],
                             formatter_class=cli_help.HelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", help="task or mixture whose examples to print")
    which.add_argument("--mixture", help="mixture whose sampling frequencies to check")
    parser.add_argument("--n", type=int, default=3, help="examples to print (--task)")
    parser.add_argument("--stats", type=int, default=1000,
                        help="examples to sample (--mixture)")
    parser.add_argument("--module", default="xlm_jax_tasks.demo",
                        help="module that registers the tasks")
    parser.add_argument("--sequence_length", type=int, default=None,
                        help="length the examples are built at (default: the length the task "
                        "was registered with)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--prepared", default=None, metavar="DIR",
                        help="read the tasks from this prepared directory (data.prepared.prepare)")
    args = parser.parse_args(argv)
    cli_help.quiet_tensorflow()
    return cli_help.run_reporting(lambda: _inspect(args))


def _inspect(args: argparse.Namespace) -> int:
    """Prints the task's examples or the mixture's observed and expected rates; returns 0."""
    # corpus-size caches go under the user cache, never into the user's data folder
    previous = os.environ.get("XLM_JAX_STATS_DIR")
    os.environ["XLM_JAX_STATS_DIR"] = previous or os.path.join(_user_cache(), "xlm_jax", "stats")
    try:  # None: the raw files, whatever this process read before
        _import_registering_module(args.module, args.prepared, args.task or args.mixture)
        return _show(args)
    finally:
        if previous is None:
            del os.environ["XLM_JAX_STATS_DIR"]


def _show(args: argparse.Namespace) -> int:
    length = args.sequence_length or registered_length(args.task or args.mixture)
    if args.task:
        print_examples(args.task, args.n, length, args.seed)
        return 0
    rows = mixture_frequencies(args.mixture, args.stats, length, args.seed)
    print(f"mixture {args.mixture}: {args.stats} examples, seed {args.seed}")
    print(f"  {'task':<32} {'expected':>9} {'observed':>9} {'diff':>7} {'count':>7}")
    for r in rows:
        print(f"  {r.task:<32} {r.expected:>9.4f} {r.observed:>9.4f} "
              f"{r.observed - r.expected:>+7.4f} {r.count:>7}")
    return 0


if __name__ == "__main__":
    cli_help.exit_with(main)
