#!/usr/bin/python3
"""A hand-rolled safetensors writer (stdlib only, no safetensors or torch package), used by
safetensors_test.cpp to prove that dstrain reads a file it did not write itself.
  write_safetensors.py OUT
writes three tensors: "a" F32 (2, 3) = i * 0.25 - 1, "b" BF16 (4,) = i - 1.5 and "c" F16 (2, 2)
= i * 0.5 + 0.125 (all exactly representable), with metadata {"format": "pt"}. The header is
padded with spaces to a multiple of 8, as the reference writer does."""
import json
import struct
import sys


def bf16_bytes(values):
    out = b""
    for v in values:
        (bits,) = struct.unpack("<I", struct.pack("<f", v))
        out += struct.pack("<H", bits >> 16)  # exact: the values have <= 8 significant bits
    return out


def main():
    a = [i * 0.25 - 1 for i in range(6)]
    b = [i - 1.5 for i in range(4)]
    c = [i * 0.5 + 0.125 for i in range(4)]
    blobs = [("a", "F32", [2, 3], struct.pack("<6f", *a)),
             ("b", "BF16", [4], bf16_bytes(b)),
             ("c", "F16", [2, 2], struct.pack("<4e", *c))]
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, dtype, shape, raw in blobs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(sys.argv[1], "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


if __name__ == "__main__":
    main()
