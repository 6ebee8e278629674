"""What the objectives of a run declare, checked before anything is compiled.

Each objective (`xlm_jax.objectives.base.Objective`) declares the example kind it reads, the
modules it owns, the logical axis rules those modules and its state need, and the encoder
parameters it reads directly. A mistake in any of them would otherwise surface deep inside
`jit` (an unnamed sharding error, a KeyError in a traced function) or not at all (a missing
rule silently replicates an array; a mixup task fed to a masked LM trains on the wrong
features). Every error here is one line naming the objective and the offending name.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax

from xlm_jax.data.features import feature_names
from xlm_jax.objectives.base import OBJECTIVES, Objective

Rules = tuple[tuple[str, Any], ...]


def module_owners(objectives: Sequence[Objective]) -> dict[str, list[str]]:
    """`{module name: [objective names]}` over the mixture.

    Raises ValueError when two objectives declare one module name and not both of them list
    it in `shared_modules` (a second XLCo with the same name would otherwise silently train
    the first one's projection).
    """
    owners: dict[str, list[str]] = {}
    for o in objectives:
        for name in o.modules():
            if "/" in name or not name:
                raise ValueError(f"objective {o.name!r}: module name {name!r} must be a "
                                 "non-empty name without '/'")
            if name in owners:
                first = next(x for x in objectives if x.name == owners[name][0])
                if name not in o.shared_modules or name not in first.shared_modules:
                    raise ValueError(
                        f"objectives {first.name!r} and {o.name!r} both declare module "
                        f"{name!r}; give one of them another name, or list it in both "
                        "objectives' shared_modules to train one shared module")
            owners.setdefault(name, []).append(o.name)
        for name in o.shared_modules:
            if name not in o.modules():
                raise ValueError(f"objective {o.name!r} lists {name!r} in shared_modules but "
                                 "does not declare such a module")
    return owners


def merge_rules(base: Rules, objectives: Sequence[Objective],
                overrides: Sequence[tuple[str, Any]] = ()) -> Rules:
    """The run's rule table: `base` (the standard table), then each objective's rules for its
    own logical names, then the run's `overrides` (which win).

    An objective may not redefine a standard name, and two objectives may not map one name
    differently: either would change the layout of arrays that other code owns.
    """
    rules = dict(base)
    declared_by: dict[str, str] = {}
    for o in objectives:
        for name, axes in o.logical_axis_rules():
            if name in dict(base) and dict(base)[name] != axes:
                raise ValueError(f"objective {o.name!r} declares logical axis rule {name!r} -> "
                                 f"{axes!r}, but {name!r} is a standard name mapped to "
                                 f"{dict(base)[name]!r}; use a name of its own or "
                                 "loop.train.axis_rule_overrides")
            if name in declared_by and rules[name] != axes:
                raise ValueError(f"objectives {declared_by[name]!r} and {o.name!r} declare "
                                 f"different rules for logical axis {name!r} "
                                 f"({rules[name]!r} vs {axes!r})")
            rules[name] = axes
            declared_by.setdefault(name, o.name)
    for name, axes in overrides:
        rules[name] = axes
    return tuple(rules.items())


def _logical_names(tree: Any) -> list[tuple[str, str]]:
    """(leaf path, logical name) for every named axis of the boxed leaves of `tree`."""
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_box)[0]:
        if isinstance(leaf, nn.Partitioned):
            for name in leaf.names:
                if name is not None:
                    out.append((jax.tree_util.keystr(path), name))
    return out


def check_logical_names(objectives: Sequence[Objective], params: Mapping[str, Any],
                        obj_state: Mapping[str, Any], rules: Rules) -> None:
    """Every logical axis name of the objectives' modules and states has a rule.

    `params`/`obj_state` are the boxed (e.g. `jax.eval_shape`d) initial values. Without this
    check flax maps an unknown name to "replicated" and the array is silently copied whole
    onto every device.
    """
    known = {name for name, _ in rules}
    owners = module_owners(objectives)
    trees = [(owners[m][0], f"module {m!r}", p) for m, p in params.get(OBJECTIVES, {}).items()]
    trees += [(o.name, "state", obj_state.get(o.name, {})) for o in objectives]
    for objective, what, tree in trees:
        for path, name in _logical_names(tree):
            if name not in known:
                raise ValueError(f"objective {objective!r}: {what} parameter {path} uses "
                                 f"logical axis {name!r}, which has no rule; declare it in "
                                 "the objective's logical_axis_rules() or add it with "
                                 "loop.train.axis_rule_overrides")


def check_encoder_params_used(objectives: Sequence[Objective], params: Mapping[str, Any]
                              ) -> None:
    """Every encoder parameter an objective says it reads (`encoder_params_used`) exists."""
    for o in objectives:
        for path in o.encoder_params_used:
            try:
                o.encoder_param(params, path)
            except KeyError as e:
                raise ValueError(e.args[0]) from None


def check_shared_shapes(objectives: Sequence[Objective], init_modules: Any) -> None:
    """Objectives sharing a module declare it with identical parameter shapes.

    `init_modules(objective) -> {module: params}` (abstract shapes suffice)."""
    seen: dict[str, tuple[str, Any]] = {}
    for o in objectives:
        if not o.shared_modules:
            continue
        shapes = init_modules(o)
        for name in o.shared_modules:
            mine = jax.tree_util.tree_map(lambda x: tuple(x.shape), nn.meta.unbox(shapes[name]))
            if name in seen and seen[name][1] != mine:
                raise ValueError(f"objectives {seen[name][0]!r} and {o.name!r} share module "
                                 f"{name!r} but declare it with different parameter shapes")
            seen.setdefault(name, (o.name, mine))


def check_kinds(objectives: Sequence[Objective], task_kinds: Mapping[str, list[tuple[str, str]]]
                ) -> None:
    """Each objective reads only features its example kind has, and its tasks hold examples
    of that kind.

    `task_kinds[objective name]` = [(task name, kind)] for every seqio Task behind that
    objective's task or mixture (its registered kind), or for its synthetic or in-memory
    stream (the kind it makes); `train.streams.task_kinds` lists them.
    """
    for o in objectives:
        missing = sorted(set(o.features()) - set(feature_names(o.kind)))
        if missing:
            raise ValueError(f"objective {o.name!r} ({type(o).__name__}) reads feature(s) "
                             f"{missing}, which examples of kind {o.kind!r} do not have "
                             f"(they have {', '.join(feature_names(o.kind))})")
        for task, kind in task_kinds.get(o.name, []):
            if kind != o.kind:
                raise ValueError(f"objective {o.name!r} ({type(o).__name__}) reads examples of "
                                 f"kind {o.kind!r}, but task {task} holds examples of kind "
                                 f"{kind!r}")
