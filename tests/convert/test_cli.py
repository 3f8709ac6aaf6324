import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.convert import load_hf, load_params, save_params
from pyvision_jax.convert.tree import flatten_params
from tests.convert.hf_models import assert_same_tensors, read_tensors

REPO = Path(__file__).resolve().parents[2]


def _convert(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, str(REPO / "launch" / "convert.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_hf2flax_then_flax2hf_is_bit_exact(hf_dir, tmp_path):
    flax_dir, hf_out = tmp_path / "flax", tmp_path / "hf"
    done = _convert("hf2flax", "--src", str(hf_dir), "--dst", str(flax_dir))
    assert done.returncode == 0, done.stderr
    assert (flax_dir / "params").is_dir() and (flax_dir / "config.json").is_file()
    assert (flax_dir / "hf_files" / "tokenizer_config.json").is_file()

    done = _convert("flax2hf", "--src", str(flax_dir), "--dst", str(hf_out), "--max-shard-size", "300KB")
    assert done.returncode == 0, done.stderr
    assert len(list(hf_out.glob("model-*.safetensors"))) > 1
    assert (hf_out / "tokenizer_config.json").read_text() == (hf_dir / "tokenizer_config.json").read_text()
    assert_same_tensors(read_tensors(hf_dir), read_tensors(hf_out))

    done = _convert("flax2hf", "--src", str(flax_dir), "--dst", str(hf_out))
    assert done.returncode == 2 and str(hf_out) in done.stderr and "exists" in done.stderr


def test_cli_names_missing_inputs(tmp_path):
    done = _convert("hf2flax", "--src", str(tmp_path / "nowhere"), "--dst", str(tmp_path / "out"))
    assert done.returncode == 2
    assert f"{tmp_path / 'nowhere'}: no such directory" in done.stderr
    assert not (tmp_path / "out").exists()
    usage = _convert("flax2hf", "--src", "x")
    assert usage.returncode == 2 and "--dst" in usage.stderr


def test_params_checkpoint_round_trip_with_dtype(hf_dir, tmp_path):
    config, params = load_hf(hf_dir, progress=False)
    save_params(config, params, tmp_path / "ckpt")
    loaded_config, loaded = load_params(tmp_path / "ckpt")
    assert loaded_config == config
    flat, flat_loaded = flatten_params(params), flatten_params(loaded)
    assert flat.keys() == flat_loaded.keys()
    for path, leaf in flat.items():
        assert np.asarray(leaf).tobytes() == np.asarray(flat_loaded[path]).tobytes(), path
    _, bf16 = load_params(tmp_path / "ckpt", dtype="bfloat16")
    assert {leaf.dtype for leaf in flatten_params(bf16).values()} == {jnp.dtype(jnp.bfloat16)}


def test_params_checkpoint_of_another_config_is_rejected(hf_dir, tmp_path):
    config, params = load_hf(hf_dir, progress=False)
    save_params(config, params, tmp_path / "ckpt")
    hf_config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    hf_config["num_hidden_layers"] = 3
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(hf_config))
    with pytest.raises(
        ValueError,
        match=r"model/layers/self_attn/q_proj/kernel \(stored shape \[2, 64, 64\], config needs \[3, 64, 64\]\)",
    ):
        load_params(tmp_path / "ckpt")
