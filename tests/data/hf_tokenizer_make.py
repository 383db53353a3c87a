#!/usr/bin/env python3
# Writes test tokenizer.json files in the layouts Hugging Face ships for GPT-2, Llama-3 and Qwen2,
# built from GPT-2's real vocabulary (encoder.json + vocab.bpe, scripts/fetch-gpt2-tokenizer.sh):
#   OUT/gpt2/tokenizer.json                          ByteLevel pre-tokenizer (use_regex), string merges
#   OUT/llama3/tokenizer.json, tokenizer_config.json Split(Llama-3 regex) + ByteLevel, pair merges,
#                                                    ignore_merges, TemplateProcessing BOS
#   OUT/qwen2/tokenizer.json, tokenizer_config.json  NFC, Split(Qwen2 regex) + ByteLevel
# The vocabularies are GPT-2's, the special tokens Llama-3's and Qwen2's names with new ids; the
# chat templates are the real models' strings. Used at test time (tests/unit/data/hf_tokenizer_test.cpp)
# and by tests/data/hf_ids.js, which computes the expected ids with @huggingface/tokenizers.
#   python3 tests/data/hf_tokenizer_make.py data/gpt2 OUT
import json, os, sys

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def added(id_, content, special=True, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def byte_level(**kw):
    d = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    d.update(kw)
    return d


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def model(vocab, merges, pairs, ignore_merges):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
         "ignore_merges": ignore_merges, "vocab": vocab,
         "merges": [list(m.split(" ")) for m in merges] if pairs else merges}
    return m


def write(out, name, tok, config=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)


def main(gpt2_dir, out):
    with open(os.path.join(gpt2_dir, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(gpt2_dir, "vocab.bpe"), encoding="utf-8") as f:
        merges = [l for l in f.read().split("\n")[1:] if l]
    n = len(vocab)  # 50257, <|endoftext|> = 50256

    write(out, "gpt2", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n - 1, "<|endoftext|>", normalized=True)],
        "normalizer": None, "pre_tokenizer": byte_level(),
        "post_processor": byte_level(trim_offsets=False), "decoder": byte_level(),
        "model": model(vocab, merges, False, False)})

    llama_special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                     "<|end_header_id|>", "<|eot_id|>"]
    llama_added = [added(n + i, s) for i, s in enumerate(llama_special)]
    bos = {"id": "<|begin_of_text|>", "type_id": 0}
    write(out, "llama3", {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": llama_added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(LLAMA3_PATTERN), byte_level(use_regex=False)]},
        "post_processor": {"type": "Sequence", "processors": [
            byte_level(trim_offsets=False),
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": byte_level(),
        "model": model(vocab, merges, True, True)},
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
         "chat_template": LLAMA3_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"})

    qwen_added = [added(n - 1, "<|endoftext|>"), added(n, "<|im_start|>"), added(n + 1, "<|im_end|>")]
    write(out, "qwen2", {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": qwen_added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(QWEN2_PATTERN), byte_level(use_regex=False)]},
        "post_processor": byte_level(trim_offsets=False), "decoder": byte_level(),
        "model": model(vocab, merges, False, False)},
        {"bos_token": None, "eos_token": {"content": "<|im_end|>", "lstrip": False},
         "pad_token": "<|endoftext|>", "chat_template": QWEN2_TEMPLATE,
         "tokenizer_class": "Qwen2Tokenizer"})


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: hf_tokenizer_make.py GPT2_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
