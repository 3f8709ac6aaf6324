"""The 7B configs build objects in the released code's positions for every recipe switch
(docs/recipe.md); the embedded default keeps ours."""

import pytest

from configs import pyvision_image_7b, pyvision_video_7b, tiny_cpu
from pyvision_jax import wiring
from pyvision_jax.agent.prompts import default_prompt_templates
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.grading.judge import RELEASED_VERDICT_PATTERN
from pyvision_jax.grading.routes import ANSWER_TYPE_ROUTES, RELEASED_ROUTES
from pyvision_jax.models import ModelConfig
from pyvision_jax.train.step import updates_per_step
from pyvision_jax.wiring import episode_config, scorer_routes
from pyvision_jax.wiring.validation import startup_notices


@pytest.mark.parametrize("module", [pyvision_image_7b, pyvision_video_7b])
def test_the_7b_configs_use_the_released_positions(module):
    c = module.get_config()
    episode = episode_config(c, ModelConfig.preset("7b"))
    assert (
        episode.max_response_tokens,
        episode.action_syntax,
        episode.turn_boundary,
        episode.image_cap_rule,
        episode.stdout_strip,
    ) == (20_480, "released", "newline", "reach", "both")
    assert episode_config(c, ModelConfig.preset("7b"), evaluation=True).max_response_tokens == 0
    selection = wiring.selection_config(c.rl)
    # group mode: splitting groups is a defect we do not copy
    assert selection.stats_include_broken and selection.require_code_image and selection.mode == "group"
    assert selection.train_end_reasons == (EndReason.DONE, EndReason.EXCEED_MAX_TURNS, EndReason.ERROR_IN_ACTION)
    assert wiring.loss_config(c.rl).aggregation == "token-mean-per-micro-batch"
    with pytest.raises(ValueError, match="grading.judge_url"):
        scorer_routes(c)
    c.grading.judge_url = "http://127.0.0.1:9"
    routes = scorer_routes(c)
    assert routes.routes == RELEASED_ROUTES and routes.judge.config.model == "judge"
    assert (routes.rules.answer_gate, routes.rules.mra_thresholds) == ("first_exact", "float")


def test_the_embedded_default_keeps_our_positions():
    c = tiny_cpu.get_config()
    episode = episode_config(c, ModelConfig.preset("tiny"))
    assert (
        episode.max_response_tokens,
        episode.action_syntax,
        episode.turn_boundary,
        episode.image_cap_rule,
        episode.stdout_strip,
    ) == (0, "tagged", "im_end", "exceed", "right")
    assert episode.prompts.video == default_prompt_templates().video
    assert "`measure()` measures its shape" in episode.prompts.image.text  # the shapes toy's prompt
    selection = wiring.selection_config(c.rl)
    assert (selection.stats_include_broken, selection.require_code_image, selection.train_end_reasons) == (
        False,
        False,
        (),
    )
    assert wiring.loss_config(c.rl).aggregation == "token-mean"
    assert wiring.loss_config(c.rl).kl_coef == 0.3  # the paper has no KL term; the 7B configs keep none
    assert wiring.loss_config(pyvision_image_7b.get_config().rl).kl_coef == 0.0
    routes = scorer_routes(c)
    assert routes.routes == ANSWER_TYPE_ROUTES and routes.judge is None


def test_prompt_files_and_bad_routes_come_from_the_config(tmp_path):
    c = tiny_cpu.get_config()
    path = tmp_path / "image.txt"
    path.write_text("<image_clue_0>{image}</image_clue_0>\n{question}\n")
    c.episode.image_prompt_file = str(path)
    assert episode_config(c, ModelConfig.preset("tiny")).prompts.image.text == (
        "<image_clue_0>{image}</image_clue_0>\n{question}"
    )
    c.grading.routes = ("*", "judge")
    with pytest.raises(ValueError, match="grading.routes entry"):
        scorer_routes(c)


