"""Config -> objects: every config section maps onto its dataclass in `wiring`, with clear
errors naming the field, and the trainer's source follows `rollout.mode`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs.base import get_config as base_config
from configs.pyvision_image_7b import get_config as image_7b_config
from pyvision_jax import wiring
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.models import ModelConfig
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from pyvision_jax.rollout.sources import BackgroundSource, SyncSource
from tests.agent.fake_sandbox import FakePool
from tests.tiny_random_cpu import get_config as tiny_config


def test_lists_in_configs_are_tuples_and_strings_are_refused_naming_the_field():
    config = tiny_config()
    assert wiring.int_tuple(config.train.length_buckets, "train.length_buckets") == tuple(config.train.length_buckets)
    with pytest.raises(ValueError, match="train.length_buckets must be a tuple of integers"):
        wiring.int_tuple("512,1024", "train.length_buckets")
    with pytest.raises(ValueError, match="data.train_files must be a tuple of strings"):
        wiring.str_tuple("a.jsonl,b.jsonl", "data.train_files")


def test_the_7b_config_derives_from_the_base_schema_not_the_cpu_toy():
    base, big = base_config(), image_7b_config()
    assert set(big.keys()) == set(base.keys())
    for section in base.keys():
        if hasattr(base[section], "keys"):
            assert set(big[section].keys()) == set(base[section].keys()), section
    assert big.model.preset == "7b" and big.rollout.mode == "external"


def test_episode_config_takes_eval_budgets_only_for_evaluation():
    config = tiny_config()
    model = ModelConfig.preset("tiny")
    training = wiring.episode_config(config, model)
    evaluation = wiring.episode_config(config, model, evaluation=True)
    assert training.max_tool_calls == config.episode.max_tool_calls
    assert evaluation.max_tool_calls == config.eval.max_tool_calls
    assert wiring.episode_config(config, model, evaluation=True, max_tool_calls=7).max_tool_calls == 7
    assert training.broken_end_reasons == {EndReason.SANDBOX_FAILURE}
    assert training.merge_size == model.vision.spatial_merge_size


def test_tokenizer_directory_rules(tmp_path):
    config = tiny_config()
    config.model.hf_dir = ""
    assert wiring.tokenizer_dir(config) == TINY_TOKENIZER_DIR
    assert wiring.tokenizer_dir(config, carried=tmp_path) == tmp_path  # a checkpoint's own tokenizer wins
    config.model.tokenizer = ""
    with pytest.raises(ValueError, match="model.tokenizer is empty"):
        wiring.tokenizer_dir(config)
    config.model.hf_dir = str(tmp_path)
    assert wiring.tokenizer_dir(config) == tmp_path


def test_group_source_follows_rollout_mode(tmp_path):
    config = tiny_config()
    model = ModelConfig.preset("tiny")
    parts = dict(engine=object(), sandboxes=FakePool(), tasks=())
    with pytest.raises(ValueError, match="no tasks to draw from"):
        wiring.group_source(config, tmp_path, model, None, None, **parts)
    parts["tasks"] = ("a task",)
    assert isinstance(wiring.group_source(config, tmp_path, model, None, None, **parts), SyncSource)
    config.rollout.mode = "async"
    with pytest.raises(ValueError, match="set rollout.max_staleness >= 1"):
        wiring.group_source(config, tmp_path, model, None, None, **parts)
    config.rollout.max_staleness = 1
    source = wiring.group_source(config, tmp_path, model, None, None, **parts)
    assert isinstance(source, BackgroundSource) and source.holds_params
    source.close()
    config.rollout.mode = "nearby"
    with pytest.raises(ValueError, match="rollout.mode='nearby' must be one of"):
        wiring.group_source(config, tmp_path, model, None, None, **parts)
    config.rollout.mode, config.rollout.engine = "sync", "vllm"
    with pytest.raises(ValueError, match="cannot run inside the trainer"):
        wiring.group_source(config, tmp_path, model, None, None, **parts)


CACHE_PROBE = """
import sys
import jax, jax.numpy as jnp
from pyvision_jax import wiring
print(wiring.use_compilation_cache(sys.argv[1]))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(5)).block_until_ready()
"""


@pytest.mark.parametrize("preset", [False, True])
def test_a_run_keeps_compiled_executables_in_its_workdir_unless_a_cache_is_set(tmp_path, preset):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu")
    if preset:
        env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run(
        [sys.executable, "-c", CACHE_PROBE, str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    used = tmp_path / ("mine" if preset else "run/jax_cache")
    assert out.stdout.strip() == str(used)
    assert any(used.iterdir())
    assert not (tmp_path / "run").exists() if preset else not (tmp_path / "mine").exists()


OPTIMIZATION_PROBE = """
import sys
import jax, jax.numpy as jnp
from jax.extend.backend import get_compile_options
from pyvision_jax import wiring
if sys.argv[1] == "after_start":
    jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready()
