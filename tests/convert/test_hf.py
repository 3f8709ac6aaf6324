import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from transformers import Qwen2_5_VLForConditionalGeneration

from pyvision_jax.convert import CheckpointMismatchError, load_hf, save_hf
from pyvision_jax.convert.hf_config import hf_config_dict, load_model_config
from pyvision_jax.convert.tree import flatten_params
from tests.convert.hf_models import assert_same_tensors, hf_logits, random_hf_model, read_tensors


def _load(path, **kwargs):
    return load_hf(path, progress=False, **kwargs)


def _assert_same_params(a, b):
    flat_a, flat_b = flatten_params(a), flatten_params(b)
    assert sorted(map(str, flat_a)) == sorted(map(str, flat_b))
    for path, leaf in flat_a.items():
        other = flat_b[path]
        assert leaf.dtype == other.dtype and leaf.shape == other.shape, path
        assert np.asarray(leaf).tobytes() == np.asarray(other).tobytes(), path


def test_load_gives_the_contract_tree(hf_dir, hf_model):
    config, params = _load(hf_dir)
    assert config == load_model_config(hf_dir)
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    flat = flatten_params(params)
    stacked = [path for path in flat if path[1] in ("layers", "blocks")]
    assert len(flat) - len(stacked) + sum(flat[path].shape[0] for path in stacked) == len(state)
    assert all(isinstance(leaf, jax.Array) for leaf in flat.values())
    kernel = flat[("model", "layers", "self_attn", "q_proj", "kernel")][1]
    assert np.array_equal(kernel, state["model.language_model.layers.1.self_attn.q_proj.weight"].T)
    patch = flat[("visual", "patch_embed", "proj", "kernel")]
    assert np.array_equal(patch, state["model.visual.patch_embed.proj.weight"].reshape(32, -1).T)
    assert np.array_equal(
        flat[("model", "embed_tokens", "embedding")], state["model.language_model.embed_tokens.weight"]
    )
    assert np.array_equal(flat[("visual", "merger", "ln_q", "scale")], state["model.visual.merger.ln_q.weight"])
    assert np.array_equal(flat[("lm_head", "kernel")], state["lm_head.weight"].T)


def test_round_trip_is_bit_exact_and_loads_in_transformers(hf_dir, hf_model, tmp_path):
    config, params = _load(hf_dir)
    out = save_hf(
        config,
        params,
        tmp_path / "export",
        max_shard_bytes=300_000,
        extra_files=[hf_dir / "tokenizer_config.json"],
        progress=False,
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert (out / "tokenizer_config.json").is_file()
    assert_same_tensors(read_tensors(hf_dir), read_tensors(out))
    assert [p.name for p in tmp_path.iterdir()] == ["export"]

    reloaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, attn_implementation="eager").eval()
    assert reloaded.dtype == torch.float32
    for with_image in (False, True):
        torch.testing.assert_close(hf_logits(reloaded, with_image), hf_logits(hf_model, with_image), rtol=0, atol=0)


