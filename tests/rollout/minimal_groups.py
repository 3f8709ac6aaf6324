"""Minimal trajectory groups for queue and intake tests."""

import dataclasses

from pyvision_jax.agent.trajectory import EndReason, GroupScores, Trajectory, TrajectoryGroup
from pyvision_jax.data.tasks import Task

GROUP_SIZE = 2


def make_group(task_id: str, epoch: int) -> TrajectoryGroup:
    """A group of `task_id` whose rollout indices are those of `epoch`."""
    task = Task(id=task_id, question="q", answer="a", answer_type="text", data_source="test", image_path="image.png")
    trajectories = tuple(
        Trajectory(
            task_id=task_id,
            rollout_index=epoch * GROUP_SIZE + k,
            token_ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[0.0, -0.5],
            prompt_length=1,
            images=(),
            turns=(),
            num_tool_calls=0,
            num_successful_tool_calls=0,
            end_reason=EndReason.DONE,
            broken=False,
            final_answer="a",
            policy_version=0,
        )
        for k in range(GROUP_SIZE)
    )
    return TrajectoryGroup(task, trajectories)


def scored_group(task_id: str, epoch: int, version: int = 0) -> TrajectoryGroup:
    """`make_group` with scores and every rollout at policy `version`."""
    group = make_group(task_id, epoch)
    trajectories = tuple(dataclasses.replace(t, policy_version=version) for t in group.trajectories)
    scores = GroupScores(scores=(1.0, 0.0), correct=(True, False), tool_calls=(0, 0), rewards=(1.0, 0.0))
    return TrajectoryGroup(group.task, trajectories, scores)
