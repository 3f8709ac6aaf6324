"""Builds the tiny byte-level BPE tokenizer shipped in pyvision_jax/assets/tiny_tokenizer/.

The corpus is generated here from a fixed seed: the PyVision protocol (code blocks, answers,
interpreter observations, image labels), Python snippets over PIL/numpy/matplotlib/decord and
questions of the synthetic tasks. Training is deterministic, so rerunning

    python scripts/build_tiny_tokenizer.py [--out DIR]

reproduces the shipped files byte for byte.

Layout (fixed by the project's contracts): 2,000 regular tokens at ids 0..1999 (the 256 byte
symbols first, then BPE merges), then the 22 Qwen2.5-VL added tokens at 2000..2021 in Qwen's
order. The pre-tokenizer, decoder and chat template are Qwen2.5-VL's. Unlike Qwen there is
no NFC normalizer: every string, composed or not, survives encode/decode unchanged, which
keeps the token-in/token-out path exact.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR

NUM_REGULAR_TOKENS = 2000
CORPUS_SEED = 20261129
CORPUS_DOCUMENTS = 4000

# (content, special) in Qwen2.5-VL's id order; "special" as in Qwen's added_tokens_decoder.
QWEN2_5_VL_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

# Qwen2's pre-tokenization pattern (contractions, letters, single digits, punctuation runs,
# newlines, spaces).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The chat template of Qwen2.5-VL-*-Instruct (tokenizer_config.json / chat_template.json).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

COLOURS = (
    "red",
    "green",
    "blue",
    "yellow",
    "orange",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "gray",
    "grey",
    "cyan",
    "magenta",
    "teal",
    "navy",
    "olive",
    "maroon",
)
SHAPES = (
    "circle",
    "square",
    "triangle",
    "rectangle",
    "star",
    "diamond",
    "hexagon",
    "ellipse",
    "cross",
    "pentagon",
    "dot",
    "ball",
    "box",
    "arrow",
)
POSITIONS = (
    "top-left",
    "top-right",
    "bottom-left",
    "bottom-right",
    "center",
    "left",
    "right",
    "top",
    "bottom",
    "upper half",
    "lower half",
    "middle",
)
SIZES = ("small", "tiny", "large", "big", "medium-sized", "little")
OBJECTS = (
    "car",
    "person",
    "dog",
    "cat",
    "bird",
    "sign",
    "bottle",
    "cup",
    "chair",
    "table",
    "tree",
    "window",
    "door",
    "phone",
    "book",
    "clock",
    "bag",
    "umbrella",
    "bicycle",
    "flag",
    "lamp",
    "shoe",
    "hat",
    "boat",
    "truck",
    "bus",
    "light",
    "building",
)
WORDS = tuple(
    (
        "the image shows object objects region area crop zoom zoomed enlarge closer look detail "
        "details visible clearly first second third next then finally because therefore so "
        "answer question options option choose choice correct wrong likely maybe appears seems "
        "located location position coordinates pixel pixels width height size frame frames video "
        "videos second seconds time moment appear appears appeared moving moves motion across "
        "from into onto over under above below near far between inside outside around count "
        "counting number total many several each every all none some only also still again "
        "colour color colours colors shape shapes bright dark light background foreground edge "
        "edges corner corners left right upper lower middle half quarter image_clue video_clue "
        "let me check verify confirm inspect analyze analyse examine find locate detect identify "
        "display show plot draw highlight mark box boxes bounding target distractor distractors "
        "result results output print error errors traceback exception timeout failed success "
        "reasoning think thinking step steps carefully based observation observed see saw "
        "notice noticed found looks like similar different same larger smaller brighter darker "
        "is are was were be been being have has had do does did will would should could can "
        "a an and or not no yes with without for of on in at by to as it this that these those "
        "there here which what where when who how why whose whom than more most less least "
        "one two three four five six seven eight nine ten eleven twelve hundred thousand "
        "red green blue channel channels mask masked threshold mean average sum max min median "
        "array arrays shape dtype uint8 float32 int64 list tuple dict string integer value values "
        "index indices range length rows columns row column axis axes figure figsize subplot "
        "title label labels legend grid cell cells sample sampled sampling uniform uniformly "
        "fps rate duration start end begin beginning finish last final during while until "
        "user assistant system helpful you your my our we they he she it its their them us "
        "solve solving task tasks problem problems tool tools python code runtime interpreter "
        "environment variable variables loaded load loading preloaded available provided given"
    ).split()
)
PY_KEYWORDS = (
    "import",
    "from",
    "as",
    "def",
    "return",
    "for",
    "in",
    "if",
    "elif",
    "else",
    "while",
    "print",
    "len",
    "range",
    "enumerate",
    "zip",
    "sorted",
    "sum",
    "max",
    "min",
    "abs",
    "int",
    "float",
    "str",
    "round",
    "list",
    "dict",
    "set",
    "tuple",
    "True",
    "False",
    "None",
    "and",
    "or",
    "not",
    "lambda",
    "with",
    "try",
    "except",
    "break",
    "continue",
    "pass",
    "class",
    "self",
    "assert",
    "yield",
    "global",
)
IDENTIFIERS = (
    "img",
    "image",
    "arr",
    "array",
    "crop",
    "cropped",
    "patch",
    "region",
    "mask",
    "frame",
    "frames",
    "idx",
    "indices",
    "vr",
    "fps",
    "num_frames",
    "width",
    "height",
    "w",
    "h",
    "x",
    "y",
    "x0",
    "y0",
    "x1",
    "y1",
    "cx",
    "cy",
    "left",
    "top",
    "right",
    "bottom",
    "scale",
    "zoom",
    "result",
    "counts",
    "labels",
    "colors",
    "pixels",
    "red",
    "green",
    "blue",
    "hsv",
    "gray",
    "edges",
    "fig",
    "ax",
    "axes",
    "row",
    "col",
    "i",
    "j",
    "k",
    "n",
    "total",
    "count",
    "box",
    "boxes",
    "timestamps",
    "times",
    "step",
    "values",
    "mean_color",
    "objects",
)


def _number(rng: random.Random, low: int = 0, high: int = 2000) -> str:
    return str(rng.randint(low, high))


def _question(rng: random.Random) -> str:
    colour, shape, position = rng.choice(COLOURS), rng.choice(SHAPES), rng.choice(POSITIONS)
    size, obj = rng.choice(SIZES), rng.choice(OBJECTS)
    templates = (
        f"What is the colour of the {size} {shape} in the image?",
        f"What is the color of the {obj}?",
        f"What shape is the {size} {colour} object?",
        f"Where is the {size} {colour} {shape} located in the image?",
        f"How many {colour} {shape}s are there in the image?",
        f"How many {shape}s can you count?",
        f"Is the {obj} on the left or the right side of the {rng.choice(OBJECTS)}?",
        f"Which object is in the {position} corner?",
        f"How many {colour} objects appear in the video?",
        "Which colour appears first in the video?",
        f"How many times does the {colour} {shape} cross the frame?",
        f"In which second does the {colour} {shape} first appear?",
        f"What is written on the {obj}?",
        f"Is there a {colour} {obj} in the image?",
    )
    question = rng.choice(templates)
    if rng.random() < 0.5:
        letters = "ABCD"
        choices = rng.sample(COLOURS + SHAPES + POSITIONS, 4)
        question += "\nOptions:\n" + "\n".join(f"({letters[i]}) {choice}" for i, choice in enumerate(choices))
        question += "\nAnswer with the option's letter from the given choices directly."
    return question


def _image_prompt(rng: random.Random) -> str:
    width, height = _number(rng, 64, 4000), _number(rng, 64, 4000)
    return (
        "You are an agent that solves visual questions by writing Python code. The image is "
        "given as <image_clue_0><|vision_start|><|image_pad|><|vision_end|></image_clue_0> and "
        f"is loaded in the runtime as `image_clue_0` (a PIL image of width {width} and height "
        f"{height}). Write code inside <code>\n```python\n...\n```\n</code> and give the final "
        "answer as <answer>\n\\boxed{...}\n</answer>.\n"
        f"Question: {_question(rng)}"
    )


def _video_prompt(rng: random.Random) -> str:
    width, height = _number(rng, 64, 1920), _number(rng, 64, 1080)
    fps, frames = rng.choice(("24", "25", "30", "29.97", "60", "10", "2", "1")), _number(rng, 2, 900)
    return (
        "The video is loaded in the runtime as `video_clue_0`, a decord.VideoReader. "
        f"It has {frames} frames at {fps} fps, frame width {width} and frame height {height}. "
        "Fetch the frames you need and show them with plt.show(); the images you show come back "
        "as <image_clue_1>...</image_clue_1>.\n"
        f"Question: {_question(rng)}"
    )


def _code(rng: random.Random) -> str:
    x0, y0 = rng.randint(0, 900), rng.randint(0, 900)
    x1, y1 = x0 + rng.randint(16, 900), y0 + rng.randint(16, 900)
    i, j, k = sorted(rng.sample(range(0, 600), 3))
    threshold, factor = rng.randint(20, 250), rng.choice((2, 3, 4, 8))
    channel = rng.choice((0, 1, 2))
    snippets = (
        "from PIL import Image\nimport matplotlib.pyplot as plt\n\n"
        f"crop = image_clue_0.crop(({x0}, {y0}, {x1}, {y1}))\n"
        f"crop = crop.resize((crop.width * {factor}, crop.height * {factor}), Image.BICUBIC)\n"
        "plt.imshow(crop)\nplt.axis('off')\nplt.show()",
        "import numpy as np\n\narr = np.array(image_clue_0)\n"
        f"mask = (arr[:, :, {channel}] > {threshold}) & (arr[:, :, {(channel + 1) % 3}] < {threshold // 2})\n"
        "ys, xs = np.nonzero(mask)\nprint(len(xs), xs.mean(), ys.mean())",
        "import numpy as np\nfrom scipy import ndimage\n\narr = np.asarray(image_clue_0.convert('RGB'))\n"
        f"labels, count = ndimage.label(arr[..., {channel}] > {threshold})\n"
        "print('objects:', count)",
        "import matplotlib.pyplot as plt\n\n"
        f"frames = video_clue_0.get_batch([{i}, {j}, {k}]).asnumpy()\n"
        "for idx, frame in enumerate(frames):\n    plt.figure(figsize=(6, 4))\n"
        "    plt.imshow(frame)\n    plt.title(f\"frame {idx}\")\n    plt.axis('off')\n    plt.show()",
        "print(len(video_clue_0), video_clue_0.get_avg_fps())\n"
        "frame = video_clue_0[0].asnumpy()\nprint(frame.shape, frame.dtype)",
        "import numpy as np\n\nfps = video_clue_0.get_avg_fps()\n"
        "indices = np.arange(0, len(video_clue_0), int(round(fps)))\n"
        "for t in indices:\n    frame = video_clue_0[int(t)].asnumpy()\n"
        f"    print(t / fps, frame[..., {channel}].mean())",
        "fig, axes = plt.subplots(1, 2, figsize=(10, 5))\n"
        f"axes[0].imshow(image_clue_0.crop((0, 0, {x1}, {y1})))\naxes[1].imshow(image_clue_1)\n"
        "for ax in axes:\n    ax.axis('off')\nplt.tight_layout()\nplt.show()",
        "width, height = image_clue_0.size\nprint(width, height)\n"
        "for row in range(2):\n    for col in range(2):\n"
        "        box = (col * width // 2, row * height // 2, (col + 1) * width // 2, (row + 1) * height // 2)\n"
        "        plt.imshow(image_clue_0.crop(box))\n        plt.show()",
        "import cv2\nimport numpy as np\n\n"
        "gray = cv2.cvtColor(np.array(image_clue_0), cv2.COLOR_RGB2GRAY)\n"
        f"edges = cv2.Canny(gray, {threshold // 2}, {threshold})\n"
        "contours, _ = cv2.findContours(edges, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)\n"
        "print(len(contours))",
    )
    return "<code>\n```python\n" + rng.choice(snippets) + "\n```\n</code>"


def _reasoning(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
    sentence = " ".join(words)
    sentence = sentence[0].upper() + sentence[1:] + rng.choice((".", "!", "?", ":", ","))
    lead = rng.choice(
        (
            "I need to zoom into the {p} region to see the {s} {c} {o} more clearly.",
            "The {s} {o} is near the {p} of the image, so I will crop that area.",
            "Let me sample frames uniformly and look at where the {c} {o} appears.",
            "The {c} {o} appears at about {n} seconds.",
            "From the crop, the object is a {c} {o}.",
        )
    ).format(
        p=rng.choice(POSITIONS),
        s=rng.choice(SIZES),
        c=rng.choice(COLOURS),
        o=rng.choice(SHAPES + OBJECTS),
        n=_number(rng, 0, 120),
    )
    return lead + " " + sentence


def _observation(rng: random.Random, label: int) -> str:
    stdout = rng.choice(
        (
            f"{_number(rng)} {_number(rng)}.{_number(rng, 0, 99)} {_number(rng)}.{_number(rng, 0, 99)}",
            f"objects: {_number(rng, 0, 40)}",
            f"({_number(rng, 1, 1080)}, {_number(rng, 1, 1920)}, 3) uint8",
            f"{_number(rng, 1, 900)} {rng.choice(('30.0', '25.0', '29.97002997002997', '24.0'))}",
            'Traceback (most recent call last):\n  File "<string>", line '
            f"{_number(rng, 1, 30)}, in <module>\nNameError: name '{rng.choice(IDENTIFIERS)}' is not defined",
            'Traceback (most recent call last):\n  File "<string>", line 3, in <module>\n'
            "IndexError: index out of range",
            "Error: execution timed out",
            "",
        )
    )
    text = f"<tool_response>\n<interpreter>\nText Result:\n{stdout}\nImage Result:\n"
    for offset in range(rng.choice((0, 1, 1, 2, 3))):
        text += (
            f"<image_clue_{label + offset}><|vision_start|><|image_pad|><|vision_end|></image_clue_{label + offset}>"
        )
    return text + "</interpreter>\n\n</tool_response>"


def _answer(rng: random.Random) -> str:
    value = rng.choice(
        (
            rng.choice("ABCD"),
            _number(rng, 0, 100),
            rng.choice(COLOURS),
            rng.choice(SHAPES),
            rng.choice(POSITIONS),
            f"{_number(rng, 0, 99)}.{_number(rng, 0, 9)}",
        )
    )
    return "<answer>\n\\boxed{" + value + "}\n</answer>"


def _word_list(rng: random.Random) -> str:
    vocabulary = WORDS + PY_KEYWORDS + IDENTIFIERS + COLOURS + SHAPES + OBJECTS
    words = [rng.choice(vocabulary) for _ in range(60)]
    return " ".join(word.capitalize() if rng.random() < 0.2 else word for word in words)


def corpus_documents(seed: int = CORPUS_SEED, count: int = CORPUS_DOCUMENTS) -> Iterator[str]:
    """Yields the training documents: rendered multi-turn episodes and word lists."""
    rng = random.Random(seed)
    for _ in range(count):
        video = rng.random() < 0.4
        parts = [_video_prompt(rng) if video else _image_prompt(rng)]
        label = 1 if not video else 0
        for _turn in range(rng.randint(0, 3)):
            parts.append(_reasoning(rng) + "\n" + _code(rng))
            parts.append(_observation(rng, label))
            label += 1
        parts.append(_reasoning(rng) + "\n" + _answer(rng))
        parts.append(_word_list(rng))
        yield "\n".join(parts)


def build_tokenizer() -> Tokenizer:
    """Trains the BPE model and appends the Qwen2.5-VL added tokens at ids 2000..2021."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=NUM_REGULAR_TOKENS,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(corpus_documents(), trainer=trainer)
    if tokenizer.get_vocab_size() != NUM_REGULAR_TOKENS:
        raise RuntimeError(
            f"BPE training produced {tokenizer.get_vocab_size()} regular tokens, expected "
            f"{NUM_REGULAR_TOKENS}: the generated corpus is too small"
        )
    tokenizer.add_tokens(
        [
            AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
            for content, special in QWEN2_5_VL_ADDED_TOKENS
        ]
    )
    return tokenizer


def tokenizer_config() -> dict:
    """The tokenizer_config.json of the tiny tokenizer (Qwen2.5-VL's settings)."""
    added = {
        str(NUM_REGULAR_TOKENS + index): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for index, (content, special) in enumerate(QWEN2_5_VL_ADDED_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [content for content, special in QWEN2_5_VL_ADDED_TOKENS[1:14] if special],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write_tokenizer_files(out_dir: Path) -> list[Path]:
    """Writes tokenizer.json, tokenizer_config.json and chat_template.jinja into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": build_tokenizer().to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n",
        "chat_template.jinja": QWEN2_5_VL_CHAT_TEMPLATE,
    }
    paths = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=TINY_TOKENIZER_DIR, help="output directory (default: the package's asset directory)"
    )
    args = parser.parse_args(argv)
    for path in write_tokenizer_files(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
