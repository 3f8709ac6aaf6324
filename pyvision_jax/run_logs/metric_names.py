"""Every metric tag the trainer writes, in one place: the trainer, the launcher, the
console line and the tests share one spelling. `TRAINER_SCALARS` lists the tags every
training step writes; `end_reason_tag(name)` builds the per-end-reason tags
(`end_reason/<NAME>`), one per episode end reason."""

from __future__ import annotations

import re

REWARD_TOTAL = "reward/total"
REWARD_ACCURACY = "reward/accuracy"
TOOLS_CALLS_PER_TRAJ = "tools/calls_per_traj"
RESPONSE_LENGTH = "response/length"
VISUAL_TOKENS_PER_TRAJ = "visual_tokens/per_traj"
ACTOR_ENTROPY = "actor/entropy"
ACTOR_GRAD_NORM = "actor/grad_norm"
ACTOR_CLIPFRAC = "actor/clipfrac"
ACTOR_APPROX_KL = "actor/approx_kl"
ACTOR_REF_KL = "actor/ref_kl"
"""Mean per-token KL estimate to the starting model (`rl.kl_coef` > 0; 0 without the term)."""
ACTOR_IS_RATIO_MAX = "actor/is_ratio_max"
ACTOR_IS_RATIO_MEAN = "actor/is_ratio_mean"
FILTER_ZERO_VARIANCE_FRAC = "filter/zero_variance_frac"
FILTER_BROKEN_FRAC = "filter/broken_frac"
FILTER_GROUPS_KEPT = "filter/groups_kept"
PERF_STEP_TIME = "perf/step_time"
PERF_ROLLOUT_WAIT = "perf/rollout_wait"
PERF_TOKENS_PER_SEC = "perf/tokens_per_sec"
VERSION_STALENESS_MEAN = "version/staleness_mean"
VERSION_STALENESS_MAX = "version/staleness_max"
"""Staleness of the rows trained: the trainer's step minus each group's policy version (the
version its rollouts started with), i.e. the updates between behaviour and trained params."""
TOOL_CALL_SHARE_PREFIX = "tools/share_"
TOOL_CALL_SHARE_BUCKETS = (0, 1, 2, 3)
"""`tools/share_<n>`: the share of rollouts with n tool calls (3: 3 or more), written every step;
on the shapes toy the plan share (0 the untooled guess, 1 quick, 2 careful)."""
END_REASON_PREFIX = "end_reason/"
PARAMS_PREFIX = "params/"
"""`params/<path>/mean`: the mean of each parameter `train.uniform_updates` names, written every
step (on the final norm's scale: the policy's inverse temperature, up to the SFT scale)."""

ACTOR_LOSS = "actor/loss"
ACTOR_LOSS_TOKENS = "actor/loss_tokens"
ACTOR_TRAINED_TOKEN_FRAC = "actor/trained_token_frac"
"""Share of loss tokens with a policy-gradient term (below 1 only with `rl.min_entropy`)."""
ACTOR_UPDATED = "actor/updated"
ACTOR_SKIPPED_NONFINITE = "actor/skipped_nonfinite"
FILTER_GEN_ROUNDS = "filter/gen_rounds"
FILTER_GROUPS_DRAWN = "filter/groups_drawn"
FILTER_ELIGIBLE = "filter/eligible"
BATCH_LENGTH = "batch/length"
BATCH_REAL_TOKENS = "batch/real_tokens"
SFT_LOSS = "sft/loss"
SFT_LOSS_TOKENS = "sft/loss_tokens"

QUEUE_DUPLICATES_DROPPED = "queue/duplicates_dropped"
QUEUE_STALE_DROPPED = "queue/stale_dropped"
QUEUE_FUTURE_DROPPED = "queue/future_dropped"
QUEUE_BACKLOG = "queue/backlog"
SOURCE_STATS: dict[str, str] = {
    "duplicates_dropped": QUEUE_DUPLICATES_DROPPED,
    "stale_dropped": QUEUE_STALE_DROPPED,
    "future_dropped": QUEUE_FUTURE_DROPPED,
    "backlog": QUEUE_BACKLOG,
}
"""The tags of a queue-backed source's `stats()` (groups dropped with a counted reason)."""

TRAINER_SCALARS: tuple[str, ...] = (
    REWARD_TOTAL,
    REWARD_ACCURACY,
    TOOLS_CALLS_PER_TRAJ,
    RESPONSE_LENGTH,
    VISUAL_TOKENS_PER_TRAJ,
    ACTOR_ENTROPY,
    ACTOR_GRAD_NORM,
    ACTOR_CLIPFRAC,
    ACTOR_APPROX_KL,
    ACTOR_REF_KL,
    ACTOR_IS_RATIO_MAX,
    ACTOR_IS_RATIO_MEAN,
    FILTER_ZERO_VARIANCE_FRAC,
    FILTER_BROKEN_FRAC,
    FILTER_GROUPS_KEPT,
    PERF_STEP_TIME,
    PERF_ROLLOUT_WAIT,
    PERF_TOKENS_PER_SEC,
    VERSION_STALENESS_MEAN,
    VERSION_STALENESS_MAX,
    ACTOR_LOSS,
    ACTOR_LOSS_TOKENS,
    ACTOR_TRAINED_TOKEN_FRAC,
    ACTOR_UPDATED,
    ACTOR_SKIPPED_NONFINITE,
    FILTER_GEN_ROUNDS,
    FILTER_GROUPS_DRAWN,
    FILTER_ELIGIBLE,
    BATCH_LENGTH,
    BATCH_REAL_TOKENS,
)
"""Names written at every training step (besides one `end_reason/<NAME>` per end reason and one
`tools/share_<n>` per tool-call bucket)."""

_END_REASON_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def tool_call_share_tag(calls: int) -> str:
    """The tag of the share of rollouts with `calls` tool calls (the last bucket: that many or more)."""
    return f"{TOOL_CALL_SHARE_PREFIX}{min(calls, TOOL_CALL_SHARE_BUCKETS[-1])}"


def end_reason_tag(name: str) -> str:
    """The scalar name for the fraction of trajectories that ended for reason `name`."""
    if not isinstance(name, str) or not _END_REASON_NAME.match(name):
        raise ValueError(
            f"end reason name must be a non-empty string of letters, digits, '_', '.' or '-'; got {name!r}"
        )
    return END_REASON_PREFIX + name


def param_mean_tag(path: str) -> str:
    """The tag of the mean of the parameter at `path` (as `train.uniform_updates` sees it)."""
    return f"{PARAMS_PREFIX}{path}/mean"


VALIDATION_TB_DIR = "validation"
"""Validation scalars go to WORKDIR/tb/validation (a TensorBoard run of its own beside the
training run's events), so a rerun rewrites them without touching the trainer's open file."""
VAL_ACCURACY = "val/accuracy"
VAL_AVG_AT_K = "val/avg_at_k"
VAL_PASS_AT_K = "val/pass_at_k"
VAL_TOOL_CALLS = "val/tool_calls"
VAL_RESPONSE_LENGTH = "val/response_length"
VAL_GRADING_FAILURES = "val/grading_failures"
VAL_ACCURACY_PREFIX = "val/accuracy/"
VAL_END_REASON_PREFIX = "val/end_reason/"


def val_accuracy_tag(data_source: str) -> str:
    """The validation accuracy of one data source (`val/accuracy/<data_source>`)."""
    return VAL_ACCURACY_PREFIX + data_source


def val_end_reason_tag(name: str) -> str:
    """The share of validation rollouts that ended for reason `name` (`val/end_reason/<NAME>`)."""
    return "val/" + end_reason_tag(name)