def test_the_sandbox_setup_file_is_read_and_a_missing_one_is_named(tmp_path):
    c = tiny_cpu.get_config()
    assert "def measure():" in episode_config(c, ModelConfig.preset("tiny")).setup_code
    c.sandbox.setup_file = str(tmp_path / "missing.py")
    with pytest.raises(ValueError, match=r"sandbox.setup_file: cannot read .*missing.py"):
        episode_config(c, ModelConfig.preset("tiny"))
    c.sandbox.setup_file = ""
    assert episode_config(c, ModelConfig.preset("tiny")).setup_code == ""


# Keys that the composition root turns into settings fields (docs/recipe.md rows): the 7B
# configs hold the released positions, the embedded default ours.
RELEASED_KEYS = {
    ("episode", "observation_format"): "released",
    ("rl", "batch_unit"): "rollouts",
    ("rl", "loss_micro_batch"): 4,
    ("train", "ppo_mini_batch_groups"): 16,
    ("grading", "judge_temperature"): 0.3,
    ("grading", "judge_system_prompt"): "You are a helpful assistant.",
    ("grading", "judge_verdict_pattern"): RELEASED_VERDICT_PATTERN,
}
OUR_KEYS = {
    ("episode", "observation_format"): "full",
    ("rl", "batch_unit"): "groups",
    ("rl", "loss_micro_batch"): 0,
    ("train", "ppo_mini_batch_groups"): 0,
    ("grading", "judge_temperature"): 0.0,
    ("grading", "judge_system_prompt"): "",
    ("grading", "judge_verdict_pattern"): "",
}


@pytest.mark.parametrize(
    "module, expected", [(pyvision_image_7b, RELEASED_KEYS), (pyvision_video_7b, RELEASED_KEYS), (tiny_cpu, OUR_KEYS)]
)
def test_the_switch_keys_hold_the_released_and_our_positions(module, expected):
    c = module.get_config()
    assert {key: c[key[0]][key[1]] for key in expected} == expected
    assert tuple(c.grading.judge_prompt_files) == ()  # user-supplied few-shot files
    steps = updates_per_step(c.rl.batch_groups, c.train.ppo_mini_batch_groups)
    assert steps == 1  # the paper's B with the released mini-batch size; the README's B = 64 makes 4
    assert updates_per_step(64, c.train.ppo_mini_batch_groups) == (4 if module is not tiny_cpu else 1)


def test_the_7b_configs_switches_reach_the_objects_the_run_builds():
    c = pyvision_image_7b.get_config()
    c.grading.judge_url = "http://127.0.0.1:9"
    settings = wiring.grpo_settings(c)
    assert settings.selection.batch_unit == "rollouts"
    assert (settings.batching.loss_unit, settings.batching.mini_batches, settings.step.mini_batches) == (4, 1, 1)
    assert episode_config(c, wiring.model_config(c)).observation_format == "released"
    judge = scorer_routes(c).judge.config
    assert (judge.temperature, judge.system_prompt) == (0.3, "You are a helpful assistant.")
    assert judge.verdict_pattern == ""  # the project's own judge prompt: its own verdict words
    c.grading.judge_prompt_file = str(wiring.ASSETS_DIR.parent.parent / "configs" / "prompts" / "judge.txt")
    assert scorer_routes(c).judge.config.verdict_pattern == c.grading.judge_verdict_pattern
    c.rl.batch_groups, c.train.ppo_mini_batch_groups = 64, 16  # the released README's step
    settings = wiring.grpo_settings(c)
    assert settings.step.mini_batches == settings.batching.mini_batches == 4


def test_released_positions_without_released_texts_say_so_once_at_start():
    c = pyvision_image_7b.get_config()
    c.grading.judge_url = "http://127.0.0.1:9"
    notices = startup_notices(c)
    assert len(notices) == 3 and all("\n" not in line for line in notices)
    assert any("episode.image_prompt_file" in line for line in notices)
    assert any("judge_prompt_files" in line for line in notices)
    c.episode.image_prompt_file = c.episode.video_prompt_file = "/prompts/image.txt"
    c.grading.judge_prompt_files = (("*", "/prompts/judge.txt"),)
    assert startup_notices(c) == []
    assert startup_notices(tiny_cpu.get_config()) == []
