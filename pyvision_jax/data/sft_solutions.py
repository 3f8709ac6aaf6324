"""Scripted solutions of the synthetic tasks: the assistant turns of SFT trajectories.

A `SolutionPlan` is the text of each assistant turn for one task. Code turns hold a block
the sandbox runs; the last turn is the answer, with `{result}` where the text the last code
printed goes (the episode driver fills it in from the real observation, so a plan never
knows the answer in advance unless it guesses).

Plans vary, drawn from a seeded rng per (task, draw): several code strategies per kind,
paraphrased thoughts, multi-turn refinements (look at the image or a frame first, then
measure) and two shares of imperfect plans (no tool call and a guess; a wrong threshold), so
a model fine-tuned on them is decent, not perfect, and its guesses are a habit RL can remove on
every task at once (tool use is what makes it accurate). The code only uses what the sandbox
provides (numpy as np, PIL, matplotlib as plt, scipy, decord's `video_clue_0`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyvision_jax.data.synthetic import COLOURS, SHAPES
from pyvision_jax.data.tasks import Task

RESULT_SLOT = "{result}"
KINDS = ("counting", "visual_search", "video_count", "video_order")

# Upper bounds of the top-half fill of a shape's bounding box: a triangle fills 1/4 of its
# top half, a diamond 1/2, a circle ~0.79, a square all of it.
_FILL_BOUNDS = {"triangle": (0.0, 0.37), "diamond": (0.37, 0.65), "circle": (0.65, 0.9), "square": (0.9, 2.0)}
_WRONG_FILL_BOUNDS = {"triangle": (0.0, 0.6), "diamond": (0.2, 0.8), "circle": (0.5, 0.95), "square": (0.8, 2.0)}
_COLOUR_TABLE = "{" + ",".join(f"{rgb}:'{name}'" for name, rgb in COLOURS.items()) + "}"
_NAME_TABLE = "{" + ",".join(f"'{name}':{rgb}" for name, rgb in COLOURS.items()) + "}"

_THOUGHTS = {
    "counting": (
        "I will count the {colour} {shape}s with code.",
        "Let me find the {colour} {shape}s by their pixels and count them.",
        "Counting by eye is error-prone; I will measure the {colour} {shape}s.",
    ),
    "visual_search": (
        "The target is the smallest object; I will locate it with code.",
        "Let me find the small object among the large ones.",
        "I will search the image for its smallest shape.",
    ),
    "video_count": (
        "I will scan the frames for {colour} objects.",
        "Let me count how often a {colour} object enters the video.",
        "I will track the {colour} objects frame by frame.",
    ),
    "video_order": (
        "I will find the first frame with an object.",
        "Let me scan the frames until something appears.",
        "I will look for the earliest object in the video.",
    ),
}
_LOOK_FIRST = ("First, a look at the {what}.", "Let me view the {what} before measuring.")
_GUESSES = ("I can answer this directly.", "This looks clear enough without code.")


@dataclasses.dataclass(frozen=True)
class SolutionPlan:
    """The assistant turns of one scripted trajectory (see the module docstring)."""

    turns: tuple[str, ...]
    strategy: str
    imperfect: bool


def task_kind(task: Task) -> str:
    """The solution kind of a synthetic task (its `data_source`), with a clear error."""
    kind = task.data_source.removeprefix("synthetic_")
    if kind not in KINDS:
        raise ValueError(
            f"task {task.id}: data_source {task.data_source!r} is not a synthetic "
            f"kind with scripted solutions ({', '.join('synthetic_' + k for k in KINDS)})"
        )
    return kind


def code_turn(thought: str, code: str) -> str:
    """An assistant turn: a thought, then one code block in the protocol's format."""
    return f"{thought}\n<code>\n```python\n{code.strip()}\n```\n</code>"


def answer_turn(value: str) -> str:
    return f"<answer>\n\\boxed{{{value}}}\n</answer>"


