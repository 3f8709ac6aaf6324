"""The episode state machine with a scripted engine and a fake sandbox pool."""

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.data.synthetic import write_mp4
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from tests.agent.episodes import run_one
from tests.agent.fake_sandbox import FakePool
from tests.agent.turns import answer_turn, code_turn

PAD = 2012


def test_answer_first_turn_is_done_without_a_sandbox(tokenizer, image_task):
    t, engine, pool = run_one(tokenizer, image_task, [answer_turn("B")])
    assert t.end_reason is EndReason.DONE and not t.broken
    assert t.final_answer == "\\boxed{B}"
    assert t.num_tool_calls == 0 and len(t.turns) == 1
    assert pool.acquired == []
    assert t.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_answer_wins_over_code_in_the_same_turn(tokenizer, image_task):
    # the engine stops at </code>, so the answer comes first in the turn
    t, _, pool = run_one(tokenizer, image_task, [answer_turn("A") + code_turn("print x")])
    assert t.end_reason is EndReason.DONE and pool.acquired == []


def test_observation_tokens_have_the_exact_format(tokenizer, image_task):
    t, _, pool = run_one(tokenizer, image_task, [code_turn("print hello", "images 1 64x48"), answer_turn()])
    assert t.end_reason is EndReason.DONE and t.num_successful_tool_calls == 1
    first = t.turns[0]
    observation = t.token_ids[first.generated_end : first.observation_end].tolist()
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    expected = (
        enc(
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n<interpreter>\n"
            "Text Result:\nhello\nImage Result:\n<image_clue_1><|vision_start|>"
        )
        + [PAD] * 4
        + enc("<|vision_end|></image_clue_1></interpreter>\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    )
    assert observation == expected
    text = tokenizer.decode(observation)
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n<interpreter>\n"
        "Text Result:\nhello\nImage Result:\n<image_clue_1><|vision_start|>"
        + "<|image_pad|>"
        * 4
        + "<|vision_end|></image_clue_1></interpreter>\n\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert pool.acquired[0].preloaded.keys() == {"image_clue_0", "image_clue_1"}


def test_loss_mask_and_logprobs_align_with_the_engine_output(tokenizer, image_task):
    t, engine, _ = run_one(tokenizer, image_task, [code_turn("images 2 64x48"), code_turn("print 1"), answer_turn()])
    results = engine.results["img/0"]
    generated = np.concatenate([np.asarray(r.token_ids) for r in results])
    logprobs = np.concatenate([np.asarray(r.logprobs, np.float32) for r in results])
    mask = t.loss_mask.astype(bool)
    np.testing.assert_array_equal(t.token_ids[mask], generated)
    np.testing.assert_array_equal(t.logprobs[mask], logprobs)
    assert np.all(t.logprobs[~mask] == 0)
    for turn, result in zip(t.turns, results):
        assert t.token_ids[turn.generated_start : turn.generated_end].tolist() == list(result.token_ids)
        assert t.loss_mask[turn.generated_start : turn.generated_end].all()
        assert not t.loss_mask[turn.generated_end : turn.observation_end].any()
    assert not t.loss_mask[: t.prompt_length].any()
    assert int(t.loss_mask.sum()) == len(generated) == t.num_generated_tokens


def test_token_ids_after_k_turns_are_a_prefix_of_those_after_k_plus_1(tokenizer, image_task):
    t, engine, _ = run_one(
        tokenizer,
        image_task,
        [code_turn("images 1 64x48"), code_turn("print a"), code_turn("images 1 30x90"), answer_turn()],
    )
    requests, results = engine.requests["img/0"], engine.results["img/0"]
    assert len(requests) == 4
    for k in range(3):
        before = list(requests[k].prompt_token_ids) + list(results[k].token_ids)
        after = list(requests[k + 1].prompt_token_ids)
        assert after[: len(before)] == before and len(after) > len(before)
        assert len(requests[k + 1].images) >= len(requests[k].images)
    final = t.token_ids.tolist()
    assert final[: len(requests[-1].prompt_token_ids)] == list(requests[-1].prompt_token_ids)


def test_image_labels_continue_across_turns_from_1_for_image_tasks(tokenizer, image_task):
    t, engine, pool = run_one(
        tokenizer,
        image_task,
        [code_turn("images 2 64x48"), code_turn("print none"), code_turn("images 1 64x48", "names"), answer_turn()],
    )
    assert [im.label for im in t.images] == [0, 1, 2, 3]
    assert [im.source for im in t.images] == ["task", "code", "code", "code"]
    text = tokenizer.decode(t.token_ids.tolist())
    for label in (1, 2, 3):
        assert text.count(f"<image_clue_{label}><|vision_start|>") == 1
    assert "image_clue_0 image_clue_1 image_clue_2" in text  # bound before the third run
    assert set(pool.acquired[0].preloaded) == {f"image_clue_{k}" for k in range(4)}
    assert t.num_visual_tokens == int((PAD == t.token_ids).sum()) == 4 * 4
    np.testing.assert_array_equal(t.image_grid_thw, [[1, 4, 4]] * 4)
    last_request = engine.requests["img/0"][-1]
    assert len(last_request.images) == 4
    assert last_request.images[1].size == (56, 56)


def test_setup_code_is_preloaded_after_the_clues_and_stays_out_of_the_context(tokenizer, image_task):
    setup = "def helper():\n    print('from setup')\n"
    t, engine, pool = run_one(tokenizer, image_task, [code_turn("print x"), answer_turn()], setup_code=setup)
    (sandbox,) = pool.acquired
    assert list(sandbox.preloaded) == ["image_clue_0", "setup"] and sandbox.preloaded["setup"] == setup
    assert "def helper" not in tokenizer.decode(t.token_ids.tolist())
    _, _, untooled = run_one(tokenizer, image_task, [answer_turn()], setup_code=setup)
    assert untooled.acquired == []


def test_video_task_labels_start_at_0_and_video_is_only_in_the_runtime(tokenizer, tmp_path):
    frames = np.zeros((6, 48, 64, 3), np.uint8)
    frames[:, :, :, 1] = np.arange(6)[:, None, None] * 40
    write_mp4(tmp_path / "v.mp4", frames, fps=3)
    task = Task(
        id="vid",
        question="How many frames?",
        answer="6",
        answer_type="numeric",
        data_source="test",
        video_path=str(tmp_path / "v.mp4"),
    )
    t, engine, pool = run_one(
        tokenizer, task, [code_turn("images 2 64x48"), code_turn("images 1 64x48"), answer_turn("6")]
    )
    first_request = engine.requests["vid/0"][0]
    assert first_request.images == () and PAD not in first_request.prompt_token_ids
    prompt = tokenizer.decode(first_request.prompt_token_ids)
    assert "Video Width: 64; Video Height: 48; Frames: 6; FPS: 3.00" in prompt
    assert [im.label for im in t.images] == [0, 1, 2]
    assert pool.acquired[0].preloaded["video_clue_0"] == str(tmp_path / "v.mp4")
    assert set(pool.acquired[0].preloaded) == {"video_clue_0", "image_clue_0", "image_clue_1", "image_clue_2"}


def test_tool_call_budget_ends_with_exceed_max_turns(tokenizer, image_task):
    t, engine, pool = run_one(tokenizer, image_task, [code_turn()] * 3, max_tool_calls=2)
    assert t.end_reason is EndReason.EXCEED_MAX_TURNS
    assert t.num_tool_calls == 2 and len(t.turns) == 3
    assert len(pool.acquired[0].codes) == 2  # the third code block is not run
    assert pool.released == pool.acquired


def test_evaluation_preset_allows_30_tool_calls(tokenizer, image_task):
    assert EpisodeConfig.evaluation().max_tool_calls == 30
    assert EpisodeConfig.training().max_tool_calls == 4
    t, _, _ = run_one(tokenizer, image_task, [code_turn()] * 5 + [answer_turn()], max_tool_calls=30)
    assert t.end_reason is EndReason.DONE and t.num_successful_tool_calls == 5


@pytest.mark.parametrize(
    "turn, kind",
    [
        ("I think it is red.", "no_code_nor_answer"),
        ("<code>\n```python\nprint(1)\n", "unterminated_block"),
        ("<code>\n```python\n\n```\n</code>", "empty_code"),
    ],
)
def test_malformed_action_terminates_with_error_in_action(tokenizer, image_task, turn, kind):
    t, _, pool = run_one(tokenizer, image_task, [turn])
    assert t.end_reason is EndReason.ERROR_IN_ACTION and not t.broken
    assert t.turns[-1].action == kind
    assert pool.acquired == []


def test_code_error_terminates_by_default(tokenizer, image_task):
    t, _, _ = run_one(tokenizer, image_task, [code_turn("error NameError: x"), answer_turn()])
    assert t.end_reason is EndReason.ERROR_IN_ACTION
    assert "NameError" in t.turns[-1].tool_error and t.num_tool_calls == 0


def test_feedback_turns_errors_into_observations_that_cost_a_turn(tokenizer, image_task):
    t, _, _ = run_one(
        tokenizer,
        image_task,
        [code_turn("print partial", "error ZeroDivisionError: division by zero"), "no action here", answer_turn()],
        on_error="feedback",
    )
    assert t.end_reason is EndReason.DONE
    assert t.num_tool_calls == 2 and t.num_successful_tool_calls == 0
    text = tokenizer.decode(t.token_ids.tolist())
    assert ("Text Result:\npartial\nError: ZeroDivisionError: division by zero\nImage Result:\n</interpreter>") in text
    assert "Format error: the reply has neither a <code> block nor an <answer> block." in text
    # the model ended its malformed turn with <|im_end|>; only the newline is added
    second = t.turns[1]
    assert t.token_ids[second.generated_end - 1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(t.token_ids[second.generated_end : second.observation_end]).startswith(
        "\n<|im_start|>user\n<tool_response>"
    )


def test_feedback_after_a_timeout_continues_in_the_restarted_runtime(tokenizer, image_task):
    t, _, pool = run_one(
        tokenizer,
        image_task,
        [code_turn("images 1 64x48"), code_turn("timeout"), code_turn("names"), answer_turn()],
        on_error="feedback",
    )
    assert t.end_reason is EndReason.DONE
    assert t.num_tool_calls == 3 and t.num_successful_tool_calls == 2
    assert len(pool.acquired) == 1 and pool.released == pool.acquired
    text = tokenizer.decode(t.token_ids.tolist())
    assert "Text Result:\nError: TimeoutError: too slow\nImage Result:" in text
    assert "Text Result:\n[session restarted]\nimage_clue_0 image_clue_1\n" in text


@pytest.mark.parametrize("directive", ["timeout", "crash"])
def test_timeout_or_crash_of_the_code_is_an_error_in_action(tokenizer, image_task, directive):
    t, _, _ = run_one(tokenizer, image_task, [code_turn(directive), answer_turn()])
    assert t.end_reason is EndReason.ERROR_IN_ACTION and not t.broken


def test_per_turn_token_limit_ends_with_over_length(tokenizer, image_task):
    t, engine, _ = run_one(tokenizer, image_task, ["word " * 200], max_new_tokens_per_turn=16)
    assert t.end_reason is EndReason.OVER_LENGTH
    assert t.num_generated_tokens == 16 and t.turns[0].finish_reason == "length"


def test_total_length_counts_image_tokens_before_adding_an_observation(tokenizer, image_task):
    turns = [code_turn("images 1 560x560"), answer_turn()]
    full, _, _ = run_one(tokenizer, image_task, turns)
    first = full.turns[0]
    observation_len = first.observation_end - first.generated_end
    image_tokens = full.images[1].num_tokens
    assert image_tokens == 400
    limit = first.generated_end + observation_len - image_tokens + 50
    t, _, _ = run_one(tokenizer, image_task, turns, max_total_tokens=limit)
    assert t.end_reason is EndReason.OVER_LENGTH
    assert len(t.token_ids) == first.generated_end and len(t.images) == 1
    assert t.num_successful_tool_calls == 0


def test_generation_is_capped_by_the_remaining_total_budget(tokenizer, image_task):
    full, _, _ = run_one(tokenizer, image_task, ["word " * 200])
    limit = full.prompt_length + 10
    t, engine, _ = run_one(tokenizer, image_task, ["word " * 200], max_total_tokens=limit)
    assert engine.requests["img/0"][0].max_new_tokens == 10
    assert t.end_reason is EndReason.OVER_LENGTH and len(t.token_ids) == limit


def test_prompt_longer_than_the_budget_never_reaches_the_engine(tokenizer, image_task):
    t, engine, _ = run_one(tokenizer, image_task, [answer_turn()], max_total_tokens=50)
    assert t.end_reason is EndReason.OVER_LENGTH and engine.calls == []
    assert t.turns == () and t.num_generated_tokens == 0


def test_image_budget_ends_with_exceed_max_images(tokenizer, image_task):
    ok, _, _ = run_one(tokenizer, image_task, [code_turn("images 2 64x48"), answer_turn()], max_images=3)
    assert ok.end_reason is EndReason.DONE and len(ok.images) == 3
    t, _, _ = run_one(tokenizer, image_task, [code_turn("images 3 64x48"), answer_turn()], max_images=3)
    assert t.end_reason is EndReason.EXCEED_MAX_IMAGES and len(t.images) == 1


@pytest.mark.parametrize("directive", ["raise", "preload-fails\n#! images 1 64x48"])
def test_sandbox_failure_is_broken_by_default(tokenizer, image_task, directive):
    t, _, pool = run_one(tokenizer, image_task, [code_turn(directive), answer_turn()], on_error="feedback")
    assert t.end_reason is EndReason.SANDBOX_FAILURE and t.broken
    assert "sandbox failure" in t.turns[-1].tool_error
    assert pool.released == pool.acquired
    t2, _, _ = run_one(tokenizer, image_task, [code_turn(directive), answer_turn()], broken_end_reasons=frozenset())
    assert t2.end_reason is EndReason.SANDBOX_FAILURE and not t2.broken


def test_sandbox_acquisition_failure_is_a_sandbox_failure(tokenizer, image_task):
    class NoSandboxes(FakePool):
        def acquire(self, timeout_s=None):
            raise TimeoutError("no sandbox became ready")

    engine = ScriptedEngine(tokenizer, {"img": [code_turn(), answer_turn()]})
    (t,) = EpisodeRunner(engine, tokenizer, NoSandboxes()).run_trajectories([(image_task, 0)])
    assert t.end_reason is EndReason.SANDBOX_FAILURE and t.broken
    assert "no sandbox became ready" in t.turns[-1].tool_error


def test_groups_hold_g_rollouts_with_their_own_sandboxes(tokenizer, image_task):
    engine = ScriptedEngine(tokenizer, {"img": [code_turn("images 1 64x48"), answer_turn()]})
    pool = FakePool()
    groups = EpisodeRunner(engine, tokenizer, pool, EpisodeConfig()).run([image_task], group_size=3)
    (group,) = groups
    assert len(group) == 3 and [t.rollout_index for t in group.trajectories] == [0, 1, 2]
    assert len(pool.acquired) == 3 and len(pool.released) == 3
    assert engine.calls[0] == ("img/0", "img/1", "img/2")  # the first turn is one batch
    assert all(t.end_reason is EndReason.DONE for t in group.trajectories)


def test_config_validates_and_reads_broken_reasons_from_strings():
    config = EpisodeConfig(broken_end_reasons=("SANDBOX_FAILURE", "OVER_LENGTH"))
    assert config.broken_end_reasons == {EndReason.SANDBOX_FAILURE, EndReason.OVER_LENGTH}
    with pytest.raises(ValueError, match="got the string"):
        EpisodeConfig(broken_end_reasons="SANDBOX_FAILURE,OVER_LENGTH")
    with pytest.raises(ValueError, match="broken_end_reasons: 'TIRED' is not a valid"):
        EpisodeConfig(broken_end_reasons=["TIRED"])
    with pytest.raises(ValueError, match="on_error must be 'terminate' or 'feedback'"):
        EpisodeConfig(on_error="ignore")
    with pytest.raises(ValueError, match="max_images must be >= 1"):
        EpisodeConfig(max_images=0)


def test_an_image_qwen_cannot_take_is_an_error_of_the_action(tokenizer, image_task):
    turns = [code_turn("print drawn", "images 1 2x600"), answer_turn()]
    t, _, _ = run_one(tokenizer, image_task, turns)
    assert t.end_reason is EndReason.ERROR_IN_ACTION
    assert "aspect ratio" in t.turns[-1].tool_error
    t, _, pool = run_one(tokenizer, image_task, turns, on_error="feedback")
    assert t.end_reason is EndReason.DONE and len(t.images) == 1
    assert t.num_tool_calls == 1 and t.num_successful_tool_calls == 0
    assert "Text Result:\ndrawn\nError: an image could not be shown:" in tokenizer.decode(t.token_ids.tolist())
    assert set(pool.acquired[0].preloaded) == {"image_clue_0"}


def test_a_group_renders_its_prompt_once_and_shares_it(tokenizer, image_task, monkeypatch):
    engine = ScriptedEngine(tokenizer, {"img": [answer_turn()]})
    runner = EpisodeRunner(engine, tokenizer, FakePool(), EpisodeConfig())
    rendered = []
    render = runner.machine.render_prompt
    monkeypatch.setattr(runner.machine, "render_prompt", lambda task: rendered.append(task.id) or render(task))
    (group,) = runner.run([image_task], group_size=4)
    assert rendered == ["img"]
    first = group.trajectories[0]
    for t in group.trajectories[1:]:
        np.testing.assert_array_equal(t.token_ids[: t.prompt_length], first.token_ids[: first.prompt_length])
        assert t.images == first.images


def test_unreadable_media_end_that_episode_broken_and_the_others_run(tokenizer, image_task, tmp_path):
    """A video corrupted after validation (or deleted) must not take the whole batch down."""
    (tmp_path / "gone.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video at all")
    bad = Task(
        id="bad",
        question="?",
        answer="1",
        answer_type="numeric",
        data_source="test",
        video_path=str(tmp_path / "gone.mp4"),
    )
    engine = ScriptedEngine(tokenizer, {"img": [answer_turn("A")], "bad": [answer_turn("1")]})
    runner = EpisodeRunner(engine, tokenizer, FakePool(), EpisodeConfig(max_total_tokens=2048))
    good, broken = runner.run_trajectories([(image_task, 0), (bad, 0)])
    assert good.end_reason is EndReason.DONE and not good.broken
    assert broken.end_reason is EndReason.SANDBOX_FAILURE and broken.broken
    assert len(broken.token_ids) == 0 and broken.turns == ()


def test_an_rgb_task_file_is_preloaded_as_is_and_a_transparent_one_as_its_composite(tokenizer, image_task, tmp_path):
    """The sandbox reads an RGB file itself (no PNG re-encoded per rollout); a file with
    transparency gets the image composited onto white, as the model saw it."""
    _, _, pool = run_one(tokenizer, image_task, [code_turn("print 1"), answer_turn()])
    assert pool.acquired[0].preloaded["image_clue_0"] == image_task.image_path
    rgba = tmp_path / "rgba.png"
    Image.new("RGBA", (56, 56), (200, 30, 30, 0)).save(rgba)
    task = Task(
        id="rgba",
        question=image_task.question,
        answer="A",
        answer_type="multiple_choice",
        data_source="test",
        image_path=str(rgba),
        options=("red", "blue"),
    )
    _, _, pool = run_one(tokenizer, task, [code_turn("print 1"), answer_turn()])
    preloaded = pool.acquired[0].preloaded["image_clue_0"]
    assert preloaded.mode == "RGB" and preloaded.getpixel((0, 0)) == (255, 255, 255)
