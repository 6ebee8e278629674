"""The objective interface the trainer calls; it knows nothing about any one paper.

Parameters: the train state's `params` is `{"encoder": <Transformer params>, "objectives":
{module name: <params of that objective-owned module>}}`. An objective reads the shared encoder
through `encoder_params(params)` and its own modules (a generator, a head, a projection)
through `module_params(params, name)`; gradients flow to whatever its loss touches, so a
generator that reads the encoder's word embeddings (XLM-E's tied embeddings) trains them too.
What an objective declares, the trainer checks before compiling (each error names the
objective and the offending name):
- `kind`: the example kind of its data, a name of `xlm_jax.data.features.KINDS` (mono, pair,
  split_pair, mixup_pair); every task it is given must make that kind (a seqio task's
  registered kind, a synthetic or in-memory stream's own);
- `modules()`: `{name: flax module}` it owns; `init_modules` initialises them (boxed, with
  logical axis names). Module names are one namespace over the mixture: two objectives may
  use one name only if both list it in `shared_modules` and declare identical shapes (XLM-E's
  MRTD and TRTD share a generator); otherwise it is an error;
- `logical_axis_rules()`: rules for the logical axis names its modules and state introduce
  (the XLCo queue), merged into the run's rule table; a name without a rule is an error;
- `encoder_params_used`: paths of encoder parameters it reads directly (tied embeddings),
  checked to exist;
- `run_arguments`: constructor keywords the trainer fills from the run (`RUN_ARGUMENTS`: the
  run's language table, the task's languages), so that everything that depends on the run's
  languages is resolved, or refused, when the objective is built.

An objective turns one batch of its data stream into a loss made of named *terms*. It is
split in two so that gradient accumulation is exact:
- `prepare(batch, rng)` corrupts the *global* batch on device (masking, sampling) before it is
  split into microbatches, so 4 x B/4 sees exactly the corruption that one step of B sees;
- `counts(prepared)` gives each term's unit count (masked predictions, tokens, sentences) on
  that prepared *global* batch, before the split;
- `loss(params, prepared, rng, state)` returns a `LossOutput` with each term's *sum* over its
  units in the (micro)batch, and `Metric`s, (total, count) pairs that add over microbatches.
`term_weights` declares the terms with their weights within the objective (XLM-E's lambda); the
objective's loss is `L_o = sum_t term_weights[t] * losses[t] / counts[t]` (`objective_loss`),
and the trainer combines the objectives (`xlm_jax.train.step.make_train_step`). Sums over any
split of the rows, divided by counts of the whole batch, make the microbatches' losses add up
to the whole batch's; and no global count has to ride in the prepared batch.
Objectives with state (InfoXLM's momentum encoder and queue) keep it in `init_state` /
`after_update`, which the trainer shards and checkpoints with the rest of the train state:
- `init_state(params)` gets the *boxed* parameters (`nn.Partitioned`, logical axis names), so a
  copy made with `jax.tree_util.tree_map` (an EMA encoder) is sharded exactly like the
  parameters; new arrays (a queue) may be boxed with their own logical names;
- `loss` may hand per-row arrays to the update through `LossOutput.state_inputs` (the keys a
  queue takes in); the trainer concatenates them over microbatches in global row order and
  passes them to `after_update(params, state, inputs)` after the optimizer step;
- `prefill_batches(batch_size)` > 0 asks for that many batches of its stream before the first
  optimizer step, each `prepare`d and given to `prefill(params, state, prepared, rng)`:
  forward passes of the initial parameters, no gradient, that fill the state (InfoXLM's queue,
  as unilm's `fill_queue`). The trainer runs it once per run (`xlm_jax.train.prefill`); the
  batches it takes are counted in the stream's position, so a resume continues exactly.
What "not learning" looks like in its own metrics, an objective declares in `health_checks()`
(`HealthCheck`s; none by default): the trainer reads them on the metrics it logs and warns
once per check that fires (`xlm_jax.train.health`, which holds the thresholds).
"""
from __future__ import annotations

import abc
import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.data.features import KINDS, example_kind, feature_names, valid_kinds

if TYPE_CHECKING:
    from xlm_jax.models.transformer import Transformer

Array = jax.Array
Batch = dict[str, Array]


def safe_ratio(total: Array, count: Array) -> Array:
    """total / count, and 0 where count is 0 (a precision with no predicted positives)."""
    total, count = jnp.asarray(total, jnp.float32), jnp.asarray(count, jnp.float32)
    return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


