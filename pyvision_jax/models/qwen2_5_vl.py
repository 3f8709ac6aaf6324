"""The whole Qwen2.5-VL model and its pure, jitted entry points.

The module tree mirrors the Hub checkpoint names (`visual.*`, `model.*`, `lm_head`), so the
pure params dict maps 1:1 to HF tensor names (see helper contracts). `logits`, `prefill` and
`decode_step` take such a params dict: host-side numpy prepares position ids and the vision
layout, then a jitted function merges the cached graphdef with the params and runs the model.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from pyvision_jax.models.config import ModelConfig
from pyvision_jax.models.kv_cache import KVCache
from pyvision_jax.models.rope_index import rope_index_for
from pyvision_jax.models.sharding import LOGICAL_AXIS_RULES, linear, logical_axes, param_shardings
from pyvision_jax.models.text import TextModel
from pyvision_jax.models.vision import VisionLayout, VisionTransformer, num_merged_tokens, vision_layout


class Qwen2_5_VL(nnx.Module):
    """Vision tower (`visual`), decoder (`model`) and, unless tied, `lm_head`."""

    def __init__(
        self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any = jnp.float32, dtype: Any = jnp.float32
    ):
        self.config = config
        self.dtype = dtype
        with nnx.use_eager_sharding(False):
            self.visual = VisionTransformer(
                config.vision, rngs=rngs, param_dtype=param_dtype, dtype=dtype, attention=config.attention
            )
            self.model = TextModel(config, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
            self.lm_head = (
                None
                if config.tie_word_embeddings
                else linear(
                    config.hidden_size,
                    config.vocab_size,
                    ("embed", "vocab"),
                    use_bias=False,
                    rngs=rngs,
                    param_dtype=param_dtype,
                    dtype=dtype,
                )
            )

    def embed(self, input_ids: jax.Array, vision_features: jax.Array | None = None) -> jax.Array:
        """Token embeddings with vision features placed at the image/video placeholder tokens.

        `vision_features` holds the merged tokens of all images (batch-major), then of all videos;
        placeholders are matched to them in the same order, with static shapes.
        """
        embeds = self.model.embed_tokens(input_ids).astype(self.dtype)
        if vision_features is None:
            return embeds
        flat = input_ids.reshape(-1)
        is_image = flat == self.config.image_token_id
        is_video = flat == self.config.video_token_id
        image_rank = jnp.cumsum(is_image) - 1
        video_rank = jnp.cumsum(is_video) - 1 + jnp.sum(is_image)
        rank = jnp.where(is_image, image_rank, jnp.where(is_video, video_rank, 0))
        gathered = jnp.take(vision_features.astype(self.dtype), rank, axis=0, mode="clip")
        merged = jnp.where((is_image | is_video)[:, None], gathered, embeds.reshape(flat.shape[0], -1))
        return merged.reshape(embeds.shape)

    def lm_logits(self, hidden: jax.Array) -> jax.Array:
        if self.lm_head is None:
            kernel = self.model.embed_tokens.embedding[...].T
        else:
            kernel = self.lm_head.kernel[...]
        return jnp.einsum("btd,dv->btv", hidden, kernel.astype(self.dtype), preferred_element_type=jnp.float32)

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        pixel_values: jax.Array | None = None,
        layout: VisionLayout | None = None,
        cache: KVCache | None = None,
        layer_weights: Sequence[Any] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """float32 logits [B, T, V] (and the updated cache when one is given)."""
        features = None if pixel_values is None else self.visual(pixel_values, layout)
        embeds = self.embed(input_ids, features)
        hidden, cache = self.model(embeds, positions, attention_mask, cache, layer_weights=layer_weights)
        return self.lm_logits(hidden), cache


# ---------------------------------------------------------------------- graphdef and params


@functools.lru_cache(maxsize=16)
def _abstract(config: ModelConfig, compute_dtype: str) -> tuple[nnx.GraphDef, nnx.State]:
    # Built outside any mesh (a first call may come from a step traced under one): the
    # logical axis names stay metadata instead of becoming shardings on that mesh.
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        model = nnx.eval_shape(lambda: Qwen2_5_VL(config, rngs=nnx.Rngs(0), dtype=jnp.dtype(compute_dtype)))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, state


def graphdef(config: ModelConfig, compute_dtype: Any = jnp.float32) -> nnx.GraphDef:
    """The static graph of the model for `config` (cached)."""
    return _abstract(config, jnp.dtype(compute_dtype).name)[0]


def param_logical_axes(config: ModelConfig) -> Any:
    """Logical axis names of every parameter, as a pure dict mirroring the params."""
    return logical_axes(_abstract(config, "float32")[1])


def param_shapes(config: ModelConfig) -> Any:
    """jax.ShapeDtypeStruct (float32) of every parameter, as a pure dict."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.to_pure_dict(_abstract(config, "float32")[1])
    )


