#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests: TFRecord framing with both
masked CRC-32C checks (CRC-32C computed here bit by bit, not by dstrain's code), and a hand
decoder of protobuf's wire format for the Event, Summary and Value messages.

Usage: read_tfevents.py FILE   prints {"file_version": ..., "events": [{"step", "wall_time",
"values": {tag: simple_value}}]} as JSON; exits 1 with a message on any framing or CRC error.
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """Yields (field number, wire type, value) of one message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unexpected wire type %d" % wt)
        yield num, wt, v


def records(data):
    i = 0
    while i < len(data):
        if len(data) - i < 12:
            raise ValueError("truncated record header at byte %d" % i)
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hcrc != masked(crc32c(header)):
            raise ValueError("length CRC mismatch at byte %d" % i)
        body = data[i + 12:i + 12 + n]
        if len(body) != n or len(data) < i + 16 + n:
            raise ValueError("truncated record at byte %d" % i)
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if dcrc != masked(crc32c(body)):
            raise ValueError("data CRC mismatch at byte %d" % i)
        yield body
        i += 16 + n


def decode_event(body):
    ev = {"values": {}}
    for num, wt, v in fields(body):
        if num == 1 and wt == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wt == 0:
            ev["step"] = v
        elif num == 3 and wt == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wt == 2:
            for snum, swt, sv in fields(v):
                if snum != 1 or swt != 2:
                    raise ValueError("unexpected Summary field %d" % snum)
                tag, value = None, None
                for vnum, vwt, vv in fields(sv):
                    if vnum == 1 and vwt == 2:
                        tag = vv.decode()
                    elif vnum == 2 and vwt == 5:
                        value = struct.unpack("<f", vv)[0]
                ev["values"][tag] = value
        else:
            raise ValueError("unexpected Event field %d (wire type %d)" % (num, wt))
    return ev


def main():
    data = open(sys.argv[1], "rb").read()
    try:
        events = [decode_event(r) for r in records(data)]
    except (ValueError, IndexError) as e:
        print("read_tfevents: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        sys.exit(1)
    out = {"file_version": events[0].get("file_version") if events else None, "events": events[1:]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
