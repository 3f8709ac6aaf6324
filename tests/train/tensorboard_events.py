"""Reading TensorBoard event files back in tests."""

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    out = {}
    for tag in accumulator.Tags()["tensors"]:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        out[tag] = [
            (event.step, float(tensor_util.make_ndarray(event.tensor_proto))) for event in accumulator.Tensors(tag)
        ]
    return out