def params_sharding(config: ModelConfig, mesh: jax.sharding.Mesh, rules: Any = LOGICAL_AXIS_RULES) -> Any:
    """NamedSharding of every parameter on `mesh` (for device_put, jit out_shardings, load_hf)."""
    return param_shardings(param_logical_axes(config), param_shapes(config), mesh, rules)


def init_params(config: ModelConfig, seed: int = 0, dtype: Any = jnp.float32) -> dict:
    """Randomly initialised parameters (pure nested dict, HF-mirroring names)."""
    model = Qwen2_5_VL(config, rngs=nnx.Rngs(seed), param_dtype=jnp.dtype(dtype))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _merge(config: ModelConfig, compute_dtype: str, params: Any) -> tuple[Qwen2_5_VL, tuple | None]:
    """The model holding `params`, and the decoder layers' own weights when `params` holds
    them per layer (`unstack_layers`; the stacked module then holds empty placeholders)."""
    gdef, abstract = _abstract(config, compute_dtype)
    layer_weights = params["model"]["layers"]
    if isinstance(layer_weights, tuple):
        placeholders = jax.tree.map(lambda x: jnp.zeros((0,), x.dtype), nnx.to_pure_dict(abstract["model"]["layers"]))
        params = {**params, "model": {**params["model"], "layers": placeholders}}
    else:
        layer_weights = None
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(gdef, state), layer_weights


def unstack_layers(params: dict) -> dict:
    """`params` with the decoder layers' stacked weights split into a tuple of per-layer
    weights (copies): the form the engine decodes with, since slicing a layer out of the stack
    inside a step copies its weights on every step. Accepted by `forward` with a cache."""
    layers = params["model"]["layers"]
    if isinstance(layers, tuple):
        return params
    count = jax.tree.leaves(layers)[0].shape[0]
    split = tuple(jax.tree.map(lambda x, i=i: x[i], layers) for i in range(count))
    return {**params, "model": {**params["model"], "layers": split}}


def stack_layers(params: dict) -> dict:
    """The inverse of `unstack_layers`: the model's usual params."""
    layers = params["model"]["layers"]
    if not isinstance(layers, tuple):
        return params
    return {**params, "model": {**params["model"], "layers": jax.tree.map(lambda *x: jnp.stack(x), *layers)}}


# ---------------------------------------------------------------------- inputs


@struct.dataclass
class ModelInputs:
    """Device-ready inputs: token ids, mask, 3-D positions and (optionally) the vision layout."""

    input_ids: jax.Array
    attention_mask: jax.Array
    positions: jax.Array
    pixel_values: jax.Array | None = None
    layout: VisionLayout | None = None


def _array(inputs: Mapping[str, Any], key: str) -> np.ndarray | None:
    value = inputs.get(key)
    if value is None:
        return None
    if hasattr(value, "detach"):  # torch tensors from a transformers processor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def prepare_inputs(
    config: ModelConfig, inputs: Mapping[str, Any], min_windows: int = 1, min_merged: int = 1
) -> tuple[ModelInputs, np.ndarray]:
    """Host-side: processor outputs -> (ModelInputs, rope deltas [B]).

    Keys: input_ids [B, T], attention_mask [B, T] (optional), pixel_values [N, C*T*P*P],
    image_grid_thw [n, 3], pixel_values_videos, video_grid_thw, second_per_grid_ts (optional),
    and position_ids [3, B, T] to override the computed positions. `min_windows` and
    `min_merged` raise the smallest vision buckets, so that batches share one compiled shape.
    """
    ids = _array(inputs, "input_ids")
    if ids is None or ids.ndim != 2:
        raise ValueError(f"inputs['input_ids'] must be [batch, length], got {None if ids is None else ids.shape}")
    mask = _array(inputs, "attention_mask")
    mask = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)
    if mask.shape != ids.shape:
        raise ValueError(f"inputs['attention_mask'] has shape {mask.shape}, input_ids {ids.shape}")
    grids, pixels = [], []
    for kind, pixel_key, grid_key, token in (
        ("image", "pixel_values", "image_grid_thw", config.image_token_id),
        ("video", "pixel_values_videos", "video_grid_thw", config.video_token_id),
    ):
        pix, grid = _array(inputs, pixel_key), _array(inputs, grid_key)
        n_tokens = int(np.sum((ids == token) & mask))
        if pix is None and grid is None:
            if n_tokens:
                raise ValueError(f"input_ids has {n_tokens} <|{kind}_pad|> tokens but no {pixel_key}")
            continue
        if pix is None or grid is None:
            raise ValueError(f"inputs: {pixel_key} and {grid_key} must be given together")
        grid = grid.reshape(-1, 3).astype(np.int64)
        n_patches = int(np.sum(np.prod(grid, axis=-1)))
        if pix.ndim != 2 or pix.shape != (n_patches, config.vision.patch_dim):
            raise ValueError(
                f"inputs['{pixel_key}'] has shape {pix.shape}; {grid_key} needs "
                f"({n_patches}, {config.vision.patch_dim})"
            )
        expected = num_merged_tokens(grid, config.vision.spatial_merge_size)
        if n_tokens != expected:
            raise ValueError(
                f"input_ids has {n_tokens} <|{kind}_pad|> tokens but {grid_key} gives {expected} merged {kind} tokens"
            )
        grids.append(grid)
        pixels.append(pix.astype(np.float32))
    positions = _array(inputs, "position_ids")
    if positions is None:
        positions, deltas = rope_index_for(
            config,
            ids,
            mask,
            _array(inputs, "image_grid_thw"),
            _array(inputs, "video_grid_thw"),
            _array(inputs, "second_per_grid_ts"),
        )
    else:
        if positions.shape != (3,) + ids.shape:
            raise ValueError(f"inputs['position_ids'] must be [3, B, T] = {(3,) + ids.shape}, got {positions.shape}")
        deltas = (np.max(np.where(mask[None], positions, 0), axis=(0, 2)) + 1 - mask.sum(-1)).astype(np.int32)
    pixel_values = layout = None
    if grids:
        layout = vision_layout(np.concatenate(grids), config.vision, min_windows, min_merged)
        flat = np.concatenate(pixels)
        pixel_values = np.zeros((layout.num_slots, flat.shape[1]), np.float32)
        pixel_values[: flat.shape[0]] = flat
    model_inputs = ModelInputs(
        input_ids=ids.astype(np.int32),
        attention_mask=mask,
        positions=positions.astype(np.int32),
        pixel_values=pixel_values,
        layout=layout,
    )
    return jax.tree.map(jnp.asarray, model_inputs), deltas


