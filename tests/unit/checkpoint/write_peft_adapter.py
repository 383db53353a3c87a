#!/usr/bin/python3
"""A PEFT LoRA adapter directory written by hand (stdlib only, no peft or safetensors package), in
the layout peft's save_pretrained writes, used by peft_adapter_test.cpp to prove that dstrain reads
an adapter it did not write itself.
  write_peft_adapter.py OUT_DIR [default]
writes OUT_DIR/adapter_config.json with every key PEFT 0.13 writes (r 4, lora_alpha 16,
lora_dropout 0.05, target_modules ["v_proj", "q_proj"]) and OUT_DIR/adapter_model.safetensors
holding lora_A (4, 8) and lora_B (out, 4) of q_proj (out 8) and v_proj (out 4) in layers 0 and 1
of a Llama, as safetensors' save_file lays them out: the header sorted by name, the data in that
order, metadata {"format": "pt"}, the header padded with spaces to a multiple of 8. With
`default`, the tensor names carry ".default" (".lora_A.default.weight"), as some PEFT versions
write. Values (all exactly representable in every dtype): module m (0..3 in name order), element i:
A = ((i % 7) - 3) * 0.125 + m, B = ((i % 5) - 2) * 0.25 - m. Dtypes: layer 0's tensors F32,
layer 1's q_proj BF16 and v_proj F16."""
import json
import os
import struct
import sys

R, IN = 4, 8


def bf16_bytes(values):
    out = b""
    for v in values:
        (bits,) = struct.unpack("<I", struct.pack("<f", v))
        out += struct.pack("<H", bits >> 16)  # exact: the values have few significant bits
    return out


def pack(dtype, values):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    return bf16_bytes(values)


def main():
    out_dir = sys.argv[1]
    tag = ".default" if len(sys.argv) > 2 and sys.argv[2] == "default" else ""
    os.makedirs(out_dir, exist_ok=True)
    modules = []  # (module path, out, dtype)
    for layer in range(2):
        for proj, out in (("q_proj", 8), ("v_proj", 4)):
            dtype = "F32" if layer == 0 else ("BF16" if proj == "q_proj" else "F16")
            modules.append(("model.layers.%d.self_attn.%s" % (layer, proj), out, dtype))
    modules.sort()
    tensors = {}
    for m, (path, out, dtype) in enumerate(modules):
        a = [((i % 7) - 3) * 0.125 + m for i in range(R * IN)]
        b = [((i % 5) - 2) * 0.25 - m for i in range(out * R)]
        tensors["base_model.model.%s.lora_A%s.weight" % (path, tag)] = (dtype, [R, IN], pack(dtype, a))
        tensors["base_model.model.%s.lora_B%s.weight" % (path, tag)] = (dtype, [out, R], pack(dtype, b))
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(out_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    config = {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "TinyLlama/TinyLlama-1.1B",
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "layer_replication": None, "layers_pattern": None, "layers_to_transform": None, "loftq_config": {},
        "lora_alpha": 16, "lora_dropout": 0.05, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": None, "peft_type": "LORA", "r": R, "rank_pattern": {}, "revision": None,
        "target_modules": ["v_proj", "q_proj"], "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": False,
    }
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