def _question_words(task: Task) -> tuple[str | None, str | None]:
    """(colour, shape) named in a synthetic question (None where absent)."""
    words = task.question.lower().replace("?", "").split()
    colour = next((w for w in words if w in COLOURS), None)
    shape = next((s for s in SHAPES if s in words or s + "s" in words), None)
    return colour, shape


def _fill_test(shape: str, bounds: dict[str, tuple[float, float]]) -> str:
    low, high = bounds[shape]
    return f"{low}<=f<{high}"


def _counting_code(colour: str, shape: str, strategy: int, wrong: bool) -> str:
    test = _fill_test(shape, _WRONG_FILL_BOUNDS if wrong else _FILL_BOUNDS)
    if strategy == 0:
        return f"""from scipy import ndimage
a=np.asarray(image_clue_0)
l,n=ndimage.label((a=={COLOURS[colour]}).all(2))
n=0
for i,s in enumerate(ndimage.find_objects(l)):
    b=l[s]==i+1
    f=b[:len(b)//2].mean()
    n+={test}
print(n)"""
    return f"""from scipy import ndimage
m=(np.asarray(image_clue_0)=={COLOURS[colour]}).all(2)
l,n=ndimage.label(m)
fs=[(l[s]==i+1)[:(s[0].stop-s[0].start)//2].mean() for i,s in enumerate(ndimage.find_objects(l))]
print(sum({test} for f in fs))"""


def _smallest_code() -> str:
    return """from scipy import ndimage
a=np.asarray(image_clue_0)
l,n=ndimage.label((a!=a[0,0]).any(2))
k=np.bincount(l.ravel())[1:].argmin()+1"""


def _visual_search_code(question: str, wrong: bool) -> str:
    if question == "colour":
        return _smallest_code() + f"\nprint({_COLOUR_TABLE}[tuple(a[l==k][0])])"
    if question == "shape":
        cut = 0.5 if wrong else 0.37
        return (
            _smallest_code()
            + f"""
b=l[ndimage.find_objects(l)[k-1]]==k
f=b[:len(b)//2].mean()
print('triangle' if f<{cut} else 'diamond' if f<.65 else 'circle' if f<.9 else 'square')"""
        )
    flip = ("bottom-", "top-") if wrong else ("top-", "bottom-")
    return (
        _smallest_code()
        + f"""
y,x=ndimage.center_of_mass(l==k)
print(('{flip[0]}' if y<a.shape[0]/2 else '{flip[1]}')+('left' if x<a.shape[1]/2 else 'right'))"""
    )


def _video_count_code(colour: str, strategy: int, wrong: bool) -> str:
    tolerance = 60
    update = "=max(n,k)" if wrong else "+=max(0,k-p)"
    if strategy == 0:
        return f"""from scipy import ndimage
c=np.array({COLOURS[colour]})
n,p=0,0
for i in range(len(video_clue_0)):
    f=video_clue_0[i].asnumpy().astype(int)
    l,k=ndimage.label(abs(f-c).sum(2)<{tolerance})
    k=int((np.bincount(l.ravel())[1:]>20).sum())
    n{update}
    p=k
print(n)"""
    return f"""from scipy import ndimage
v=video_clue_0.get_batch(list(range(len(video_clue_0)))).asnumpy().astype(int)
ks=[int((np.bincount(ndimage.label(abs(f-{COLOURS[colour]}).sum(2)<{tolerance})[0].ravel())[1:]>20).sum()) for f in v]
print({"max(ks)" if wrong else "sum(max(0,b-a) for a,b in zip([0]+ks,ks))"})"""


