"""avg@k, pass@k and the summary against hand-computed values."""

import pytest

from pyvision_jax.eval.metrics import RolloutOutcome, avg_at_k, pass_at_k, summarize


def test_avg_at_k_is_the_mean_over_tasks_of_the_mean_over_samples():
    # task means 0.5, 0.25, 1.0 -> 1.75 / 3 (a flat mean over the 7 samples would be 3/7)
    scores = [[1.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0]]
    assert avg_at_k(scores) == pytest.approx(1.75 / 3)
    assert avg_at_k([[0.6, 0.8]]) == pytest.approx(0.7)
    assert avg_at_k([]) == 0.0


def test_pass_at_k_counts_tasks_with_any_correct_sample():
    assert pass_at_k([[False, True], [False, False], [True, True], [False, False]]) == 0.5
    assert pass_at_k([[False] * 32]) == 0.0
    assert pass_at_k([]) == 0.0


def outcome(
    task, index, score, correct, tools=0, end="DONE", visual=4, response=10, source="s", video=False, uniform=None
):
    return RolloutOutcome(task, source, index, score, correct, tools, end, visual, response, video, uniform)


def test_summary_of_mixed_rollouts():
    outcomes = [
        outcome("a", 0, 1.0, True, tools=2, source="x"),
        outcome("a", 1, 0.0, False, tools=0, end="ERROR_IN_ACTION", source="x"),
        outcome("b", 0, 0.3, False, tools=1, source="y", response=20),
        outcome("b", 1, 0.6, True, tools=1, source="y", response=30),
        outcome("v", 0, 0.0, False, tools=3, end="EXCEED_MAX_TURNS", source="y", visual=100, video=True, uniform=1000),
        outcome("v", 1, 0.0, False, tools=1, end="OVER_LENGTH", source="y", visual=300, video=True, uniform=1000),
    ]
    s = summarize(outcomes)
    assert s["num_tasks"] == 3 and s["num_rollouts"] == 6
    assert s["accuracy"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert s["avg_at_k"] == pytest.approx((0.5 + 0.45 + 0.0) / 3)
    assert s["pass_at_k"] == pytest.approx(2 / 3)
    assert s["per_data_source"]["x"] == {
        "num_tasks": 1,
        "num_rollouts": 2,
        "num_grading_failures": 0,
        "accuracy": 0.5,
        "avg_at_k": 0.5,
        "pass_at_k": 1.0,
    }
    assert s["per_data_source"]["y"]["avg_at_k"] == pytest.approx(0.45 / 2)
    assert s["per_data_source"]["y"]["pass_at_k"] == pytest.approx(0.5)
    assert s["tool_calls"]["mean"] == pytest.approx(8 / 6)
    assert s["tool_calls"]["distribution"] == {"0": 1, "1": 3, "2": 1, "3": 1}
    assert s["end_reasons"] == {"DONE": 3, "ERROR_IN_ACTION": 1, "EXCEED_MAX_TURNS": 1, "OVER_LENGTH": 1}
    assert s["mean_visual_tokens_per_task"] == pytest.approx((4 + 4 + 200) / 3)
    assert s["mean_response_tokens"] == pytest.approx((10 + 10 + 20 + 30 + 10 + 10) / 6)
    video = s["video_token_efficiency"]
    assert video["num_video_tasks"] == 1
    assert video["per_task"]["v"] == {"agent_visual_tokens": 200.0, "uniform_1fps_tokens": 1000, "ratio": 0.2}
    assert video["ratio_of_means"] == pytest.approx(0.2)


def test_outcome_from_a_record_ignores_the_view_fields():
    record = {
        "task_id": "a",
        "data_source": "s",
        "rollout_index": 0,
        "score": 1.0,
        "correct": True,
        "num_tool_calls": 1,
        "end_reason": "DONE",
        "visual_tokens": 4,
        "response_tokens": 7,
        "is_video": False,
        "uniform_video_tokens": None,
        "turns": [],
        "prompt": "...",
    }
    assert RolloutOutcome.from_record(record) == outcome("a", 0, 1.0, True, tools=1, response=7)


def test_rollouts_whose_grading_failed_are_left_out_and_counted():
    def outcome(task, index, correct, failed=False):
        return RolloutOutcome(
            task_id=task,
            data_source="s",
            rollout_index=index,
            score=float(correct),
            correct=correct,
            num_tool_calls=0,
            end_reason="DONE",
            visual_tokens=0,
            response_tokens=1,
            grading_failed=failed,
        )

    results = summarize(
        [outcome("a", 0, True), outcome("a", 1, False, failed=True), outcome("b", 0, False, failed=True)]
    )
    assert (results["num_tasks"], results["num_rollouts"], results["num_grading_failures"]) == (1, 1, 2)
    assert results["accuracy"] == 1.0 and results["pass_at_k"] == 1.0
