"""Reading and writing the safetensors format, one tensor at a time.

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name to
{dtype, shape, data_offsets}, then the raw bytes. Reading through np.memmap touches only the
tensor asked for, which is what lets loading stream; writing takes a callback per tensor so at
most one tensor is on the host at a time. bfloat16 comes from ml_dtypes, as in JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Callable, Iterable

import ml_dtypes
import numpy as np

from memagent_jax.errors import UserError

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: file, dtype, shape and absolute byte offset."""
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    def read(self) -> np.ndarray:
        """A read-only memory map of the tensor (no copy until used)."""
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, self.dtype)
        return np.memmap(self.file, self.dtype, "r", self.offset, self.shape)


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parses and checks one file's header: every tensor must lie inside the file."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise UserError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        header_len = struct.unpack("<Q", raw)[0]
        if header_len > min(_MAX_HEADER, size - 8):
            raise UserError(f"{path}: truncated or not a safetensors file "
                            f"(header of {header_len} bytes, file of {size})")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: corrupt safetensors header ({e})") from None
    data_start = 8 + header_len
    infos = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise UserError(f"{path}: tensor '{name}' has unsupported dtype {entry.get('dtype')!r}")
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise UserError(f"{path}: tensor '{name}' has {end - begin} bytes for shape "
                            f"{list(shape)} {entry['dtype']}")
        if data_start + end > size:
            raise UserError(f"{path}: truncated: tensor '{name}' ends at byte "
                            f"{data_start + end}, file has {size}")
        infos[name] = TensorInfo(path, dtype, shape, data_start + begin)
    return infos


def write_file(path: str, tensors: Iterable[tuple[str, np.dtype, tuple[int, ...],
                                                 Callable[[], np.ndarray]]]) -> None:
    """Writes tensors (name, dtype, shape, produce) in order; produce() is called when its
    bytes are due, so only one tensor is held at a time."""
    tensors = list(tensors)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in tensors:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _NAMES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the spec allows space padding; keeps data 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, dtype, shape, produce in tensors:
            array = produce()
            if array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
                raise AssertionError(f"{name}: produced {array.shape} {array.dtype}, "
                                     f"planned {shape} {dtype}")
            # f.write, not ndarray.tofile: tofile reports a full disk as "N requested and
            # M written", without the errno that says the disk is full.
            f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
