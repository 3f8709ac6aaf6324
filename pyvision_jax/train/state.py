"""Train state (params, optimizer state, step, rng) and the AdamW optimizer of the recipe.

Frozen parameter groups (the vision tower by default) are left out of differentiation and of
the optimizer: the optimizer state covers only the trainable groups (`split_trainable`), the
train step passes frozen arrays through untouched, so they stay bit-identical and cost no
gradient or Adam memory.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pyvision_jax.models.sharding import param_shardings

SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping; defaults are the PyVision-RL recipe."""

    lr: float = 1e-6
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Global-norm clip over trainable gradients; <= 0 disables it."""
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    """Length of the decay for "cosine"/"linear" (to 0 after warmup)."""
    frozen_prefixes: tuple[str, ...] = ("visual",)
    """Top-level parameter groups that are not trained (default: the vision tower)."""
    lr_multipliers: tuple[tuple[str, float], ...] = ()
    """(regex, factor): the update of every parameter whose path ("model/norm/scale") the
    regex matches is multiplied by factor (the first match wins); none by default."""
    uniform_updates: tuple[str, ...] = ()
    """Regexes: every parameter whose path one matches gets its gradient replaced by the mean
    over its entries, so all its entries move by one shared amount (a scalar offset). On a
    final norm's scale, whose entries are nearly equal after training, that trains the
    temperature of every next-token distribution and nothing else."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.lr < float("inf"):
            problems.append(f"lr={self.lr} must be a finite number >= 0")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            problems.append(f"b1={self.b1}, b2={self.b2} must be in [0, 1)")
        if self.eps <= 0:
            problems.append(f"eps={self.eps} must be > 0")
        if self.weight_decay < 0:
            problems.append(f"weight_decay={self.weight_decay} must be >= 0")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.warmup_steps < 0 or self.total_steps < 1:
            problems.append(f"warmup_steps={self.warmup_steps} must be >= 0 and total_steps={self.total_steps} >= 1")
        for pattern, factor in self.lr_multipliers:
            problems += _regex_problems("lr_multipliers", pattern)
            if not factor >= 0:
                problems.append(f"lr_multipliers: factor {factor} of {pattern!r} must be >= 0")
        for pattern in self.uniform_updates:
            problems += _regex_problems("uniform_updates", pattern)
        if problems:
            raise ValueError("OptimizerConfig: " + "; ".join(problems))


def parse_multiplier(text: str) -> tuple[str, float]:
    """ "REGEX=FACTOR" (the config's form of one `lr_multipliers` entry) -> (regex, factor)."""
    pattern, sep, factor = str(text).rpartition("=")
    try:
        if not sep or not pattern:
            raise ValueError
        return pattern, float(factor)
    except ValueError:
        raise ValueError(f"train.lr_multipliers: {text!r} must be REGEX=FACTOR, e.g. 'model/norm/scale=10'") from None


class TrainState(struct.PyTreeNode):
    """Everything the train step reads and writes; a checkpoint saves exactly this."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    skipped_updates: jax.Array
    """Steps whose update was skipped because the gradient was not finite."""


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup from 0, then constant, cosine or linear decay to 0 at total_steps."""
    decay_steps = max(config.total_steps - config.warmup_steps, 1)
    if config.schedule == "constant":
        main = optax.constant_schedule(config.lr)
    elif config.schedule == "cosine":
        main = optax.cosine_decay_schedule(config.lr, decay_steps)
    else:
        main = optax.linear_schedule(config.lr, 0.0, decay_steps)
    if config.warmup_steps == 0:
        return main
    warmup = optax.linear_schedule(0.0, config.lr, config.warmup_steps)
    return optax.join_schedules([warmup, main], [config.warmup_steps])


