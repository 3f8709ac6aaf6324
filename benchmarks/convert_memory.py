"""Peak host memory of HF <-> Flax conversion relative to the checkpoint size.

Writes a random Hub-layout Qwen2.5-VL checkpoint (bf16, sharded, with index) of about
--size-gb directly with the safetensors library, then in fresh child processes measures the
peak RSS of:
  load_hf             (pyvision_jax.convert, streaming)
  load_hf + save_hf   (the export back to a Hub directory)
  load_hf + save_params (hf2flax: the orbax params checkpoint)
  reference           (safetensors.safe_open + get_tensor + transpose, the usual way)
Target: load_hf peak <= 1.3 x checkpoint size. The peak is the child's VmHWM (Linux), not
getrusage's ru_maxrss: Linux carries the parent's high-water mark across fork+exec into the
child's ru_maxrss, which would charge the checkpoint writer's memory to the child.
"baseline" is the child's RSS after importing jax and the converter, before loading.

  .venv/bin/python -m benchmarks.convert_memory [--size-gb 1.2] [--workdir /tmp/x] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[1]

_CHILD_PRELUDE = """
import json, sys, psutil, jax, numpy as np
from pyvision_jax.convert import load_hf, save_hf
jax.numpy.zeros(1).block_until_ready()
baseline = psutil.Process().memory_info().rss
"""
_CHILD_LOAD = """
config, params = load_hf(sys.argv[1], progress=False)
jax.block_until_ready(params)
"""
_CHILD_SAVE = (
    _CHILD_LOAD
    + """
save_hf(config, params, sys.argv[2], max_shard_bytes=400 * 2**20, progress=False)
"""
)
_CHILD_TO_ORBAX = (
    _CHILD_LOAD
    + """
from pyvision_jax.convert import save_params
save_params(config, params, sys.argv[2])
"""
)
_CHILD_REFERENCE = """
from safetensors import safe_open
from pathlib import Path
params = {}
for file in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(file, "np") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            params[name] = jax.device_put(np.ascontiguousarray(t.T) if t.ndim == 2 else t)
jax.block_until_ready(params)
"""
_CHILD_REPORT = """
hwm_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"baseline": baseline, "peak": hwm_kib * 1024}))
"""


def benchmark_config(size_bytes: float) -> dict:
    """A Hub-layout config whose bf16 checkpoint is about ``size_bytes`` (text layers scale)."""
    hidden, inter, vocab, kv_heads = 2048, 5504, 32000, 2
    layer_params = 2 * hidden * hidden + 2 * hidden * 256 + 3 * hidden * inter + 2 * hidden + 2 * 256 + 2 * hidden
    fixed_params = 2 * vocab * hidden + 40_000_000
    layers = max(1, math.ceil((size_bytes / 2 - fixed_params) / layer_params))
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vision_config": {
            "depth": 4,
            "hidden_size": 640,
            "intermediate_size": 1712,
            "num_heads": 10,
            "out_hidden_size": hidden,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [3],
        },
    }


def write_checkpoint(directory: Path, config: dict, shard_bytes: int = 400 * 2**20) -> int:
    """Random bf16 tensors in Hub-named shards plus index and config.json; returns total bytes."""
    from pyvision_jax.convert.names import checkpoint_shapes

    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, shape in checkpoint_shapes(config).items():
        nbytes = math.prod(shape) * 2
        if sizes[-1] and sizes[-1] + nbytes > shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        sizes[-1] += nbytes
        if sizes[-1] >= shard_bytes:
            shards.append({})
            sizes.append(0)
    shards = [s for s in shards if s]
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / file, metadata={"format": "pt"})
        weight_map |= {name: file for name in shard}
        shard.clear()
    total = sum(sizes)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (directory / "config.json").write_text(json.dumps(config))
    return total


def measure(body: str, *args: str) -> dict:
    script = _CHILD_PRELUDE.format(repo=str(REPO)) + body + _CHILD_REPORT
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.2, help="checkpoint size in GB (>= 1)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the written checkpoints")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convert_memory_"))
    try:
        src = workdir / "hf"
        size = write_checkpoint(src, benchmark_config(args.size_gb * 1e9))
        gib = 2**30
        print(f"checkpoint: {size / gib:.3f} GiB bf16, {len(list(src.glob('*.safetensors')))} shards at {src}")
        rows = [
            ("load_hf", measure(_CHILD_LOAD, str(src))),
            ("load_hf + save_hf", measure(_CHILD_SAVE, str(src), str(workdir / "export"))),
            ("load_hf + save_params", measure(_CHILD_TO_ORBAX, str(src), str(workdir / "orbax"))),
            ("reference safe_open", measure(_CHILD_REFERENCE, str(src))),
        ]
        print(f"{'phase':<24}{'baseline GiB':>14}{'peak GiB':>10}{'peak/size':>11}{'(peak-base)/size':>18}")
        for label, r in rows:
            print(
                f"{label:<24}{r['baseline'] / gib:>14.3f}{r['peak'] / gib:>10.3f}{r['peak'] / size:>11.3f}"
                f"{(r['peak'] - r['baseline']) / size:>18.3f}"
            )
        load_ratio = rows[0][1]["peak"] / size
        ref_ratio = rows[-1][1]["peak"] / size
        print(
            f"load_hf peak / checkpoint size = {load_ratio:.3f} "
            f"(target <= 1.3: {'met' if load_ratio <= 1.3 else 'NOT met'}); "
            f"reference / load_hf = {ref_ratio / load_ratio:.2f}x"
        )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
