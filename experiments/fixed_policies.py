"""The input-independent baselines of the shapes toys: policies that answer, or choose their
plan, without looking at the task. Each constant answer; each plan of `data.shape_plans` forced
on every task; fixed mixtures of plans; and the best of them and of the fixed temperatures,
chosen on the validation seed and reported on the held-out seed (`best_of`).

A forced plan runs as a scripted policy: a `ScriptedEngine` replays the plan's turns, the answer
copying what the code printed (as the SFT data is made, `train.sft_synthetic.plan_script`),
through the real episode code, sandbox and grading, so its evaluation is an ordinary evaluation
directory (`EvalSummary`, plan shares and accuracy by task ability included). Each plan gives one
answer per task, so one rollout a task gives its accuracy. A fixed mixture of plans scores the
same mixture of their per-task accuracies, so the best mixture is the best single plan.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from experiments.baseline_runs import set_tasks
from experiments.baselines import BASELINES_DIR, EvalSet, TemperatureBaselines
from experiments.eval_summary import EvalSummary, accuracy_by
from pyvision_jax.agent.engine import Engine
from pyvision_jax.data.shape_plans import scripted_plan
from pyvision_jax.data.shape_tasks import DATA_SOURCE as SHAPES_SOURCE
from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.eval.bootstrap import accuracy_interval, paired_difference_interval
from pyvision_jax.eval.plan_shares import family_of
from pyvision_jax.eval.policy import LoadedPolicy
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.train.sft_synthetic import plan_script
from pyvision_jax.wiring.episodes import episode_config
from pyvision_jax.wiring.evaluation import evaluate_policy
from pyvision_jax.wiring.model import model_config
from pyvision_jax.wiring.tasks import task_file

FORCED_PLANS = ("quick", "careful", "guess")
ANSWERS = ("A", "B", "C", "D")


def forced_plan_engine(plan: str):
    """An `evaluate_policy` engine factory: every request follows `plan`."""
    solution = scripted_plan(plan)

    def build(config: ml_collections.ConfigDict, policy: LoadedPolicy, tokenizer: Any) -> Engine:
        merge = episode_config(config, policy.model_config, evaluation=True).merge_size
        return ScriptedEngine(tokenizer, plan_script(lambda request_id: solution, tokenizer), merge_size=merge)

    return build


def evaluate_forced_plan(
    config: ml_collections.ConfigDict, tasks: str | os.PathLike, out_dir: str | os.PathLike, plan: str
) -> EvalSummary:
    """`plan` forced on every task of the file `tasks`, one rollout a task, into `out_dir` (a
    rerun reuses it). No weights are loaded: the script is the policy."""
    policy = LoadedPolicy("params", f"forced:{plan}", model_config(config), None, 0, None)
    evaluate_policy(
        config,
        policy,
        task_file(config, tasks),
        str(Path(tasks).absolute()),
        out_dir,
        k=1,
        progress=False,
        engine_factory=forced_plan_engine(plan),
    )
    return EvalSummary.from_dir(out_dir)


@dataclasses.dataclass(frozen=True)
class FixedPolicy:
    """One input-independent policy's per-task accuracies on the validation and the held-out
    tasks (task id -> accuracy), the tasks' abilities (task id -> ability) and its held-out plan
    shares, over all tasks, by ability and by family (empty for a constant answer, which follows
    no plan)."""

    name: str
    validation: Mapping[str, float]
    heldout: Mapping[str, float]
    abilities: Mapping[str, str]
    plans: Mapping[str, float] = dataclasses.field(default_factory=dict)
    plans_by_ability: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    plans_by_family: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def validation_accuracy(self) -> float:
        return sum(self.validation.values()) / len(self.validation)

    def as_dict(self) -> dict[str, Any]:
        """Its held-out accuracy with the 95 % bootstrap interval over tasks, by ability too."""
        interval = accuracy_interval(list(self.heldout.values()))
        return {
            "name": self.name,
            "validation_accuracy": self.validation_accuracy,
            "heldout_accuracy": interval.estimate,
            "heldout_accuracy_ci95": interval.as_list(),
            "heldout_accuracy_by_ability": accuracy_by(self.heldout, self.abilities),
            "heldout_accuracy_by_family": accuracy_by(
                self.heldout, {task: family_of(ability) for task, ability in self.abilities.items()}
            ),
            "plans": dict(self.plans),
            "plans_by_ability": {ability: dict(shares) for ability, shares in self.plans_by_ability.items()},
            "plans_by_family": {family: dict(shares) for family, shares in self.plans_by_family.items()},
        }

    def gain_of(self, run: EvalSummary) -> dict[str, Any]:
        """A held-out evaluation's accuracy minus this policy's on the same tasks, with its
        paired 95 % bootstrap interval."""
        interval = paired_difference_interval(self.heldout, run.per_task)
        return {"baseline": self.name, "estimate": interval.estimate, "ci95": interval.as_list()}


def abilities_of(*task_sets: Iterable[Task]) -> dict[str, str]:
    """Task id -> ability over every task of the sets."""
    return {task.id: task.ability for tasks in task_sets for task in tasks}


def constant_answer(answer: str, validation: Sequence[Task], heldout: Sequence[Task]) -> FixedPolicy:
    """The policy that answers `answer` on every (multiple-choice) task."""
    for task in (*validation, *heldout):
        if task.answer_type != "multiple_choice":
            raise ValueError(
                f"a constant answer scores multiple-choice tasks only; task {task.id} is {task.answer_type}"
            )

    def right(tasks: Sequence[Task]) -> dict[str, float]:
        return {task.id: float(task.answer == answer) for task in tasks}

    return FixedPolicy(f"answer {answer}", right(validation), right(heldout), abilities_of(validation, heldout))


def evaluated(name: str, validation: EvalSummary, heldout: EvalSummary, abilities: Mapping[str, str]) -> FixedPolicy:
    """A fixed policy's two evaluations (a forced plan's, `evaluate_forced_plan`, or the starting
    policy's at a fixed temperature) as a `FixedPolicy`."""
    return FixedPolicy(
        name,
        validation.per_task,
        heldout.per_task,
        abilities,
        dict(heldout.plans),
        heldout.plans_by_ability,
        heldout.plans_by_family,
    )