@flax.struct.dataclass
class Metric:
    """A reported ratio as (total, count): both add over microbatches (and over anything else
    a caller merges), the value is total / count (0 when count is 0), e.g. accuracy =
    Metric(correct predictions, predictions), precision = Metric(true positives, predicted
    positives). The semantics of `clu.metrics.Average`, which is not used: clu is no core
    dependency, and its 0 / 0 is NaN."""

    total: Array
    count: Array

    def value(self) -> Array:
        return safe_ratio(self.total, self.count)


@flax.struct.dataclass
class LossOutput:
    """losses: `{term: summed loss}` over this (micro)batch's units of each term (the keys of
    `Objective.term_weights`); metrics: `{name: Metric}`, reported as `<objective>/<name>`;
    state_inputs: per-row arrays [rows, ...] for `Objective.after_update` (none by default)."""

    losses: dict[str, Array]
    metrics: dict[str, Metric] = dataclasses.field(default_factory=dict)
    state_inputs: dict[str, Array] = dataclasses.field(default_factory=dict)


ENCODER = "encoder"  # params["encoder"]: the shared Transformer
OBJECTIVES = "objectives"  # params["objectives"][module name]: objective-owned modules
# The train step adds ROW_IDS to every prepared batch: [rows] int32, each row's index in the
# step's global batch of its objective. Objectives hand it to the encoder (`mlm.encoder_kwargs`
# does) so that dropout masks are drawn per row and gradient accumulation equals the whole
# batch with dropout on (`models.common.keep_mask`).
ROW_IDS = "row_ids"


def check_kind(owner: str, kind: str, allowed: Sequence[str] = KINDS) -> str:
    """The name of `kind`'s record (an old name resolved: "veco" -> "split_pair") if it is one
    of `allowed`, else a one-line ValueError naming `owner`, the value and `allowed`."""
    try:
        name = example_kind(kind).name
    except ValueError:
        name = None
    if name not in allowed:
        raise ValueError(f"{owner}: kind={kind!r} must be one of {valid_kinds(allowed)}")
    return name


# How a metric shows that its objective is not learning (`HealthCheck.condition`); the thresholds
# are the trainer's (`xlm_jax.train.health.HealthConfig`), the metric and its reference value
# the objective's:
# - near_zero: the value is ~0 (a detector that finds nothing: RTD's precision, recall);
# - near_baseline: the value is within a hair of (or below) `baseline`, what a trivial answer
#   scores (RTD's accuracy against answering "original" everywhere);
# - near_chance: the value is within a factor of `baseline`, the chance rate (XLCo's accuracy
#   against 1 / (negatives + 1));
# - below_floor: the value is at or below a small absolute floor (a masked LM's accuracy: the
#   most-frequent-token rate is not among the metrics, so the floor is its proxy);
# - rising: the value's mean over the last window is above the window's before (a loss);
# - unmoved: at the run's last step, the value's mean over the last window is not above its
#   mean over the objective's first window by more than their noise (a masked LM's accuracy
#   that training did not raise, wherever it started).
HEALTH_CONDITIONS = ("near_zero", "near_baseline", "near_chance", "below_floor", "rising",
                     "unmoved")


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """One way an objective's metric shows that it is not learning, as the objective declares
    it (`Objective.health_checks`); the trainer evaluates it on the metric's mean over a
    window of the objective's steps after a warm-up and warns once if it holds.

    metric: the metric read, unprefixed (`rtd_recall`; the trainer reads `<objective>/...`).
    condition: one of `HEALTH_CONDITIONS`.
    meaning: what the condition says about the objective, for the warning
      ("the discriminator answers 'original' everywhere (collapsed)").
    knob: the first setting to try, for the warning ("a larger rtd_weight (lambda)").
    baseline: near_baseline and near_chance only: the reference value from the objective's
      window metrics (unprefixed, means over the window), or None where they do not give one;
      `baseline_name` says what it is ("1 - replaced share").
    ready: a metric that must be 1 at a step for the step to count (XLCo's `queue_fill`).
    after_updates: the objective's first updates that do not count (an objective whose loss
      starts late: BTMLM's `start_step`).
    """

    metric: str
    condition: str
    meaning: str
    knob: str
    baseline: Callable[[Mapping[str, float]], float | None] | None = None
    baseline_name: str = ""
    ready: str | None = None
    after_updates: int = 0

    def __post_init__(self) -> None:
        if self.condition not in HEALTH_CONDITIONS:
            raise ValueError(f"HealthCheck({self.metric!r}): condition={self.condition!r} must "
                             f"be one of {', '.join(HEALTH_CONDITIONS)}")
        needs = self.condition in ("near_baseline", "near_chance")
        if needs != (self.baseline is not None):
            raise ValueError(f"HealthCheck({self.metric!r}): condition={self.condition!r} "
                             f"{'needs' if needs else 'takes no'} baseline")


