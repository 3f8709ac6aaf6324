"""Token-exact agreement: a scripted episode (real episode code, real sandbox) written as a
released-schema row and rendered as an SFT sample has the episode's tokens, loss mask and
images, for every synthetic task kind and plan shape (measure, look first, guess)."""

import dataclasses

import numpy as np
import pytest

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.data import synthetic
from pyvision_jax.data.sft_rows import load_sft_rows, write_sft_rows
from pyvision_jax.data.sft_solutions import solution_plan, task_kind
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
from pyvision_jax.train.sft_render import SftRenderer
from pyvision_jax.train.sft_synthetic import run_plans, trajectory_row

EPISODE = EpisodeConfig(
    max_new_tokens_per_turn=384, max_total_tokens=2048, image_max_pixels=56 * 56 * 4, max_concurrent=4
)


def scripted_episodes(tmp_path_factory, **switches):
    """Scripted episodes of every synthetic kind and plan shape under the episode `switches`."""
    episode = dataclasses.replace(EPISODE, **switches)
    root = tmp_path_factory.mktemp("sft_render")
    files = synthetic.generate_synthetic_suite(root / "tasks", 3, 77)
    tasks = [t for f in files.values() for t in load_tasks(f).tasks]
    plans = {}
    for t, task in enumerate(tasks):
        for k, (look, guess, wrong) in enumerate(((0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, 1.0, 0.0))):
            plans[f"{task.id}/{k}"] = solution_plan(
                task, np.random.default_rng([t, k]), guess_share=guess, wrong_share=wrong, look_first_share=look
            )
    tokenizer = load_tiny_tokenizer()
    with SandboxPool(SandboxConfig(timeout_s=60), size=2) as pool:
        trajectories = run_plans(tasks, plans, tokenizer=tokenizer, sandboxes=pool, episode=episode)
    return root, tasks, plans, trajectories, tokenizer, episode


@pytest.fixture(scope="module", params=["im_end", "newline"])
def episodes(tmp_path_factory, request):
    """Scripted episodes under both turn boundaries (ours and the released one)."""
    return scripted_episodes(tmp_path_factory, turn_boundary=request.param)


@pytest.fixture(scope="module")
def released_episodes(tmp_path_factory):
    """Scripted episodes with the released turn boundary and observation format."""
    return scripted_episodes(tmp_path_factory, turn_boundary="newline", observation_format="released")


def test_every_kind_and_plan_shape_ran_to_an_answer(episodes):
    _, tasks, plans, trajectories, _, _ = episodes
    assert [t.end_reason for t in trajectories] == [EndReason.DONE] * len(plans)
    assert {task_kind(t) for t in tasks} == {"counting", "visual_search", "video_count", "video_order"}
    looked = [t for t, key in zip(trajectories, plans) if "/look" in plans[key].strategy]
    assert looked and all(len(t.turns) == 3 and t.turns[0].num_new_images == 1 for t in looked)
    assert any(plans[key].strategy == "guess" for key in plans)


def test_sft_rendering_matches_the_episode_tokens(episodes):
    assert_renders_the_episode_tokens(episodes)


def test_sft_rendering_matches_the_episode_tokens_of_released_observations(released_episodes):
    assert_renders_the_episode_tokens(released_episodes)
    _, _, _, trajectories, tokenizer, _ = released_episodes
    for trajectory in trajectories:
        text = tokenizer.decode(trajectory.token_ids.tolist())
        shows = sum(turn.num_new_images > 0 for turn in trajectory.turns)
        assert text.count("Image Result:") == shows == text.count("<interpreter>Text Result:\n")
        assert text.count("<interpreter>\nText Result:\n") == trajectory.num_tool_calls - shows


def assert_renders_the_episode_tokens(episodes):
    root, tasks, plans, trajectories, tokenizer, episode = episodes
    by_id = {t.id: t for t in tasks}
    image_dir = root / "images"
    image_dir.mkdir(exist_ok=True)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = [trajectory_row(t, by_id[t.task_id], tokenizer, image_dir, eos) for t in trajectories]
    write_sft_rows(root / "sft.jsonl", rows)
    renderer = SftRenderer(tokenizer, episode)
    for row, trajectory in zip(load_sft_rows(root / "sft.jsonl"), trajectories):
        sample = renderer.render(row)
        assert sample.token_ids.tolist() == trajectory.token_ids.tolist(), row.where
        assert sample.loss_mask.tolist() == trajectory.loss_mask.tolist(), row.where
        assert [im.grid_thw for im in sample.images] == [im.grid_thw for im in trajectory.images]
        assert sample.prompt_length == trajectory.prompt_length


def test_answers_copy_what_the_code_printed(episodes):
    _, _, plans, trajectories, tokenizer, _ = episodes
    for key, trajectory in zip(plans, trajectories):
        if plans[key].strategy == "guess":
            assert trajectory.num_tool_calls == 0
            continue
        text = tokenizer.decode(trajectory.token_ids.tolist())
        printed = text.rsplit("Text Result:\n", 1)[1].split("\nImage Result:")[0].strip()
        assert trajectory.final_answer.strip() == f"\\boxed{{{printed}}}", key
