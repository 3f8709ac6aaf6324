"""Hand-made trajectories for grading tests: one code turn, then a final turn with the
response text; token id = character code (`CharTokenizer`)."""

import numpy as np

from pyvision_jax.agent.trajectory import EndReason, Trajectory, TurnRecord
from pyvision_jax.data.tasks import Task


class CharTokenizer:
    """Token id = character code."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def trajectory(response: str, *, answered: bool = True, broken: bool = False, observation: str = "|") -> Trajectory:
    """Prompt "Q?", a code turn "thinking", the tool output `observation`, the final turn."""
    prompt = [ord(c) for c in "Q?"]
    ids = prompt + [ord(c) for c in "thinking"] + [ord(c) for c in observation] + [ord(c) for c in response]
    n, shown = len(ids), 10 + len(observation)
    turns = (
        TurnRecord(2, 10, shown, "stop", "code", 0),
        TurnRecord(shown, n, n, "stop", "answer" if answered else "none", 0),
    )
    return Trajectory(
        task_id="t",
        rollout_index=0,
        token_ids=ids,
        loss_mask=np.ones(n),
        logprobs=np.zeros(n),
        prompt_length=2,
        images=(),
        turns=turns,
        num_tool_calls=1,
        num_successful_tool_calls=1,
        end_reason=EndReason.DONE if answered else EndReason.EXCEED_MAX_TURNS,
        broken=broken,
        final_answer="x" if answered else None,
        policy_version=0,
    )


def task(answer_type: str, answer: str, options=(), data_source: str = "s") -> Task:
    return Task(
        id="t",
        question="q",
        answer=answer,
        answer_type=answer_type,
        data_source=data_source,
        image_path="i.png",
        options=tuple(options),
    )


def boxed(text: str) -> str:
    return f"<answer>\n\\boxed{{{text}}}\n</answer>"