def accuracy_floor_check(who: str, metric: str = "accuracy", after_updates: int = 0
                         ) -> HealthCheck:
    """The check of a masked LM's (or a decoder's) token accuracy: at or below the floor, it
    is right less often than always answering a corpus's commonest token would be."""
    return HealthCheck(
        metric, "below_floor", after_updates=after_updates,
        meaning=f"{who} is right less often than always answering the commonest token would be "
                "(it learns nothing)",
        knob="a higher learning rate (OptimizerConfig.learning_rate)")


def accuracy_unmoved_check(who: str, metric: str = "accuracy", after_updates: int = 0
                           ) -> HealthCheck:
    """The check that a masked LM's token accuracy rose at all over the run: the issue of a
    run whose masked LM stayed near 5% for 600 steps while its retrieval fell, and no check
    said anything (the floor is below 5%)."""
    return HealthCheck(
        metric, "unmoved", after_updates=after_updates,
        meaning=f"{who}'s accuracy has not moved from where the run started it (it learns "
                "nothing more from this data)",
        knob="a higher learning rate (OptimizerConfig.learning_rate), or more steps")


def masked_lm_checks(who: str, metric: str = "accuracy", after_updates: int = 0
                     ) -> tuple[HealthCheck, HealthCheck]:
    """A masked LM's two accuracy checks: below the floor, and not moved from its start."""
    return (accuracy_floor_check(who, metric, after_updates),
            accuracy_unmoved_check(who, metric, after_updates))


def loss_rising_check(metric: str = "loss", who: str = "the loss", ready: str | None = None,
                      after_updates: int = 0) -> HealthCheck:
    """The check of a loss that rises over a window: what the trainer watches in every
    objective's `loss` unless the objective declares a "rising" check of its own."""
    return HealthCheck(metric, "rising", ready=ready, after_updates=after_updates,
                       meaning=f"{who} rises (the updates undo what was learnt)",
                       knob="a lower learning rate (OptimizerConfig.learning_rate) or a "
                            "longer warm-up (OptimizerConfig.warmup_steps)")


# What the trainer can pass to an objective's constructor (`Objective.run_arguments`):
# - languages: the run's `lang_ids` table, language codes with id i + 1 = languages[i]; None
#   when the streams are synthetic and carry no codes;
# - task_languages: the languages the objective's task rows can carry, when the registry
#   records them (parallel tasks); None otherwise.
RUN_ARGUMENTS = ("languages", "task_languages")


