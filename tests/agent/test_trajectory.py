import io

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner
from pyvision_jax.agent.trajectory import EndReason, Trajectory, TrajectoryGroup
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from tests.agent.fake_sandbox import FakePool
from tests.agent.turns import answer_turn, code_turn


@pytest.fixture
def group(tokenizer, image_task):
    engine = ScriptedEngine(tokenizer, {"img": [code_turn("images 2 64x48"), answer_turn("B")]}, version=7)
    (group,) = EpisodeRunner(engine, tokenizer, FakePool(), EpisodeConfig()).run([image_task], group_size=2)
    return group


def assert_same(a: Trajectory, b: Trajectory):
    for name in ("token_ids", "loss_mask", "logprobs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert getattr(a, name).dtype == getattr(b, name).dtype
    for name in (
        "task_id",
        "rollout_index",
        "prompt_length",
        "images",
        "turns",
        "num_tool_calls",
        "num_successful_tool_calls",
        "end_reason",
        "broken",
        "final_answer",
        "policy_version",
        "timings",
    ):
        assert getattr(a, name) == getattr(b, name), name


def test_trajectory_round_trips_through_bytes_and_json(group):
    t = group.trajectories[0]
    assert t.policy_version == 7 and t.end_reason is EndReason.DONE
    assert_same(Trajectory.from_bytes(t.to_bytes()), t)
    assert_same(Trajectory.from_json(t.to_json()), t)
    assert len(t.to_bytes()) < 0.75 * len(t.to_json(indent=None))


def test_images_are_png_with_their_grids(group):
    t = group.trajectories[0]
    assert len(t.images) == 3
    for record in t.images:
        image = Image.open(io.BytesIO(record.png))
        assert image.format == "PNG"
        _, h, w = record.grid_thw
        assert image.size == (w * 14, h * 14)
        assert record.num_tokens == h * w // 4
    np.testing.assert_array_equal(t.image_grid_thw, [[1, 4, 4]] * 3)


def test_group_round_trips_and_checks_its_task(group):
    restored = TrajectoryGroup.from_bytes(group.to_bytes())
    assert restored.task == group.task and len(restored) == 2
    assert restored.policy_version == group.policy_version == 7
    for a, b in zip(restored.trajectories, group.trajectories):
        assert_same(a, b)
    assert '"rollout_index": 1' in group.to_json()
    with pytest.raises(ValueError, match="holds a trajectory of task img"):
        TrajectoryGroup(group.task.__class__(**{**group.task.__dict__, "id": "other"}), group.trajectories)


def test_misaligned_arrays_and_foreign_bytes_are_rejected(group):
    t = group.trajectories[0]
    with pytest.raises(ValueError, match="must have one length"):
        Trajectory(**{**t.__dict__, "logprobs": t.logprobs[:-1]})
    with pytest.raises(ValueError, match="format version"):
        Trajectory.from_bytes(b"\x81\xa1v\x02")


def test_render_text_collapses_image_tokens_and_marks_generated_text(group, tokenizer):
    text = group.trajectories[0].render_text(lambda ids: tokenizer.decode(list(ids)), 2012)
    assert "<|vision_start|><|image_pad|>×4<|vision_end|></image_clue_1>" in text
    assert text.count("[[gen]]") == 2
    assert "[[gen]]I am sure now.\n<answer>\n\\boxed{B}\n</answer><|im_end|>[[/gen]]" in text