def test_sharded_input_with_index_equals_single_file(hf_dir, hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    _assert_same_params(_load(hf_dir)[1], _load(tmp_path / "sharded")[1])


def test_transformers_v5_in_memory_names_load_the_same(hf_dir, hf_model, tmp_path):
    v5_dir = tmp_path / "v5"
    v5_dir.mkdir()
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    assert any(k.startswith("model.language_model.") for k in state)
    half = sorted(state)[: len(state) // 2]
    save_file({k: state[k] for k in half}, v5_dir / "part-1.safetensors")
    save_file({k: v for k, v in state.items() if k not in half}, v5_dir / "part-2.safetensors")
    json.dump(
        {"metadata": {}, "weight_map": {k: "part-1.safetensors" if k in half else "part-2.safetensors" for k in state}},
        open(v5_dir / "model.safetensors.index.json", "w"),
    )
    nested = json.loads((hf_dir / "config.json").read_text())
    assert "text_config" in nested
    (v5_dir / "config.json").write_text(json.dumps(nested))
    _assert_same_params(_load(hf_dir)[1], _load(v5_dir)[1])


def test_problems_are_listed_by_name(hf_dir, tmp_path):
    tensors = read_tensors(hf_dir)
    del tensors["model.layers.0.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(7, np.float32)
    tensors["visual.blocks.0.attn.rotary.inv_freq"] = np.zeros(4, np.float32)
    tensors["model.visual.blocks.1.norm1.weight"] = tensors["visual.blocks.1.norm1.weight"]
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(hf_dir / "config.json", bad)
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(CheckpointMismatchError) as info:
        _load(bad)
    err = info.value
    message = str(err)
    assert err.missing == ["model.layers.0.mlp.up_proj.weight"]
    assert err.unexpected == ["visual.blocks.0.attn.rotary.inv_freq (in model.safetensors)"]
    assert len(err.mis_shaped) == 1 and "model.layers.0.self_attn.q_proj.bias" in err.mis_shaped[0]
    assert "[7]" in message and "[64]" in message
    assert len(err.duplicated) == 1 and "visual.blocks.1.norm1.weight" in err.duplicated[0]
    for name in ("up_proj", "inv_freq", "q_proj.bias", "norm1"):
        assert name in message


def test_missing_config_is_named(hf_dir, tmp_path):
    (tmp_path / "no_config").mkdir()
    shutil.copy(hf_dir / "model.safetensors", tmp_path / "no_config")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "no_config" / "config.json")):
        _load(tmp_path / "no_config")


def test_index_naming_absent_shard_is_reported(hf_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    weight_map = {name: "model-00002-of-00002.safetensors" for name in read_tensors(hf_dir)}
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        _load(broken)


def test_tied_embeddings(tmp_path):
    model = random_hf_model(tie_word_embeddings=True, seed=3)
    model.save_pretrained(tmp_path / "tied")
    config, params = _load(tmp_path / "tied")
    assert config.tie_word_embeddings and "lm_head" not in params
    out = save_hf(config, params, tmp_path / "export", progress=False)
    assert "lm_head.weight" not in read_tensors(out)
    reloaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, attn_implementation="eager").eval()
    torch.testing.assert_close(hf_logits(reloaded, True), hf_logits(model, True), rtol=0, atol=0)

    # Tied checkpoints that still carry lm_head.weight load the same.
    with_head = tmp_path / "with_head"
    shutil.copytree(tmp_path / "tied", with_head)
    tensors = read_tensors(with_head)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    save_file(tensors, with_head / "model.safetensors")
    _assert_same_params(params, _load(with_head)[1])

    # A tied config given an lm_head in params is told so by name.
    params["lm_head"] = {"kernel": jnp.zeros((64, 2048))}
    with pytest.raises(CheckpointMismatchError, match="lm_head/kernel"):
        save_hf(config, params, tmp_path / "export2", progress=False)


def test_bf16_target_dtype_and_bf16_checkpoints(hf_dir, hf_model, tmp_path):
    _, params = _load(hf_dir, dtype="bfloat16")
    flat = flatten_params(params)
    assert {leaf.dtype for leaf in flat.values()} == {jnp.dtype(jnp.bfloat16)}
    want = hf_model.state_dict()["model.language_model.layers.0.mlp.down_proj.weight"].to(torch.bfloat16)
    got = np.asarray(flat[("model", "layers", "mlp", "down_proj", "kernel")][0]).T
    assert np.ascontiguousarray(got).tobytes() == want.view(torch.int16).numpy().tobytes()

    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    config, bf16_params = _load(tmp_path / "bf16")
    assert {leaf.dtype for leaf in flatten_params(bf16_params).values()} == {jnp.dtype(jnp.bfloat16)}
    out = save_hf(config, bf16_params, tmp_path / "bf16_export", progress=False)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert_same_tensors(read_tensors(tmp_path / "bf16"), read_tensors(out))

    _, up = _load(tmp_path / "bf16", dtype=jnp.float32)
    assert np.array_equal(
        np.asarray(flatten_params(up)[("model", "norm", "scale")]),
        np.asarray(flatten_params(bf16_params)[("model", "norm", "scale")]).astype(np.float32),
    )
    assert read_tensors(tmp_path / "bf16")["model.norm.weight"].dtype == ml_dtypes.bfloat16


def test_save_refuses_to_overwrite_and_leaves_nothing_on_failure(hf_dir, tmp_path):
    config, params = _load(hf_dir)
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="exists"):
        save_hf(config, params, tmp_path / "exists", progress=False)

    class Exploding:
        shape, dtype = (64,), np.dtype(np.float32)

        def __array__(self, *args, **kwargs):
            raise RuntimeError("device lost")

    params["model"]["norm"]["scale"] = Exploding()
    with pytest.raises(RuntimeError, match="device lost"):
        save_hf(config, params, tmp_path / "crashed", max_shard_bytes=100_000, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["exists"]


_MESH_SCRIPT = """
import sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pyvision_jax.convert import load_hf, save_hf
from pyvision_jax.convert.tree import flatten_params
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tensor"))
def placement(path, shape):
    if len(shape) == 3 and shape[1] % 4 == 0 and shape[2] % 2 == 0:
        return NamedSharding(mesh, P(None, "fsdp", "tensor"))
    return NamedSharding(mesh, P())
config, sharded = load_hf(sys.argv[1], sharding=placement, progress=False)
_, plain = load_hf(sys.argv[1], progress=False)
kernel = flatten_params(sharded)[("model", "layers", "mlp", "down_proj", "kernel")]
assert len(kernel.sharding.device_set) == 8 and kernel.addressable_shards[0].data.shape == (2, 24, 32)
for path, leaf in flatten_params(plain).items():
    assert np.array_equal(np.asarray(flatten_params(sharded)[path]), np.asarray(leaf)), path
save_hf(config, sharded, sys.argv[2], progress=False)
print("ok")
"""


def test_sharded_load_and_export_on_an_8_device_mesh(hf_dir, tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT, str(hf_dir), str(tmp_path / "export")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert_same_tensors(read_tensors(hf_dir), read_tensors(tmp_path / "export"))


def test_tensor_the_index_promises_but_the_shard_lacks_is_named(hf_dir, tmp_path):
    tensors = read_tensors(hf_dir)
    lost = "visual.blocks.1.mlp.down_proj.bias"
    shard = tmp_path / "lossy"
    shard.mkdir()
    shutil.copy(hf_dir / "config.json", shard)
    save_file({k: v for k, v in tensors.items() if k != lost}, shard / "model-00001-of-00001.safetensors")
    index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}
    (shard / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointMismatchError) as info:
        _load(shard)
    assert info.value.missing == [
        f"{lost} (model.safetensors.index.json places it in model-00001-of-00001.safetensors)"
    ]
    assert not info.value.unexpected and not info.value.mis_shaped


def test_config_from_keeps_the_source_keys_and_refuses_another_architecture(hf_dir, tmp_path):
    config, params = _load(hf_dir)
    out = save_hf(config, params, tmp_path / "export", dtype="bfloat16", config_from=hf_dir, progress=False)
    source = json.loads((hf_dir / "config.json").read_text())
    written = json.loads((out / "config.json").read_text())
    assert written["transformers_version"] == source["transformers_version"]
    assert written["torch_dtype"] == "bfloat16" and written["text_config"] == source["text_config"] | {
        k: "bfloat16" for k in ("dtype", "torch_dtype") if k in source["text_config"]
    }
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(hf_config_dict(config.replace(vocab_size=4096))))
    with pytest.raises(ValueError, match=r"other/config.json describes another architecture .*vocab_size"):
        save_hf(config, params, tmp_path / "refused", config_from=other, progress=False)
    assert not (tmp_path / "refused").exists()
