"""Prompt templates: text files with named placeholders (`{question}`, `{width}`, ...).

Only the names a template kind declares are placeholders; every other brace is literal, so
a template may hold `\\boxed{...}`, Python dict literals or a released prompt pasted as is.
A template must use its kind's required names (the question, the image slot); a missing
one is an error naming the file. The project's own templates live in `configs/prompts/`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from pyvision_jax.data.config_files import CONFIGS_DIR

PROMPTS_DIR = CONFIGS_DIR / "prompts"
"""The project's templates (`image.txt`, `video.txt`, `judge.txt`)."""


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A template's text, the names it may use, those it must use, and where it came from."""

    text: str
    names: tuple[str, ...]
    required: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        missing = [name for name in self.required if "{" + name + "}" not in self.text]
        if missing:
            raise ValueError(
                f"prompt template {self.source}: placeholders "
                f"{['{' + n + '}' for n in missing]} are missing (it may use "
                f"{['{' + n + '}' for n in self.names]})"
            )

    def render(self, values: Mapping[str, str]) -> str:
        """The text with each `{name}` of `names` replaced by `values[name]`."""
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            raise ValueError(f"prompt template {self.source}: no placeholders {unknown}")
        pattern = re.compile(r"\{(" + "|".join(map(re.escape, self.names)) + r")\}")
        return pattern.sub(lambda match: str(values[match.group(1)]), self.text)


def load_template(path: str | Path, names: tuple[str, ...], required: tuple[str, ...]) -> PromptTemplate:
    """The template in `path` over `names`, using `required`: the file's UTF-8 text byte for
    byte, except the one newline that ends a text file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt template file not found: {path}")
    text = path.read_text(encoding="utf-8")
    return PromptTemplate(text[:-1] if text.endswith("\n") else text, names, required, str(path))
