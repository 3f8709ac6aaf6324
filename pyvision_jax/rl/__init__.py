"""The PyVision-RL math as pure, jittable functions over [P, G] arrays: rewards, group
statistics, selection, advantages, losses. Host-side answer checking lives in `grading`."""

from pyvision_jax.rl.advantages import group_advantages
from pyvision_jax.rl.controls import REWARD_CONTROLS, controlled_advantages, controlled_rewards
from pyvision_jax.rl.group_stats import GroupStatistics, group_statistics, usable_mask
from pyvision_jax.rl.losses import (
    PPOLossConfig,
    PPOLossOutput,
    PPOMetrics,
    combine_metrics,
    ppo_loss,
    summarize_metrics,
)
from pyvision_jax.rl.rewards import accumulative_tool_reward
from pyvision_jax.rl.selection import Selection, SelectionCounts, select_rollouts, take_selected

__all__ = [
    "GroupStatistics",
    "PPOLossConfig",
    "PPOLossOutput",
    "PPOMetrics",
    "REWARD_CONTROLS",
    "Selection",
    "SelectionCounts",
    "accumulative_tool_reward",
    "combine_metrics",
    "controlled_advantages",
    "controlled_rewards",
    "group_advantages",
    "group_statistics",
    "ppo_loss",
    "select_rollouts",
    "summarize_metrics",
    "take_selected",
    "usable_mask",
]