def _video_order_code(strategy: int, wrong: bool) -> str:
    pick, frames = "m.sum()>30", "range(len(video_clue_0)-1,-1,-1)" if wrong else "range(len(video_clue_0))"
    table = _NAME_TABLE
    if strategy == 0:
        return f"""C={table}
for i in {frames}:
    f=video_clue_0[i].asnumpy().astype(int)
    m=abs(f-f[0,0]).sum(2)>80
    if {pick}:
        break
p=np.median(f[m],0)
print(min(C,key=lambda c:abs(np.array(C[c])-p).sum()))"""
    return f"""C={table}
v=video_clue_0.get_batch(list(range(len(video_clue_0)))).asnumpy().astype(int)
m=abs(v-v[0,0,0]).sum(3)>80
t=[i for i in range(len(v)) if m[i].sum()>30][{-1 if wrong else 0}]
p=np.median(v[t][m[t]],0)
print(min(C,key=lambda c:abs(np.array(C[c])-p).sum()))"""


def _look_code(kind: str) -> str:
    """Code that shows the image (or a middle frame) and prints its size: a real image
    observation before the measuring turn."""
    if kind.startswith("video"):
        return """f=video_clue_0[len(video_clue_0)//2].asnumpy()
plt.imshow(f)
plt.axis('off')
plt.show()
print(len(video_clue_0),f.shape)"""
    return """plt.imshow(image_clue_0)
plt.axis('off')
plt.show()
print(image_clue_0.size)"""


def _guess(task: Task, rng: np.random.Generator) -> str:
    if task.options:
        return task.options[int(rng.integers(len(task.options)))]
    return str(int(rng.integers(1, 10)))


def _measuring_code(task: Task, kind: str, strategy: int, wrong: bool) -> str:
    colour, shape = _question_words(task)
    if kind == "counting":
        return _counting_code(colour, shape, strategy, wrong)
    if kind == "visual_search":
        return _visual_search_code(task.ability.removeprefix("visual_search_"), wrong)
    if kind == "video_count":
        return _video_count_code(colour, strategy, wrong)
    return _video_order_code(strategy, wrong)


def solution_plan(
    task: Task,
    rng: np.random.Generator,
    *,
    guess_share: float = 0.1,
    wrong_share: float = 0.1,
    look_first_share: float = 0.25,
) -> SolutionPlan:
    """One scripted trajectory for a synthetic `task`, drawn with `rng`: a guess without a tool
    call with probability `guess_share`, code whose measure is wrong with probability
    `wrong_share`, else right code (a look at the image first with probability
    `look_first_share`). One draw decides "imperfect", a second which kind, so the default
    shares draw exactly what the packaged checkpoint's data drew."""
    if min(guess_share, wrong_share) < 0 or guess_share + wrong_share > 1:
        raise ValueError(f"guess_share {guess_share} and wrong_share {wrong_share} must be >= 0 with a sum <= 1")
    kind = task_kind(task)
    colour, shape = _question_words(task)
    thought = str(rng.choice(_THOUGHTS[kind])).format(colour=colour, shape=shape)
    imperfect_share = guess_share + wrong_share
    imperfect = bool(rng.random() < imperfect_share)
    if imperfect and rng.random() < guess_share / imperfect_share:
        return SolutionPlan((f"{rng.choice(_GUESSES)}\n" + answer_turn(_guess(task, rng)),), "guess", True)
    strategy = 0 if kind == "visual_search" else int(rng.integers(2))
    turns = []
    if rng.random() < look_first_share:
        what = "frames" if kind.startswith("video") else "image"
        turns.append(code_turn(str(rng.choice(_LOOK_FIRST)).format(what=what), _look_code(kind)))
        thought = "Now " + thought[0].lower() + thought[1:]
    turns.append(code_turn(thought, _measuring_code(task, kind, strategy, imperfect)))
    turns.append(answer_turn(RESULT_SLOT))
    name = f"{kind}/{strategy}" + ("/look" if len(turns) == 3 else "") + ("/wrong" if imperfect else "")
    return SolutionPlan(tuple(turns), name, imperfect)


__all__ = ["KINDS", "RESULT_SLOT", "SolutionPlan", "answer_turn", "code_turn", "solution_plan", "task_kind"]
