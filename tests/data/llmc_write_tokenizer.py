#!/usr/bin/env python3
"""Writes gpt2_tokenizer.bin in the layout of llm.c's train_gpt2.py (write_tokenizer): 256 int32
(magic 20240328, version 2, n, EOT), then for each id a uint8 length and the token's bytes. llm.c
takes the bytes from tiktoken's enc.decode_bytes([i]); here they come from encoder.json through
OpenAI's bytes_to_unicode (encoder.py), so the file does not depend on dstrain's code.

    python3 tests/data/llmc_write_tokenizer.py data/gpt2/encoder.json OUT.bin
"""
import json
import struct
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def main():
    encoder = json.load(open(sys.argv[1], encoding="utf-8"))
    byte_decoder = {v: k for k, v in bytes_to_unicode().items()}
    by_id = {i: s for s, i in encoder.items()}
    n = max(by_id) + 1
    eot = encoder["<|endoftext|>"]
    header = [0] * 256
    header[0], header[1], header[2], header[3] = 20240328, 2, n, eot
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<256i", *header))
        for i in range(n):
            b = bytes(byte_decoder[c] for c in by_id[i])
            assert 0 < len(b) < 256
            f.write(struct.pack("<B", len(b)))
            f.write(b)


if __name__ == "__main__":
    main()
