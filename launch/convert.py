"""Convert Qwen2.5-VL weights between Hugging Face directories and Flax params checkpoints.

  python launch/convert.py hf2flax --src HF_DIR --dst DIR   # orbax params + config.json
  python launch/convert.py flax2hf --src DIR --dst HF_DIR   # safetensors shards + index + config.json

Tokenizer and other side files of the HF directory travel along (DIR/hf_files/) so that the
exported directory is complete for transformers and vLLM.
"""

from pyvision_jax.cli.convert import run

if __name__ == "__main__":
    run()
