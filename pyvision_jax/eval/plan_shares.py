"""Plan shares of evaluated rollouts on the "shapes" toy: which of `data.shape_plans.PLANS`
each response follows (`plan_of` over the text of all its turns), tallied over rollouts, and
the task families they are reported by."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pyvision_jax.data.shape_plans import PLANS, plan_of


def response_text(record: Mapping[str, Any]) -> str:
    """The generated text of every turn of a trajectories.jsonl record, in order."""
    return "\n".join(turn["text"] for turn in record["turns"])


def family_of(ability: str) -> str:
    """A shapes task's family ("shapes_easy", "shapes_hard") from its ability, the variant
    suffixes ("_tilted", "_speck") dropped; any other ability is its own family."""
    return "_".join(ability.split("_")[:2]) if ability.startswith("shapes_") else ability


def plan_shares(responses: Iterable[str]) -> dict[str, float]:
    """{plan: share of the responses that follow it} over every plan of PLANS (the shares sum to 1)."""
    counts = dict.fromkeys(PLANS, 0)
    for response in responses:
        counts[plan_of(response)] += 1
    total = sum(counts.values())
    if not total:
        raise ValueError("plan shares of no responses")
    return {plan: count / total for plan, count in counts.items()}


def plan_shares_by(labelled: Iterable[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """{label: plan shares of its responses} over (label, response) pairs, e.g. labelled by
    the task's ability (the family of a shapes task), labels in sorted order."""
    grouped: dict[str, list[str]] = {}
    for label, response in labelled:
        grouped.setdefault(label, []).append(response)
    return {label: plan_shares(grouped[label]) for label in sorted(grouped)}


def mean_shares(shares: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The plan shares averaged over several evaluations (e.g. one per seed)."""
    if not shares:
        raise ValueError("mean of no plan shares")
    return {plan: sum(s[plan] for s in shares) / len(shares) for plan in PLANS}


def slim_records(path: Path) -> Iterator[dict[str, Any]]:
    """The fields of each trajectories.jsonl record the summary reads (records carry images:
    nothing else stays in memory)."""
    with path.open() as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                yield {
                    "task_id": record["task_id"],
                    "correct": record["correct"],
                    "grading_failed": record.get("grading_failed", False),
                    "ability": (record.get("task") or {}).get("ability", ""),
                    "turns": [{"text": turn["text"]} for turn in record["turns"]],
                }