def split_trainable(params: Any, frozen_prefixes: tuple[str, ...]) -> tuple[dict, dict]:
    """(trainable, frozen) top-level groups of `params`; their union is `params`."""
    unknown = [p for p in frozen_prefixes if p not in params]
    if unknown:
        raise ValueError(
            f"frozen parameter groups {unknown} are not in the params (top-level groups: {sorted(params)})"
        )
    trainable = {k: v for k, v in params.items() if k not in frozen_prefixes}
    frozen = {k: v for k, v in params.items() if k in frozen_prefixes}
    return trainable, frozen


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Gradient means (`uniform_updates`), global-norm clip (when grad_clip > 0), then AdamW
    with the configured schedule and the `lr_multipliers`."""
    parts = []
    if config.uniform_updates:
        parts.append(mean_by_path(config.uniform_updates))
    if config.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(
        optax.adamw(
            learning_rate_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
        )
    )
    if config.lr_multipliers:
        parts.append(scale_by_path(config.lr_multipliers))
    return optax.chain(*parts)


def scale_by_path(multipliers: tuple[tuple[str, float], ...]) -> optax.GradientTransformation:
    """Multiplies each update by the factor of the first regex its path matches (else 1)."""
    compiled = [(re.compile(pattern), float(factor)) for pattern, factor in multipliers]

    def factor_of(path: Any) -> float:
        name = _path_name(path)
        return next((factor for regex, factor in compiled if regex.search(name)), 1.0)

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        return jax.tree_util.tree_map_with_path(lambda path, u: u * factor_of(path), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def mean_by_path(patterns: tuple[str, ...]) -> optax.GradientTransformation:
    """Replaces each gradient whose path a regex matches by its mean, broadcast to its shape."""
    matches = _any_regex(patterns)

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        return jax.tree_util.tree_map_with_path(
            lambda path, u: jnp.full_like(u, jnp.mean(u)) if matches(_path_name(path)) else u, updates
        ), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def path_means(params: Any, patterns: tuple[str, ...]) -> dict[str, jax.Array]:
    """{path: mean} of each parameter whose path a regex matches: the one number a
    `uniform_updates` parameter's updates move."""
    matches = _any_regex(patterns)
    named = {_path_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    return {name: jnp.mean(leaf) for name, leaf in named.items() if matches(name)}


def init_train_state(
    params: Any, optimizer: optax.GradientTransformation, seed: int, frozen_prefixes: tuple[str, ...] = ("visual",)
) -> TrainState:
    """Step 0 state for `params` (not copied: the state holds the same arrays)."""
    trainable, _ = split_trainable(params, frozen_prefixes)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(trainable),
        rng=jax.random.key_data(jax.random.key(seed)),
        skipped_updates=jnp.zeros((), jnp.int32),
    )


def state_shardings(state: TrainState, param_axes: Any, mesh: Mesh) -> TrainState:
    """NamedShardings for a TrainState: params by their logical axes, optimizer moments like
    the params they follow (matched by path suffix and shape), everything else replicated."""
    params_sharding = param_shardings(param_axes, state.params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    by_path = {
        _path_keys(path): (sharding, leaf.shape)
        for (path, sharding), leaf in zip(
            jax.tree_util.tree_flatten_with_path(params_sharding)[0], jax.tree.leaves(state.params)
        )
    }

    def opt_leaf(path: Any, leaf: Any) -> NamedSharding:
        keys = _path_keys(path)
        for start in range(len(keys)):
            found = by_path.get(keys[start:])
            if found is not None and found[1] == getattr(leaf, "shape", None):
                return found[0]
        return replicated

    opt_sharding = jax.tree_util.tree_map_with_path(opt_leaf, state.opt_state)
    return TrainState(
        step=replicated, params=params_sharding, opt_state=opt_sharding, rng=replicated, skipped_updates=replicated
    )


def _path_keys(path: Any) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _path_name(path: Any) -> str:
    """A pytree path as the regexes of `lr_multipliers` and `uniform_updates` see it."""
    return "/".join(_path_keys(path))


def _any_regex(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    compiled = [re.compile(pattern) for pattern in patterns]
    return lambda name: any(regex.search(name) for regex in compiled)


def _regex_problems(field: str, pattern: str) -> list[str]:
    try:
        re.compile(pattern)
    except re.error as error:
        return [f"{field}: {pattern!r} is not a regex ({error})"]
    return []
