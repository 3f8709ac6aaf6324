"""The 7B configs build objects in the released code's positions for every recipe switch
(docs/recipe.md); the embedded default keeps ours."""
import pytest

from configs import pyvision_image_7b, pyvision_video_7b, tiny_cpu
from pyvision_jax.agent.prompts import default_prompt_templates
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.grading.routes import ANSWER_TYPE_ROUTES, RELEASED_ROUTES
from pyvision_jax.models import ModelConfig
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.train.groups import SelectionConfig
from pyvision_jax.wiring import episode_config, scorer_routes
from pyvision_jax import wiring


@pytest.mark.parametrize("module", [pyvision_image_7b, pyvision_video_7b])
def test_the_7b_configs_use_the_released_positions(module):
    c = module.get_config()
    episode = episode_config(c, ModelConfig.preset("7b"))
    assert (episode.max_response_tokens, episode.action_syntax, episode.turn_boundary, episode.image_cap_rule,
            episode.stdout_strip) == (20_480, "released", "newline", "reach", "both")
    assert episode_config(c, ModelConfig.preset("7b"), evaluation=True).max_response_tokens == 0
    selection = wiring.selection_config(c.rl)
    assert selection.stats_include_broken and selection.require_code_image and selection.mode == "group"  # splitting groups is a defect we do not copy
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
    assert (episode.max_response_tokens, episode.action_syntax, episode.turn_boundary, episode.image_cap_rule,
            episode.stdout_strip) == (0, "tagged", "im_end", "exceed", "right")
    assert episode.prompts == default_prompt_templates()
    selection = wiring.selection_config(c.rl)
    assert (selection.stats_include_broken, selection.require_code_image, selection.train_end_reasons) == (
        False, False, ())
    assert wiring.loss_config(c.rl).aggregation == "token-mean"
    routes = scorer_routes(c)
    assert routes.routes == ANSWER_TYPE_ROUTES and routes.judge is None


def test_prompt_files_and_bad_routes_come_from_the_config(tmp_path):
    c = tiny_cpu.get_config()
    path = tmp_path / "image.txt"
    path.write_text("<image_clue_0>{image}</image_clue_0>\n{question}\n")
    c.episode.image_prompt_file = str(path)
    assert episode_config(c, ModelConfig.preset("tiny")).prompts.image.text == (
        "<image_clue_0>{image}</image_clue_0>\n{question}")
    c.grading.routes = ("*", "judge")
    with pytest.raises(ValueError, match="grading.routes entry"):
        scorer_routes(c)
