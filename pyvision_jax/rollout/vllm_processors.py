"""vLLM's Qwen2.5-VL path without torchvision.

PyPI torchvision cannot load beside the CPU torch build, and
transformers' default Qwen2-VL image and video processors import it. ``use_torchvision_free_processors``
(run before vLLM loads its model, only when torchvision is not installed) maps transformers'
Qwen2-VL image processor module to its PIL backend (``Qwen2VLImageProcessorPil``, the same
smart_resize/normalise/patchify), registers a video processor that refuses videos (this engine
takes images only; ``limit_mm_per_prompt`` has no videos), and registers vLLM's Qwen2.5-VL
model class in process, since vLLM would otherwise inspect it in a subprocess that lacks these
registrations. An installed but broken torchvision cannot be worked around: uninstall it.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

_QWEN_ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
_torchvision_free_lock = threading.Lock()
_torchvision_free_done = False


def _torchvision_installed() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def use_torchvision_free_processors() -> bool:
    """Lets vLLM's Qwen2.5-VL path run without torchvision (see the module docstring).

    Idempotent; returns whether the workaround is in effect (False when torchvision is
    installed, in which case nothing is changed). Must run before vLLM loads its Qwen2-VL
    model module (``import vllm`` alone is fine).
    """
    global _torchvision_free_done
    with _torchvision_free_lock:
        if _torchvision_free_done:
            return True
        if _torchvision_installed():
            return False
        if "vllm.model_executor.models.qwen2_vl" in sys.modules:
            raise RuntimeError("use_torchvision_free_processors must run before vLLM loads its Qwen2-VL model module")
        _image_processor_on_pil()
        _refuse_videos()
        _torchvision_free_done = True
        return True


def _image_processor_on_pil() -> None:
    """Serves ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` from the PIL backend."""
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    module = types.ModuleType(
        name, "Qwen2-VL image processing on the PIL backend (installed by pyvision_jax: torchvision is unavailable)"
    )
    module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    module.Qwen2VLImageProcessorPil = pil.Qwen2VLImageProcessorPil
    module.Qwen2VLImageProcessorKwargs = pil.Qwen2VLImageProcessorKwargs
    module.smart_resize = pil.smart_resize
    module.__all__ = ["Qwen2VLImageProcessor"]
    sys.modules[name] = module


def _refuse_videos() -> None:
    """Registers, for Qwen2.5-VL configs, a video processor that raises on any video.

    The Qwen2.5-VL processor needs a video processor object to exist; transformers' own one
    needs torchvision. The class is named like the one it replaces because transformers finds
    a processor's video processor class by the name inferred from the image processor's.
    """
    import transformers
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig
    from transformers.video_processing_utils import BaseVideoProcessor, VideoProcessorMixin

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "video inputs need transformers' torchvision video processor; torchvision is not "
            "installed (pyvision_jax's vLLM engine takes images only)"
        )

    video_class = type(
        "Qwen2VLVideoProcessor",
        (BaseVideoProcessor,),
        {
            "__module__": __name__,
            "merge_size": 2,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "_preprocess": refuse,
            "preprocess": refuse,
            "__call__": refuse,
        },
    )
    AutoVideoProcessor.register(
        Qwen2_5_VLConfig, video_processor_classes={"torchvision": video_class, "pil": video_class}, exist_ok=True
    )
    if not hasattr(transformers, "VideoProcessorMixin"):
        # ProcessorMixin type-checks sub-processors against transformers.VideoProcessorMixin,
        # which transformers only exports when torchvision is importable.
        transformers.VideoProcessorMixin = VideoProcessorMixin


def register_model_in_process() -> None:
    """Registers vLLM's Qwen2.5-VL class object so vLLM inspects it here, not in a subprocess."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    ModelRegistry.register_model(_QWEN_ARCHITECTURE, Qwen2_5_VLForConditionalGeneration)