# ---------------------------------------------------------------------- jitted entry points


@functools.partial(jax.jit, static_argnames=("config", "compute_dtype"))
def forward(
    config: ModelConfig, compute_dtype: str, params: Any, inputs: ModelInputs, cache: KVCache | None = None
) -> tuple[jax.Array, KVCache | None]:
    """Pure jitted forward: (params, inputs[, cache]) -> (float32 logits [B, T, V], cache).

    With a cache, `params` may hold the decoder layers apart (`unstack_layers`)."""
    model, layer_weights = _merge(config, compute_dtype, params)
    return model(
        inputs.input_ids,
        inputs.positions,
        inputs.attention_mask,
        inputs.pixel_values,
        inputs.layout,
        cache,
        layer_weights,
    )


def logits(config: ModelConfig, params: Any, inputs: Mapping[str, Any], compute_dtype: Any = jnp.float32) -> jax.Array:
    """float32 logits [B, T, V] for processor-style `inputs` (visual keys optional)."""
    model_inputs, _ = prepare_inputs(config, inputs)
    return forward(config, jnp.dtype(compute_dtype).name, params, model_inputs)[0]


def prefill(
    config: ModelConfig,
    params: Any,
    inputs: Mapping[str, Any],
    max_length: int,
    compute_dtype: Any = jnp.float32,
    cache_dtype: Any = None,
) -> tuple[jax.Array, KVCache, np.ndarray]:
    """Run the prompt into a fresh KV cache of `max_length` slots: (logits, cache, rope deltas)."""
    model_inputs, deltas = prepare_inputs(config, inputs)
    batch, length = model_inputs.input_ids.shape
    if length > max_length:
        raise ValueError(f"prompt length {length} exceeds the cache's max_length {max_length}")
    cache = KVCache.init(config, batch, max_length, cache_dtype or compute_dtype)
    out, cache = forward(config, jnp.dtype(compute_dtype).name, params, model_inputs, cache)
    return out, cache, deltas


@functools.partial(jax.jit, static_argnames=("config", "compute_dtype"))
def _decode(
    config: ModelConfig, compute_dtype: str, params: Any, input_ids: jax.Array, cache: KVCache, deltas: jax.Array
) -> tuple[jax.Array, KVCache]:
    model, layer_weights = _merge(config, compute_dtype, params)
    seen = jnp.sum(cache.valid, axis=-1).astype(jnp.int32)
    pos = seen[:, None] + deltas[:, None] + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
    positions = jnp.broadcast_to(pos[None], (3,) + pos.shape)
    mask = jnp.ones(input_ids.shape, bool)
    return model(input_ids, positions, mask, cache=cache, layer_weights=layer_weights)


def decode_step(
    config: ModelConfig, params: Any, input_ids: Any, cache: KVCache, deltas: Any, compute_dtype: Any = jnp.float32
) -> tuple[jax.Array, KVCache]:
    """Append text tokens [B, t] after the cached ones: (float32 logits [B, t, V], cache)."""
    return _decode(
        config,
        jnp.dtype(compute_dtype).name,
        params,
        jnp.asarray(input_ids, jnp.int32),
        cache,
        jnp.asarray(deltas, jnp.int32),
    )