print(wiring.use_backend_optimization_level(int(sys.argv[2])))
print(get_compile_options(1, 1).executable_build_options.debug_options.xla_backend_optimization_level)
"""


@pytest.mark.parametrize(
    ("when", "preset", "level", "notice", "compiled_at"),
    [
        ("before_start", "", 1, None, 1),
        ("before_start", "", -1, None, None),  # XLA's default
        ("before_start", "--xla_backend_optimization_level=3", 1, "XLA_FLAGS sets", 3),
        ("after_start", "", 1, "backend started", None),
    ],
)
def test_a_run_sets_the_llvm_optimization_level_before_jax_starts_and_a_user_flag_wins(
    when, preset, level, notice, compiled_at
):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu")
    if preset:
        env["XLA_FLAGS"] = preset
    default = subprocess.run(
        [sys.executable, "-c", OPTIMIZATION_PROBE, "before_start", "-1"],
        env=env | {"XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = subprocess.run(
        [sys.executable, "-c", OPTIMIZATION_PROBE, when, str(level)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert default.returncode == 0 and out.returncode == 0, default.stderr[-2000:] + out.stderr[-2000:]
    said, compiled = out.stdout.split("\n")[:2]
    xla_default = int(default.stdout.split("\n")[1])
    assert xla_default != 1
    assert (said == "None") if notice is None else (notice in said and "xla_backend_optimization_level=1" in said)
    assert int(compiled) == (xla_default if compiled_at is None else compiled_at)


def test_an_optimization_level_out_of_range_names_its_field():
    with pytest.raises(ValueError, match=r"--config.train.xla_backend_optimization_level=7 must be -1"):
        wiring.use_backend_optimization_level(7)


@pytest.mark.parametrize("control", ["", "random", "entropy_min"])
def test_reward_controls_reach_the_selection_and_entropy_min_needs_an_entropy_term(control):
    config = tiny_config()
    config.seed = 5
    config.rl.reward_control = control
    config.rl.entropy_coef = -1.0
    selection = wiring.grpo_settings(config).selection
    assert (selection.reward_control, selection.control_seed) == (control, 5)
    config.rl.entropy_coef = 0.0
    if control == "entropy_min":
        with pytest.raises(ValueError, match="needs rl.entropy_coef < 0"):
            wiring.grpo_settings(config)
    else:
        assert wiring.grpo_settings(config).step.loss.entropy_coef == 0.0


@pytest.mark.parametrize("warm_up", [False, True])
def test_rollout_warm_up_compiles_the_jax_engines_shapes_images_included_when_built(warm_up):
    config = tiny_config()
    config.rollout.max_batch, config.rollout.length_buckets, config.rollout.warm_up = 1, (64,), warm_up
    model, params = wiring.load_model(config)
    engine = wiring.jax_engine(config, model, params, wiring.load_tokenizer(config), version=0, max_total_tokens=64)
    # one batch size, one length bucket and extension bucket, one cache length: text and image blocks
    expected = {"prefill": 2, "extend": 2, "decode": 1, "compact": 1, "swap": 0, "grow": 0}
    assert engine.compile_counts == (expected if warm_up else dict.fromkeys(expected, 0))
    assert not engine.calls
    # blocks with images start at the floors of one image per row either way (no creeping shapes)
    assert sorted(engine._vision.floors) == [("extend", 1), ("prefill", 1)]


def test_rollout_batch_sizes_are_the_jax_engines_row_counts_capped_at_max_batch():
    config = tiny_config()
    config.rollout.max_batch, config.rollout.length_buckets = 4, (64,)
    model, params = wiring.load_model(config)
    tokenizer = wiring.load_tokenizer(config)
    default = wiring.jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=64)
    assert default.prefill_batches == default.decode_batches == (1, 2, 4)
    config.rollout.batch_sizes = (4,)
    engine = wiring.jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=64)
    assert engine.prefill_batches == engine.decode_batches == (4,)
    # the vision floors cover only the row counts the engine dispatches
    assert sorted(engine._vision.floors) == [("extend", 4), ("prefill", 4)]
    # capped at max_batch, which is always one of them: a smaller max_batch override just works
    for sizes, rows in [((32,), (4,)), ((2,), (2, 4)), ((2, 8), (2, 4))]:
        config.rollout.batch_sizes = sizes
        engine = wiring.jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=64)
        assert engine.prefill_batches == engine.decode_batches == rows
    config.rollout.batch_sizes = (0, 4)
    with pytest.raises(ValueError, match=r"rollout\.batch_sizes must be positive row counts, got \(0, 4\)"):
        wiring.jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=64)
