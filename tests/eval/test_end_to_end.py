"""The tiny random Qwen2.5-VL through the JAX engine, end to end: every checkpoint layout
loads to the same weights, and an evaluation from a training checkpoint runs to a complete
results.json and report."""

import json

import jax
import numpy as np
import pytest

from pyvision_jax.convert import save_hf, save_params
from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.data.tasks import write_tasks_jsonl
from pyvision_jax.eval.policy import detect_checkpoint_kind
from pyvision_jax.eval.records import REPORT_FILE, RESULTS_FILE, TRAJECTORIES_FILE
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer
from pyvision_jax.wiring.evaluation import evaluate_checkpoint, jax_engine, load_policy
from tests.agent.fake_sandbox import FakePool
from tests.tiny_random_cpu import get_config as tiny_cpu_config

TRAIN_STEP = 3


def get_config():
    """The tiny random-init model these checkpoints are made of (not the packaged SFT one)."""
    config = tiny_cpu_config()
    config.model.hf_dir, config.model.preset = "", "tiny"
    return config


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same tiny weights as an HF directory, a params checkpoint and a trainer workdir."""
    root = tmp_path_factory.mktemp("checkpoints")
    config = ModelConfig.preset("tiny")
    # random values of the right shapes: much cheaper than the eager init on a busy CPU
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda a: (0.05 * rng.standard_normal(a.shape)).astype(a.dtype), jax.eval_shape(lambda: init_params(config))
    )
    tokenizer_files = sorted(p for p in TINY_TOKENIZER_DIR.iterdir() if p.is_file())
    save_hf(config, params, root / "hf", extra_files=tokenizer_files, progress=False)
    save_params(config, params, root / "flax")
    workdir = root / "train"
    train_config = get_config()
    workdir.mkdir()
    (workdir / "config.json").write_text(train_config.to_json_best_effort())
    state = init_train_state(params, make_optimizer(OptimizerConfig()), 0)
    manager = TrainCheckpoints(workdir / "checkpoints", every=1, keep=2)
    manager.save(TRAIN_STEP, state, {"tasks_drawn": 2}, force=True)
    manager.close()
    return {"hf": root / "hf", "params": root / "flax", "train": workdir, "weights": params}


def test_every_layout_loads_the_same_weights(checkpoints):
    config = get_config()
    for kind in ("hf", "params", "train"):
        assert detect_checkpoint_kind(checkpoints[kind]) == kind
        policy = load_policy(checkpoints[kind], config, progress=False)
        assert policy.kind == kind
        assert policy.model_config == ModelConfig.preset("tiny")
        assert policy.version == (TRAIN_STEP if kind == "train" else 0)
        jax.tree.map(np.testing.assert_array_equal, policy.params, checkpoints["weights"])
    step_dir = checkpoints["train"] / "checkpoints" / str(TRAIN_STEP)
    assert load_policy(step_dir, config, progress=False).version == TRAIN_STEP
    assert load_policy(step_dir.parent, config, progress=False).version == TRAIN_STEP
    assert load_policy(checkpoints["hf"], config, progress=False).tokenizer_dir == str(checkpoints["hf"])
    config.model.param_dtype = "bfloat16"
    cast = load_policy(checkpoints["train"], config, progress=False).params
    assert {leaf.dtype.name for leaf in jax.tree.leaves(cast)} == {"bfloat16"}


def test_a_directory_that_is_no_checkpoint_is_named(tmp_path):
    with pytest.raises(ValueError, match="is not a checkpoint"):
        detect_checkpoint_kind(tmp_path)


def test_mismatched_architecture_is_a_clear_error(checkpoints, tmp_path):
    """The trainer's resolved config names the architecture; here a wider vocabulary."""
    wider = tmp_path / "wider"
    wider.mkdir()
    (wider / "config.json").write_text(json.dumps(hf_config_dict(ModelConfig.preset("tiny").replace(vocab_size=4096))))
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    trained = get_config()
    trained.model.hf_dir = str(wider)
    (workdir / "config.json").write_text(trained.to_json_best_effort())
    (workdir / "checkpoints").symlink_to(checkpoints["train"] / "checkpoints")
    with pytest.raises(ValueError, match="params do not match the model config"):
        load_policy(workdir, get_config(), progress=False)


def test_tiny_model_evaluates_end_to_end_through_the_jax_engine(checkpoints, benchmark, tmp_path):
    data = tmp_path / "tasks.jsonl"
    write_tasks_jsonl(data, benchmark[:3])
    config = get_config()
    config.eval.k = 2
    config.eval.max_new_tokens_per_turn = 12
    config.eval.max_total_tokens = 512  # prompts are ~375 tokens: one length bucket
    config.rollout.length_buckets = (512,)
    config.rollout.max_batch = 1  # one prefill shape: the fewest compilations
    built = []

    def engine_factory(cfg, policy, tokenizer):
        built.append(jax_engine(cfg, policy, tokenizer))
        return built[-1]

    out = tmp_path / "eval"
    results = evaluate_checkpoint(
        config, checkpoints["train"], data, out, progress=False, engine_factory=engine_factory, sandboxes=FakePool()
    )
    (engine,) = built
    assert isinstance(engine, JaxEngine) and engine.version == TRAIN_STEP
    assert results["complete"] and results["num_tasks"] == 3 and results["num_rollouts"] == 6
    assert results["policy_version"] == TRAIN_STEP
    assert results["run"]["checkpoint_kind"] == "train"
    assert sum(results["end_reasons"].values()) == 6
    assert set(results["end_reasons"]) <= {"DONE", "OVER_LENGTH", "ERROR_IN_ACTION", "EXCEED_MAX_TURNS"}
    assert results["mean_response_tokens"] > 0
    assert results["video_token_efficiency"]["num_video_tasks"] == 1
    records = [json.loads(line) for line in (out / TRAJECTORIES_FILE).read_text().splitlines()]
    assert len(records) == 6
    assert all(r["policy_version"] == TRAIN_STEP for r in records)
    assert all(0.0 <= r["score"] <= 1.0 for r in records)
    assert json.loads((out / RESULTS_FILE).read_text())["avg_at_k"] == results["avg_at_k"]
    assert (out / REPORT_FILE).read_text().count('<section class="trajectory') == 6
