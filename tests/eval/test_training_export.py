"""`pyvision-convert flax2hf` on a training checkpoint: the run's params as an HF directory
that transformers loads to the Flax logits, with the source model's files, and that
evaluates exactly like the workdir it came from."""

import json

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from pyvision_jax.cli.convert import main as convert_main
from pyvision_jax.convert import load_hf
from pyvision_jax.convert.hf import INDEX_FILE
from pyvision_jax.data.tasks import write_tasks_jsonl
from pyvision_jax.eval.records import TRAJECTORIES_FILE
from pyvision_jax.models import ModelConfig, logits
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from pyvision_jax.wiring.evaluation import evaluate_checkpoint
from tests.agent.fake_sandbox import FakePool
from tests.eval.tiny_run import write_training_workdir
from tests.models.hf_reference import build_hf_model, hf_logits
from tests.models.model_inputs import image_tokens, patches, right_padded, text
from tests.tiny_random_cpu import get_config

STEP = 4
GRID = (1, 8, 8)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A workdir whose run started from a transformers-written source model (tokenizer, chat
    template and generation config beside it, an extra config key) and moved its weights."""
    root = tmp_path_factory.mktemp("export")
    model = ModelConfig.preset("tiny")
    source = root / "source"
    build_hf_model(model, source)
    hf_config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**hf_config, "pyvision_note": "kept"}))
    for file in TINY_TOKENIZER_DIR.iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    (source / "generation_config.json").write_text(json.dumps({"temperature": 0.01, "top_k": 1}))
    _, start = load_hf(source, progress=False)
    rng = np.random.default_rng(3)
    trained = jax.tree.map(lambda a: np.asarray(a) + 0.02 * rng.standard_normal(a.shape).astype(a.dtype), start)
    config = get_config()
    config.model.hf_dir, config.model.tokenizer = str(source), ""
    workdir = write_training_workdir(root / "run", config, trained, STEP)
    return {"source": source, "workdir": workdir, "model": model, "trained": trained, "start": start}


@pytest.fixture(scope="module")
def export(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "hf"
    assert convert_main(["flax2hf", "--src", str(run["workdir"]), "--dst", str(out), "--max-shard-size", "600KB"]) == 0
    return out


def image_inputs(config):
    ids, mask = right_padded(text(5, 1) + image_tokens(GRID) + text(6, 2))
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": patches(config, [GRID], 3),
        "image_grid_thw": np.array([GRID]),
    }


def test_transformers_loads_the_export_to_the_flax_logits(run, export):
    config = run["model"]
    inputs = image_inputs(config)
    expected = np.asarray(logits(config, run["trained"], inputs))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        export, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    got = hf_logits(model, inputs, config)
    mask = inputs["attention_mask"].astype(bool)
    scale = np.abs(expected[mask]).max()
    assert scale > 1.0
    assert np.abs(got[mask] - expected[mask]).max() <= 1e-4 * scale
    # the trained weights, not the source's: those give other logits
    assert np.abs(np.asarray(logits(config, run["start"], inputs))[mask] - expected[mask]).max() > 1e-2 * scale


def without_dtypes(config):
    if not isinstance(config, dict):
        return config
    return {k: without_dtypes(v) for k, v in config.items() if k not in ("dtype", "torch_dtype")}


def test_the_export_is_sharded_and_carries_the_source_models_files(run, export):
    index = json.loads((export / INDEX_FILE).read_text())
    shards = sorted(p.name for p in export.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert {str(t.dtype) for f in shards for t in load_file(export / f).values()} == {"float32"}
    source_config = json.loads((run["source"] / "config.json").read_text())
    exported = json.loads((export / "config.json").read_text())
    assert exported["pyvision_note"] == "kept"
    assert set(exported) >= set(source_config)
    assert without_dtypes(exported) == without_dtypes(source_config)
    assert exported["torch_dtype"] == exported["text_config"]["dtype"] == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (export / name).read_bytes() == (run["source"] / name).read_bytes(), name
    assert json.loads((export / "preprocessor_config.json").read_text())["merge_size"] == 2
    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "hi" in prompt


def test_one_step_exports_in_the_dtype_asked_for(run, tmp_path):
    step_dir = run["workdir"] / "checkpoints" / str(STEP)
    out = tmp_path / "bf16"
    assert convert_main(["flax2hf", "--src", str(step_dir), "--dst", str(out), "--dtype", "bfloat16", "--quiet"]) == 0
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    _, params = load_hf(out, progress=False)
    cast = jax.tree.map(lambda a: np.asarray(a).astype("bfloat16"), run["trained"])
    jax.tree.map(np.testing.assert_array_equal, params, cast)


def test_a_checkpoint_without_its_run_config_is_named(run, tmp_path, capsys):
    orphan = tmp_path / "checkpoints"
    orphan.symlink_to(run["workdir"] / "checkpoints")
    assert convert_main(["flax2hf", "--src", str(orphan), "--dst", str(tmp_path / "out"), "--quiet"]) == 2
    assert "no run config.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_evaluating_the_export_scores_what_the_workdir_scores(run, export, benchmark, tmp_path):
    data = tmp_path / "tasks.jsonl"
    write_tasks_jsonl(data, benchmark[:2])
    config = get_config()
    config.eval.k = 2
    config.eval.max_new_tokens_per_turn = 10
    config.eval.max_total_tokens = 512
    config.rollout.length_buckets = (512,)
    config.rollout.max_batch = 1
    results = {
        name: evaluate_checkpoint(config, path, data, tmp_path / name, progress=False, sandboxes=FakePool())
        for name, path in (("workdir", run["workdir"]), ("export", export))
    }
    assert results["workdir"]["policy_version"] == STEP and results["export"]["run"]["checkpoint_kind"] == "hf"
    for key in ("accuracy", "avg_at_k", "pass_at_k", "mean_response_tokens", "end_reasons", "num_rollouts"):
        assert results["export"][key] == results["workdir"][key], key

    def rollouts(name):
        records = [json.loads(line) for line in (tmp_path / name / TRAJECTORIES_FILE).read_text().splitlines()]
        return sorted((r["task_id"], r["rollout_index"], r["score"], r["response_tokens"]) for r in records)

    assert len(rollouts("export")) == 4
    assert rollouts("export") == rollouts("workdir")
