"""The paper-recipe configs hold the paper's numbers and only differ from the embedded default
in values, never in schema; the cluttered toy's config is the embedded default on other tasks."""

import pytest

from configs import (
    pyvision_image_7b,
    pyvision_image_7b_v5p8,
    pyvision_video_7b,
    sft_shapes,
    sft_shapes_adaptive,
    shapes_adaptive_cpu,
    shapes_cluttered_cpu,
    shapes_direct_cpu,
    tiny_cpu,
)
from pyvision_jax.data.tasks import write_tasks_jsonl
from pyvision_jax.wiring.settings import synthetic_sft_settings
from pyvision_jax.wiring.validation import ConfigError, validate_run
from tests.train.scripted_runs import colour_tasks

ADAPTIVE_RECIPE = {
    "model.hf_dir": "packaged:shapes_adaptive_sft",
    "rl.kl_coef": 0.1,
    "train.steps": 36,
}
"""What the adaptive toy's config sets apart from its tasks (docs/learning.md#learning-when-to-use-tools)."""


def flat_keys(config, prefix=""):
    out = set()
    for key, value in config.items():
        out |= flat_keys(value, f"{prefix}{key}.") if hasattr(value, "items") else {prefix + key}
    return out


@pytest.mark.parametrize("module", [pyvision_image_7b, pyvision_video_7b])
def test_paper_recipe(module):
    c = module.get_config()
    assert (c.rl.batch_groups, c.rl.oversample * c.rl.batch_groups, c.rl.group_size) == (16, 32, 8)
    assert (c.episode.max_tool_calls, c.train.lr, c.train.weight_decay, c.train.grad_clip) == (4, 1e-6, 0.01, 1.0)
    assert c.train.steps == 700 and c.train.freeze_vision
    assert (c.rollout.engine, c.rollout.mode, c.rollout.queue) == ("vllm", "external", "redis")
    assert c.train.mesh_data * c.train.mesh_fsdp * c.train.mesh_tensor == 8
    assert c.train.micro_batch % (c.train.mesh_data * c.train.mesh_fsdp) == 0
    assert flat_keys(c) == flat_keys(tiny_cpu.get_config())


@pytest.mark.parametrize("module", [tiny_cpu, pyvision_image_7b, pyvision_video_7b])
def test_eval_and_worker_keys_have_the_documented_defaults(module):
    c = module.get_config()
    assert (c.eval.max_new_tokens_per_turn, c.eval.max_total_tokens) == (
        c.episode.max_new_tokens_per_turn,
        c.episode.max_total_tokens,
    )
    assert (c.eval.seed, c.eval.top_p, c.eval.top_k) == (c.seed, c.rollout.top_p, c.rollout.top_k)
    assert (c.eval.tasks_per_batch, c.eval.report_rollouts_per_task) == (0, 4)
    assert (c.rollout.script_file, c.rollout.max_epochs, c.rollout.poll_s, c.rollout.queue_namespace) == (
        "",
        0,
        0.5,
        "pyvision",
    )


def test_v5p8_config_is_the_image_recipe_on_four_chips():
    c, image = pyvision_image_7b_v5p8.get_config(), pyvision_image_7b.get_config()
    assert c.train.mesh_data * c.train.mesh_fsdp * c.train.mesh_tensor == 4
    assert c.train.micro_batch % (c.train.mesh_data * c.train.mesh_fsdp) == 0
    assert (c.model.attention, c.model.remat, c.train.pack) == ("splash", "full", True)
    assert flat_keys(c) == flat_keys(image)
    for section in ("rl", "episode", "rollout"):
        assert c[section].to_dict() == image[section].to_dict(), section


@pytest.mark.parametrize(
    "module, kind, own",
    [
        (shapes_cluttered_cpu, "shapes_cluttered", {}),
        (shapes_direct_cpu, "shapes_direct", {}),
        (shapes_adaptive_cpu, "shapes_adaptive", ADAPTIVE_RECIPE),
    ],
)
def test_the_toy_configs_are_the_embedded_default_on_their_toy(module, kind, own, tmp_path):
    """Each toy's config is the embedded default on its tasks, apart from the fields it names."""
    c, default = module.get_config(), tiny_cpu.get_config()
    assert tuple(c.data.synthetic_kinds) == (kind,)
    validate_run(c, tmp_path / "run")
    c.data.synthetic_kinds = default.data.synthetic_kinds
    for field, value in own.items():
        section, name = field.split(".")
        assert c[section][name] == value, field
        c[section][name] = default[section][name]
    assert c.to_dict() == default.to_dict()


@pytest.mark.parametrize("module", [pyvision_image_7b, pyvision_video_7b, pyvision_image_7b_v5p8])
def test_the_7b_configs_validate_like_the_released_script(module):
    """trainer.test_freq=20 and trainer.val_before_train on data.val_files, greedy, one rollout
    per task (verl's val_kwargs), as soon as the user names the file."""
    c = module.get_config()
    assert tuple(c.data.val_files) == ()
    assert (c.eval.every_steps, c.eval.before_training, c.eval.val_k, c.eval.val_temperature) == (20, True, 1, 0.0)
    assert c.eval.val_max_tool_calls == c.episode.max_tool_calls == 4


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("eval.every_steps", -1, "eval.every_steps must be >= 0"),
        ("eval.before_training", False, "eval.every_steps is 0 and eval.before_training is False"),
    ],
)
def test_a_bad_validation_setting_is_one_line_naming_the_key(tmp_path, key, value, message):
    write_tasks_jsonl(tmp_path / "val.jsonl", colour_tasks(tmp_path))
    c = tiny_cpu.get_config()
    c.data.val_files = (str(tmp_path / "val.jsonl"),)
    section, name = key.split(".")
    c[section][name] = value
    with pytest.raises(ConfigError, match=message):
        validate_run(c, tmp_path / "run")
    c.eval.every_steps, c.eval.before_training = 2, True
    validate_run(c, tmp_path / "run")
    c.data.val_files = (str(tmp_path / "missing.jsonl"),)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        validate_run(c, tmp_path / "run")


def test_the_adaptive_sft_config_is_the_shapes_sft_stage_with_plans_worded_by_their_options(tmp_path):
    c, shapes_stage = sft_shapes_adaptive.get_config(), sft_shapes.get_config()
    settings = synthetic_sft_settings(c)
    assert settings.kinds == ("shapes_adaptive",) and settings.wording_by_options
    assert not synthetic_sft_settings(shapes_stage).wording_by_options
    validate_run(c, tmp_path / "run")
    c.data.synthetic_kinds, c.sft.wording_by_options = shapes_stage.data.synthetic_kinds, False
    assert c.to_dict() == shapes_stage.to_dict()