def best_of(policies: Sequence[FixedPolicy]) -> FixedPolicy:
    """The policy of highest validation accuracy, the first listed among equals."""
    if not policies:
        raise ValueError("best of no fixed policies")
    return policies[max(range(len(policies)), key=lambda i: (policies[i].validation_accuracy, -i))]


def input_independent_baselines(
    constants: Sequence[FixedPolicy], plans: Sequence[FixedPolicy], temperatures: Sequence[FixedPolicy]
) -> dict[str, Any]:
    """Every input-independent baseline and the best of each kind (of the kinds given), chosen on
    validation; the best of all ("best_input_independent") is what a policy that reads its input
    has to beat."""
    best = best_of_each_kind(constants, plans, temperatures)
    return {
        "constants": [p.as_dict() for p in constants],
        "forced_plans": [p.as_dict() for p in plans],
        "temperatures": [p.as_dict() for p in temperatures],
        **{key: policy.as_dict() for key, policy in best.items()},
        "best_input_independent": best_of(list(best.values())).as_dict(),
    }


def best_of_each_kind(
    constants: Sequence[FixedPolicy], plans: Sequence[FixedPolicy], temperatures: Sequence[FixedPolicy]
) -> dict[str, FixedPolicy]:
    """{"best_constant" | "best_mixture" | "best_temperature": the best of that kind on validation},
    the kinds given."""
    kinds = (("best_constant", constants), ("best_mixture", plans), ("best_temperature", temperatures))
    return {key: best_of(policies) for key, policies in kinds if policies}


@dataclasses.dataclass(frozen=True)
class FixedPolicies:
    """Every input-independent policy of a config's two sets, by kind."""

    constants: Sequence[FixedPolicy]
    plans: Sequence[FixedPolicy]
    temperatures: Sequence[FixedPolicy]

    @property
    def best(self) -> FixedPolicy:
        """The best on validation of the best of each kind."""
        return best_of(list(best_of_each_kind(self.constants, self.plans, self.temperatures).values()))

    def as_dict(self) -> dict[str, Any]:
        return input_independent_baselines(self.constants, self.plans, self.temperatures)


def fixed_policy_baselines(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    validation: EvalSet,
    heldout: EvalSet,
    temperatures: TemperatureBaselines,
) -> FixedPolicies:
    """The input-independent policies of a config's validation and held-out sets (their tasks in
    WORKDIR/<set>/tasks): the fixed temperatures already evaluated, each constant answer where
    every task is multiple-choice, and each plan forced on every task where every task is a
    shapes task (evaluations in WORKDIR/baselines/forced/seed_<S>/<plan>, reused on a rerun)."""
    paths = {s.name: set_tasks(config, workdir, s) for s in (validation, heldout)}
    tasks = {name: load_tasks(path).tasks for name, path in paths.items()}
    v_tasks, h_tasks = tasks[validation.name], tasks[heldout.name]
    abilities = abilities_of(v_tasks, h_tasks)
    every = (*v_tasks, *h_tasks)
    constants = (
        [constant_answer(a, v_tasks, h_tasks) for a in ANSWERS]
        if all(t.answer_type == "multiple_choice" for t in every)
        else []
    )
    plans = []
    if all(t.data_source == SHAPES_SOURCE for t in every):
        root = Path(workdir) / BASELINES_DIR / "forced"
        for plan in FORCED_PLANS:
            runs = [
                evaluate_forced_plan(config, paths[s.name], root / f"seed_{s.seed}" / plan, plan)
                for s in (validation, heldout)
            ]
            plans.append(evaluated(f"plan {plan}", *runs, abilities))
    fixed = [
        evaluated(f"T {t:g}", temperatures.validation[t], temperatures.heldout[t], abilities)
        for t in temperatures.validation
    ]
    return FixedPolicies(constants, plans, fixed)
