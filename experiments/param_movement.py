"""Which parameter groups an update moved, and by how much: two checkpoints compared.

    python -m experiments.param_movement --before packaged:small_sft --after /tmp/run [--out movement.json] \
        [--config configs/kinds_cpu.py]

Either side is anything `launch/eval.py` loads (an HF directory, "packaged:NAME", a training
workdir or checkpoint). Per group (embed, attention, mlp, norms, lm_head, visual, other): the
relative update norm |after - before| / |before|, the RMS and largest entry change, and the
share of entries that moved at all; per parameter the same in the JSON. For the LM head (or
the tied embedding) also the quantiles of each vocabulary entry's update norm: an optimizer
that moves every coordinate by about lr whatever its gradient moves the rows of tokens that
were never sampled as much as the sampled ones.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from pyvision_jax.cli.entry import run_command
from pyvision_jax.wiring.evaluation import load_policy
from pyvision_jax.wiring.model import hf_dir

ROOT = Path(__file__).resolve().parents[1]
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "kinds_cpu.py"), "Config (architecture).", lock_config=True
)
_BEFORE = flags.DEFINE_string("before", "packaged:small_sft", "The starting weights.")
_AFTER = flags.DEFINE_string("after", None, "The updated weights.")
_OUT = flags.DEFINE_string("out", "", "Write the figures to this JSON file.")

GROUPS = (
    ("visual", "visual/"),
    ("embed", "embed_tokens"),
    ("attention", "self_attn"),
    ("mlp", "mlp/"),
    ("norms", "norm"),
    ("lm_head", "lm_head"),
)

QUANTILES = (0.1, 0.5, 0.9, 1.0)


def flat_params(params: Any) -> dict[str, np.ndarray]:
    """{"model/layers/mlp/up_proj/kernel": array, ...} of a nested parameter tree."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): np.asarray(v, np.float64)
        for path, v in leaves
    }


def group_of(name: str) -> str:
    return next((group for group, marker in GROUPS if marker in name), "other")


def movement(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    delta = after - before
    return {
        "relative_update": float(np.linalg.norm(delta) / max(np.linalg.norm(before), 1e-30)),
        "rms_update": float(np.sqrt(np.mean(delta**2))),
        "max_update": float(np.max(np.abs(delta))),
        "moved_share": float(np.mean(delta != 0)),
        "entries": int(delta.size),
    }


def parameter_movement(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Per group and per parameter movement of two flat parameter dicts with the same names;
    the vocabulary entries' update norms of the output projection."""
    if set(before) != set(after):
        raise ValueError(f"the checkpoints hold different parameters: {sorted(set(before) ^ set(after))[:4]}")
    names = sorted(before)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(group_of(name), []).append(name)
    out: dict[str, Any] = {"groups": {}, "parameters": {n: movement(before[n], after[n]) for n in names}}
    for group, members in groups.items():
        out["groups"][group] = movement(
            np.concatenate([before[n].ravel() for n in members]), np.concatenate([after[n].ravel() for n in members])
        )
    head = "lm_head/kernel" if "lm_head/kernel" in before else "model/embed_tokens/embedding"
    if head in before:
        delta = after[head] - before[head]
        per_token = np.linalg.norm(delta, axis=0 if head.startswith("lm_head") else 1)
        out["vocabulary_update_norm_quantiles"] = {f"{q:g}": float(np.quantile(per_token, q)) for q in QUANTILES}
    return out


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _AFTER.value:
        raise app.UsageError("--after is required")
    config = _CONFIG.value

    def load(path: str) -> dict[str, np.ndarray]:
        if path.startswith("packaged:"):
            packaged = copy.deepcopy(config)
            packaged.model.hf_dir = path
            path = str(hf_dir(packaged))
        policy = load_policy(path, config, progress=False)
        print(f"{path}: {policy.kind}, step {policy.version}")
        return flat_params(policy.params)

    result = parameter_movement(load(_BEFORE.value), load(_AFTER.value))
    result.update(before=_BEFORE.value, after=_AFTER.value)
    for group, m in result["groups"].items():
        print(
            f"{group:10s} relative update {m['relative_update']:.2e}, rms {m['rms_update']:.2e}, "
            f"max {m['max_update']:.2e}, moved {m['moved_share']:.3f} of {m['entries']}"
        )
    if "vocabulary_update_norm_quantiles" in result:
        print(
            "per-token output-row update norm quantiles:",
            {q: f"{v:.2e}" for q, v in result["vocabulary_update_norm_quantiles"].items()},
        )
    if _OUT.value:
        Path(_OUT.value).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_command(__name__, main)
