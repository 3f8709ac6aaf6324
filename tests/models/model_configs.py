"""The tiny model configurations the model tests compare against transformers."""

from pyvision_jax.models.config import ModelConfig

TINY = ModelConfig.preset("tiny")
# window of 3x3 merged units: a 5x7-unit image has windows of 3x3, 3x4.., cut at its borders
RAGGED = TINY.replace(vision={"window_size": 84})
TIED = TINY.replace(tie_word_embeddings=True)
