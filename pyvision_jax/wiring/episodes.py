"""The `episode`, `grading`, `sandbox` and sampling sections: episode budgets and prompts,
the scorer routes (with the LLM judge), the sandbox pool and sampling parameters."""

from __future__ import annotations

from pathlib import Path

import ml_collections

from pyvision_jax.agent.engine import SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.prompts import PromptTemplates
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
from pyvision_jax.grading.judge import JudgeConfig, LLMJudge, family_templates, judge_template
from pyvision_jax.grading.routes import ScorerRoutes
from pyvision_jax.grading.trajectory import ScoringRules
from pyvision_jax.models import ModelConfig
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.credentials import judge_api_key


def episode_config(
    config: ml_collections.ConfigDict,
    model: ModelConfig,
    *,
    evaluation: bool = False,
    max_tool_calls: int | None = None,
) -> EpisodeConfig:
    """The episode budgets of `episode.*`; with `evaluation`, the `eval.*` budgets replace the
    tool-call and token budgets (`max_tool_calls` replaces eval.max_tool_calls)."""
    e, v = config.episode, config.eval
    budgets = {
        "max_tool_calls": e.max_tool_calls,
        "max_new_tokens_per_turn": e.max_new_tokens_per_turn,
        "max_total_tokens": e.max_total_tokens,
    }
    budgets["max_response_tokens"] = e.max_response_tokens
    if evaluation:
        budgets = {
            "max_tool_calls": v.max_tool_calls if max_tool_calls is None else max_tool_calls,
            "max_new_tokens_per_turn": v.max_new_tokens_per_turn,
            "max_total_tokens": v.max_total_tokens,
            "max_response_tokens": 0,
        }
    return EpisodeConfig(
        **{key: int(value) for key, value in budgets.items()},
        max_images=e.max_images,
        on_error=e.on_error,
        broken_end_reasons=str_tuple(e.broken_end_reasons, "episode.broken_end_reasons"),
        image_min_pixels=e.image_min_pixels,
        image_max_pixels=e.image_max_pixels,
        action_syntax=e.action_syntax,
        turn_boundary=e.turn_boundary,
        image_cap_rule=e.image_cap_rule,
        stdout_strip=e.stdout_strip,
        observation_format=e.observation_format,
        prompts=PromptTemplates.from_files(e.image_prompt_file, e.video_prompt_file),
        patch_size=model.vision.patch_size,
        merge_size=model.vision.spatial_merge_size,
        max_concurrent=e.max_concurrent,
        setup_code=sandbox_setup_code(config),
    )


def sandbox_setup_code(config: ml_collections.ConfigDict) -> str:
    """The text of `sandbox.setup_file` ("" when unset), with an error naming the key."""
    path = config.sandbox.setup_file
    if not path:
        return ""
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ValueError(f"sandbox.setup_file: cannot read {path!r} ({err.strerror or err})") from None


def own_judge_prompt(config: ml_collections.ConfigDict) -> bool:
    """Whether the judge uses the project's own prompt: no grading.judge_prompt_file and no
    grading.judge_prompt_files were given."""
    return not config.grading.judge_prompt_file and not config.grading.judge_prompt_files


def scorer_routes(config: ml_collections.ConfigDict) -> ScorerRoutes:
    """The `grading` section: the data_source route table, the scoring rules and, when a
    route needs it, the LLM judge at grading.judge_url. The verdict pattern belongs to the
    user's judge prompt files: with the project's own prompt (which asks for Yes/No after
    "Judgement:") its own verdict words are read."""
    g = config.grading
    routes = tuple(str_tuple(route, f"grading.routes entry {route!r}") for route in g.routes)
    judge = None
    if g.judge_url:
        judge = LLMJudge(
            JudgeConfig(
                base_url=g.judge_url,
                model=g.judge_model,
                api_key=judge_api_key(config),
                timeout_s=g.judge_timeout_s,
                max_retries=g.judge_max_retries,
                max_concurrency=g.judge_max_concurrency,
                max_tokens=g.judge_max_tokens,
                prompt=judge_template(g.judge_prompt_file),
                family_prompts=family_templates(g.judge_prompt_files),
                temperature=float(g.judge_temperature),
                system_prompt=g.judge_system_prompt,
                verdict_pattern="" if own_judge_prompt(config) else g.judge_verdict_pattern,
            )
        )
    return ScorerRoutes(routes, ScoringRules(answer_gate=g.answer_gate, mra_thresholds=g.mra_thresholds), judge)


def sandbox_pool(config: ml_collections.ConfigDict) -> SandboxPool:
    s = config.sandbox
    return SandboxPool(
        SandboxConfig(
            timeout_s=s.timeout_s,
            allow_unisolated=s.allow_unisolated,
            fork_runtimes=bool(s.fork_runtimes),
            memory_bytes=int(s.memory_limit_mb) << 20,
        ),
        size=s.pool_size,
    )


def sampling_params(section: ml_collections.ConfigDict, seed: int | None = None) -> SamplingParams:
    """Sampling of `rollout` (training) or `eval`: temperature, top_p, top_k."""
    return SamplingParams(temperature=section.temperature, top_p=section.top_p, top_k=section.top_k, seed=seed)
