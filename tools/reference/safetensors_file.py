"""Reads and writes safetensors files for the reference scripts (tapestry's are nn/safetensors.h).

The format: a u64 little-endian header length, a JSON header {name: {dtype, shape, data_offsets},
"__metadata__": {str: str}}, then the raw little-endian data. safetensors.torch.load_file is used
when installed (it proves the file is real safetensors); otherwise the file is parsed here.
save_safetensors is written here (no dependency): it lays the tensors out back to back in the
order given, so they tile the data section exactly, as tapestry's reader requires."""
import json
import struct

import torch

# The format's dtype names. tapestry reads F32, F64, I64 and BOOL; the others are for reading
# files from other tools.
DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BOOL": torch.bool,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "F16": torch.float16, "BF16": torch.bfloat16}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


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


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (in dict order) and {str: str} metadata as a safetensors file.

    Tensors are written contiguous, little-endian (the host order of every machine we run on;
    checked below), with the header padded by spaces to a multiple of 8 bytes as the format's
    own writer does. Tied tensors (the same storage under two names) are written twice, as
    separate copies, which is what a reader expects of a safetensors file."""
    import sys
    if sys.byteorder != "little":
        raise RuntimeError("save_safetensors: big-endian hosts are not supported")
    header = {}
    if metadata:
        bad = {k: v for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise ValueError(f"save_safetensors: metadata must map str to str, got {bad}")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name, t in tensors.items():
        if name == "__metadata__" or not isinstance(t, torch.Tensor):
            raise ValueError(f"save_safetensors: bad entry {name!r}")
        if t.dtype not in NAMES:
            raise ValueError(f"save_safetensors: {name}: unsupported dtype {t.dtype}")
        t = t.detach().contiguous().cpu()
        # Raw bytes of the tensor: view it as bytes through a flat uint8 reinterpretation.
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
