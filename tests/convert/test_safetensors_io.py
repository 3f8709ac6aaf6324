import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from pyvision_jax.convert.layout import hf_chunks, read_flax_leaf
from pyvision_jax.convert.names import TensorKind
from pyvision_jax.convert.safetensors_io import (
    SafetensorsFormatError,
    TensorSpec,
    read_header,
    read_row_chunks,
    read_tensor,
    write_file,
)


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.normal(size=(7, 5)).astype(np.float32),
        "b.bias": rng.normal(size=(3,)).astype(ml_dtypes.bfloat16),
        "c.weight": rng.normal(size=(4, 3, 2, 2, 2)).astype(np.float16),
        "d.ids": np.arange(6, dtype=np.int64).reshape(2, 3),
    }


def test_written_files_read_back_with_the_safetensors_library(tmp_path):
    arrays = _arrays()
    specs = [TensorSpec(name, a.dtype, a.shape) for name, a in arrays.items()]
    write_file(tmp_path / "x.safetensors", specs, lambda spec: [arrays[spec.name]])
    with safe_open(tmp_path / "x.safetensors", "np") as f:
        assert sorted(f.keys()) == sorted(arrays)
        assert f.metadata() == {"format": "pt"}
        for name, a in arrays.items():
            got = f.get_tensor(name)
            assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


def test_reads_files_of_the_safetensors_library_chunk_by_chunk(tmp_path):
    arrays = _arrays()
    save_file(arrays, tmp_path / "x.safetensors")
    entries, metadata = read_header(tmp_path / "x.safetensors")
    assert sorted(entries) == sorted(arrays)
    with open(tmp_path / "x.safetensors", "rb") as fh:
        for name, a in arrays.items():
            got = read_tensor(fh, entries[name])
            assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
        chunks = list(read_row_chunks(fh, entries["a.weight"], chunk_bytes=40))
    assert [first for first, _ in chunks] == [0, 2, 4, 6]
    assert np.array_equal(np.concatenate([c for _, c in chunks]), arrays["a.weight"])


def test_layout_transforms_invert_each_other_in_small_chunks(tmp_path):
    rng = np.random.default_rng(1)
    linear = rng.normal(size=(9, 4)).astype(np.float32)
    conv = rng.normal(size=(5, 3, 2, 2, 2)).astype(np.float32)
    save_file({"linear": linear, "conv": conv}, tmp_path / "x.safetensors")
    entries, _ = read_header(tmp_path / "x.safetensors")
    with open(tmp_path / "x.safetensors", "rb") as fh:
        kernel = read_flax_leaf(fh, entries["linear"], TensorKind.LINEAR_WEIGHT)
        conv_kernel = read_flax_leaf(fh, entries["conv"], TensorKind.CONV_WEIGHT, np.dtype(ml_dtypes.bfloat16))
    assert np.array_equal(kernel, linear.T)
    assert conv_kernel.dtype == ml_dtypes.bfloat16
    assert np.array_equal(conv_kernel, conv.reshape(5, -1).T.astype(ml_dtypes.bfloat16))
    back = np.concatenate(list(hf_chunks(kernel, TensorKind.LINEAR_WEIGHT, chunk_bytes=32)))
    assert np.array_equal(back, linear)
    back_conv = np.concatenate(list(hf_chunks(conv_kernel, TensorKind.CONV_WEIGHT, np.float32, chunk_bytes=8)))
    assert np.array_equal(back_conv.reshape(conv.shape), conv.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_truncated_file_is_named(tmp_path):
    save_file(_arrays(), tmp_path / "x.safetensors")
    data = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(SafetensorsFormatError, match="cut.safetensors"):
        read_header(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{{{{{")
    with pytest.raises(SafetensorsFormatError, match="junk.safetensors"):
        read_header(tmp_path / "junk.safetensors")


def test_writer_rejects_wrong_byte_count(tmp_path):
    spec = TensorSpec("w", np.dtype(np.float32), (2, 2))
    with pytest.raises(ValueError, match="'w'"):
        write_file(tmp_path / "x.safetensors", [spec], lambda s: [np.zeros(3, np.float32)])
