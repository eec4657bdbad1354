"""Reads the safetensors files tapestry writes (nn/safetensors.h), for the reference scripts.

The format: a u64 little-endian header length, a JSON header {name: {dtype, shape, data_offsets},
"__metadata__": {str: str}}, then the raw little-endian data. safetensors.torch.load_file is used
when installed (it proves the file is real safetensors); otherwise the file is parsed here."""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BOOL": torch.bool}


def load_safetensors(path):
    """Returns ({name: tensor}, {metadata key: value})."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    try:
        from safetensors.torch import load_file
        return load_file(path), meta
    except ImportError:
        pass
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(entry["shape"])
    return tensors, meta