class Objective(abc.ABC):
    """Base class: subclasses set `name` and `kind` and implement `prepare`, `counts` and
    `loss` (and `term_weights` for more than one loss term); objectives with modules of their
    own also implement `modules` and `example_inputs`."""

    name: str = "objective"
    kind: str = "mono"  # the example kind of its data: mono | pair | split_pair | mixup_pair
    # {term: weight within the objective}; one term "loss" by default. An objective with
    # several terms sets its own (XLM-E: {"mlm": 1.0, "rtd": 50.0}).
    term_weights: Mapping[str, float] = types.MappingProxyType({"loss": 1.0})
    shared_modules: tuple[str, ...] = ()  # module names it shares with other objectives
    encoder_params_used: tuple[str, ...] = ()  # e.g. ("embeddings/word_embeddings/embedding",)
    # Keyword arguments of its constructor that the trainer fills from the run, beside `model`
    # and `name` (`RUN_ARGUMENTS`); none by default. ERNIE-M's BTMLM takes the run's language
    # table to resolve its target languages; Translation takes it and its task's languages to
    # map languages to tokens and refuse one without a token, all before compiling.
    run_arguments: tuple[str, ...] = ()

    # -- declarations ---------------------------------------------------------------------

    def features(self) -> tuple[str, ...]:
        """The batch features it reads; by default every feature of its kind."""
        return feature_names(self.kind)

    def modules(self) -> Mapping[str, nn.Module]:
        """Flax modules this objective owns, by name (their params live in
        `params["objectives"][name]`); none by default."""
        return {}

    def example_inputs(self, name: str) -> tuple[Any, ...]:
        """Positional inputs with which `modules()[name].init` builds its parameters."""
        raise NotImplementedError(f"objective {self.name!r} declares module {name!r} but does "
                                  "not implement example_inputs")

    def init_modules(self, rng: jax.Array) -> dict[str, Any]:
        """`{name: boxed params}` of `modules()`; override for modules initialised through a
        method other than `__call__`."""
        out = {}
        for i, (name, module) in enumerate(sorted(self.modules().items())):
            out[name] = module.init(jax.random.fold_in(rng, i), *self.example_inputs(name))[
                "params"]
        return out

    def logical_axis_rules(self) -> Sequence[tuple[str, Any]]:
        """Rules (logical name -> mesh axes) for names its modules and state introduce."""
        return ()

    # -- parameter access -----------------------------------------------------------------

    @staticmethod
    def encoder_params(params: Mapping[str, Any]) -> Any:
        """The shared encoder's parameters of a train-state `params` tree."""
        return params[ENCODER]

    def module_params(self, params: Mapping[str, Any], name: str) -> Any:
        """The parameters of the objective module `name`."""
        try:
            return params[OBJECTIVES][name]
        except KeyError:
            raise KeyError(f"objective {self.name!r}: no parameters for module {name!r}; "
                           f"modules in the state: {sorted(params.get(OBJECTIVES, {}))}"
                           ) from None

    def encoder_param(self, params: Mapping[str, Any], path: str) -> Any:
        """One encoder parameter by '/'-separated path (list it in `encoder_params_used`)."""
        node = params[ENCODER]
        for part in path.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"objective {self.name!r} reads encoder parameter {path!r}, "
                               "which the encoder does not have")
            node = node[part]
        return node

    # -- the computation ------------------------------------------------------------------

    @abc.abstractmethod
    def prepare(self, batch: Batch, rng: Array) -> Batch:
        """Device-side corruption of the whole global batch; no parameters involved."""

    @abc.abstractmethod
    def counts(self, prepared: Batch) -> dict[str, Array]:
        """`{term: number of its units}` (masked predictions, tokens, sentences) in a prepared
        batch; the trainer calls it on the whole global batch, before the microbatch split."""

    @abc.abstractmethod
    def loss(self, params: Any, prepared: Batch, rng: Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        """Each term's summed loss, and the metrics, of a prepared (micro)batch."""

    def flops_per_example(self, seq_len: int) -> float | None:
        """An analytic count of the model matmul FLOPs of one example of its stream, forward +
        backward (`xlm_jax.models.flops` has the per-pass counts), or None (the default):
        then the trainer counts the dot products in the jaxpr of the loss's gradient
        (`xlm_jax.train.step_flops.jaxpr_flops_per_example`), which is right for any objective
        and costs one trace at start-up. Override it for a closed form, or where the jaxpr
        cannot see the work (a while loop runs its body an unknown number of times)."""
        del seq_len
        return None

    def adapt_pretrained(self, params: Any) -> Any:
        """Called once with the train-state parameters right after `init_from` loaded the
        encoder; may initialise the objective's modules from it (VECO's translation decoder
        takes the stack's layers) and returns the parameters. Unchanged by default."""
        return params

    def init_state(self, params: Any) -> Any:
        """Objective state (EMA encoders, queues) from the boxed initial parameters (the whole
        `{"encoder", "objectives"}` tree; see the module docstring); none by default. Called again with the loaded parameters when a run
        starts from a pretrained checkpoint, so an EMA copy starts from those."""
        return {}

    def after_update(self, params: Any, state: Any, inputs: dict[str, Array]) -> Any:
        """Called after each optimizer step with the updated parameters and this step's
        `LossOutput.state_inputs` (global batch rows, in order); e.g. EMA and enqueue."""
        return state

    def prefill_batches(self, batch_size: int) -> int:
        """How many batches of its stream (of `batch_size` global rows) the objective takes
        before the first optimizer step to fill its state with `prefill`; 0 (the default):
        none. The trainer asks once, at a run's start."""
        del batch_size
        return 0

    def prefill(self, params: Any, state: Any, prepared: Batch, rng: Array) -> Any:
        """The state after one batch of the fill before training: `prepared` is a batch of its
        stream after `prepare` (with `ROW_IDS`), `params` the initial parameters (loaded ones
        with `init_from`), `rng` the batch's loss key. Forward passes only: nothing here is
        differentiated. Unchanged by default."""
        del params, prepared, rng
        return state

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """What "not learning" looks like in its metrics (see `HealthCheck`); none by default.
        Beside them the trainer watches every objective's `loss` for a rise, unless the
        objective declares a "rising" check of its own (which loss it watches)."""
        return ()


# ----------------------------------------------------------------------------- the loss terms


def check_terms(objective: Objective, got: Mapping[str, Any], what: str) -> None:
    """A ValueError naming the objective unless `got` (what `what` returned) has exactly the
    terms of its `term_weights`."""
    want = sorted(objective.term_weights)
    if sorted(got) != want:
        raise ValueError(f"objective {objective.name!r}: {what} gives the terms {sorted(got)} "
                         f"but term_weights declares {want}")


def objective_loss(objective: Objective, losses: Mapping[str, Array],
                   counts: Mapping[str, Array]) -> Array:
    """L_o = sum_t term_weights[t] * losses[t] / counts[t] (a term with no units adds 0):
    the objective's loss, before its weight in the mixture."""
    check_terms(objective, losses, "loss()")
    check_terms(objective, counts, "counts()")
    return sum(float(w) * safe_ratio(losses[t], counts[t])
               for t, w in sorted(objective.term_weights.items()))


def report(objective: Objective, losses: Mapping[str, Array], metrics: Mapping[str, Metric],
           counts: Mapping[str, Array]) -> dict[str, Array]:
    """The objective's reported values, unprefixed: `loss` (`objective_loss`), with more than
    one term each term's mean as `<term>_loss`, `count` (the units of all its terms together),
    and every metric's value. A metric named like one of these is a ValueError."""
    out = {"loss": objective_loss(objective, losses, counts),
           "count": sum(jnp.asarray(c, jnp.float32) for _, c in sorted(counts.items()))}
    if len(objective.term_weights) > 1:
        out.update({f"{t}_loss": safe_ratio(losses[t], counts[t]) for t in sorted(losses)})
    clash = sorted(set(metrics) & set(out))
    if clash:
        raise ValueError(f"objective {objective.name!r}: metric names {clash} are reported by "
                         "the trainer already (loss, count, <term>_loss)")
    out.update({k: m.value() for k, m in metrics.items()})
    return out


# ----------------------------------------------------------------------------- the parameter tree


@dataclasses.dataclass(frozen=True)
class WeightedObjective:
    """An objective of the mixture with its loss weight."""

    objective: Objective
    weight: float = 1.0

    @property
    def name(self) -> str:
        return self.objective.name


def init_batch_shapes(model: Transformer, batch_size: int, seq_len: int) -> dict[str, Any]:
    """Dummy encoder inputs `{"input_ids", ["lang_ids"], ["encoder_states"]}` of the shapes
    `model.init` needs: language ids when the model has a language table, a memory when it
    has cross-attention."""
    ids = jnp.ones((batch_size, seq_len), jnp.int32)
    kw: dict[str, Any] = {}
    if model.config.num_languages:
        kw["lang_ids"] = jnp.zeros((batch_size, seq_len), jnp.int32)
    if model.config.cross_attention:
        kw["encoder_states"] = jnp.zeros((batch_size, seq_len, model.config.hidden_size),
                                         model.config.compute_dtype)
    return {"input_ids": ids, **kw}


def init_params(model: Transformer, objectives: Sequence[WeightedObjective], seq_len: int,
                rng: Array) -> dict[str, Any]:
    """`{"encoder": ..., "objectives": {module: ...}}`, boxed with logical axis names. A module
    shared by several objectives (`Objective.shared_modules`) is initialised once, by the
    first objective of the mixture that declares it. Here rather than in the trainer so that
    an objective (and its tests) can build the tree without the trainer."""
    enc_rng, obj_rng = jax.random.split(rng)
    inputs = init_batch_shapes(model, 1, seq_len)
    encoder = model.init(enc_rng, inputs.pop("input_ids"), **inputs)["params"]
    modules: dict[str, Any] = {}
    for i, o in enumerate(objectives):
        for name, p in o.objective.init_modules(jax.random.fold_in(obj_rng, i)).items():
            modules.setdefault(name, p)
    return {ENCODER: encoder, OBJECTIVES: modules}
