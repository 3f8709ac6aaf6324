"""A token budget below the longest first prompt stops a run at start, in one line naming the
budget, the task and its prompt length: training tasks (given or synthetic), the held-out set
and a rollout worker's shard, with the longest prompt found by its image as well as its text."""

from __future__ import annotations

import pytest
from PIL import Image

from pyvision_jax.agent.episode import EpisodeMachine
from pyvision_jax.agent.prompts import ChatRenderer
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig
from pyvision_jax.wiring.episodes import episode_config
from pyvision_jax.wiring.heldout import heldout_tasks
from pyvision_jax.wiring.tasks import task_file, training_tasks
from pyvision_jax.wiring.validation import ConfigError, check_prompt_fits, validate_run, validate_worker
from tests.tiny_random_cpu import get_config as tiny_cpu_config
from tests.train.test_run_guards import one_error_line, run_cli


def tiny_config():
    config = tiny_cpu_config()
    config.model.hf_dir, config.model.preset = "", "tiny"
    return config


def prompt_lengths(tasks, episode, tokenizer) -> dict[str, int]:
    machine = EpisodeMachine(episode, ChatRenderer(tokenizer, merge_size=episode.merge_size))
    return {task.id: len(machine.render_prompt(task).token_ids) for task in tasks}


def longest(lengths: dict[str, int]) -> tuple[str, int]:
    task_id = max(lengths, key=lengths.get)
    return task_id, lengths[task_id]


def test_the_longest_prompt_is_found_by_its_image_as_well_as_its_question(tmp_path, tokenizer):
    config = tiny_config()
    config.episode.image_max_pixels = 224 * 224
    tasks = []
    for i, (side, question) in enumerate([(56, "Colour?"), (56, "Which colour is the square " * 4), (224, "Colour?")]):
        Image.new("RGB", (side, side), (200, 30, 30)).save(tmp_path / f"{i}.png")
        tasks.append(
            Task(
                id=f"t{i}",
                question=question,
                answer="red",
                answer_type="text",
                data_source="test",
                image_path=str(tmp_path / f"{i}.png"),
            )
        )
    episode = episode_config(config, ModelConfig.preset("tiny"))
    lengths = prompt_lengths(tasks, episode, tokenizer)
    assert longest(lengths)[0] == "t2" and lengths["t1"] > lengths["t0"]  # the big image, not the long question
    config.episode.max_total_tokens = lengths["t2"]
    with pytest.raises(ConfigError) as raised:
        check_prompt_fits(tasks, episode_config(config, ModelConfig.preset("tiny")), tokenizer, "--config.episode.x")
    assert str(raised.value) == (
        f"--config.episode.x={lengths['t2']} cannot hold the prompt of task 't2' ({lengths['t2']} tokens): "
        f"raise it above {lengths['t2']}"
    )
    config.episode.max_total_tokens = lengths["t2"] + 1
    check_prompt_fits(tasks, episode_config(config, ModelConfig.preset("tiny")), tokenizer, "--config.episode.x")


def test_synthetic_training_tasks_and_the_heldout_set_are_checked(tmp_path, tokenizer):
    config = tiny_config()
    model = ModelConfig.preset("tiny")
    task_id, length = longest(
        prompt_lengths(training_tasks(config, tmp_path / "made"), episode_config(config, model), tokenizer)
    )
    config.episode.max_total_tokens = length
    with pytest.raises(
        ConfigError, match=rf"max_total_tokens={length} cannot hold the prompt of task '{task_id}' \({length} tokens\)"
    ):
        validate_run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # the synthetic tasks were made elsewhere
    config.episode.max_total_tokens = length + 1
    validate_run(config, tmp_path / "run")

    config.eval.heldout_per_kind = 1
    heldout = task_file(config, heldout_tasks(config, tmp_path / "made"))
    task_id, length = longest(prompt_lengths(heldout, episode_config(config, model, evaluation=True), tokenizer))
    config.eval.max_total_tokens = length
    with pytest.raises(
        ConfigError, match=rf"eval.max_total_tokens={length} cannot hold the prompt of held-out task '{task_id}'"
    ):
        validate_run(config, tmp_path / "run")
    config.rollout.mode = "external"  # the trainer still evaluates the held-out set
    config.rollout.queue = "redis"
    with pytest.raises(ConfigError, match="held-out task"):
        validate_run(config, tmp_path / "run")


def test_a_rollout_worker_checks_its_tasks(tmp_path, tokenizer):
    config = tiny_config()
    _, length = longest(
        prompt_lengths(training_tasks(config, tmp_path), episode_config(config, ModelConfig.preset("tiny")), tokenizer)
    )
    config.rollout.queue = "redis"
    config.episode.max_total_tokens = length
    with pytest.raises(ConfigError, match=rf"max_total_tokens={length} cannot hold the prompt of task"):
        validate_worker(config, 0)


def test_the_training_command_stops_with_status_2_and_one_line(tmp_path):
    workdir = tmp_path / "run"
    line = one_error_line(run_cli(workdir, "--config.episode.max_total_tokens=60"), 2)
    assert (
        "--config.episode.max_total_tokens=60 cannot hold the prompt of task '" in line
        and " tokens): raise it above " in line
    )
    assert not workdir.exists()
