#!/usr/bin/env bash
# docs/finetuning.md's walk at small scale, on any machine (2 ranks, a few minutes on 2 cores): a
# tokenizer.json in Llama-3's layout from GPT-2's vocabulary, a small Llama pretrained on the KJV and
# exported as a Hugging Face directory (the "base"), chat JSONL prepared with the base's own chat
# template, LoRA on the frozen base with document-aware packing, the adapter and merged exports,
# and a greedy sample of the merged model.
#
#   scripts/finetune-walk.sh [OUT_DIR] [BUILD_DIR]   env: PRE_STEPS=150 LORA_STEPS=150 LORA_LR=0.01
# Needs data/gpt2 (scripts/fetch-gpt2-tokenizer.sh) and data/kjv/kjv.txt (scripts/prepare-kjv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
D=$(realpath -m "${1:-runs/finetune-walk}"); B=${2:-build}/bin/dstrain
mkdir -p "$D"
rm -rf $D/tok $D/kjv $D/base $D/chat $D/out $D/*.json $D/*.jsonl
/usr/bin/python3 tests/data/hf_tokenizer_make.py data/gpt2 $D/tok >/dev/null
# 1. a base model: a small Llama pretrained on the KJV with this tokenizer, exported as an HF directory
$B data prepare --tokenizer hf --vocab $D/tok/llama3 --input data/kjv/kjv.txt --output $D/kjv --no-progress
V=$(/usr/bin/python3 -c "import json;t=json.load(open('$D/tok/llama3/tokenizer.json'));print(max(list(t['model']['vocab'].values())+[a['id'] for a in t['added_tokens']])+1)")
BOS=$(/usr/bin/python3 -c "import json;t=json.load(open('$D/tok/llama3/tokenizer.json'));print([a['id'] for a in t['added_tokens'] if a['content']=='<|begin_of_text|>'][0])")
cat > $D/pretrain.json <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.0}},
 "model": {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "intermediate_size": 352,
           "vocab_size": $V, "seq_len": 128, "rope_theta": 500000, "tie_embeddings": false},
 "data": {"train": "$D/kjv/train.bin", "val": "$D/kjv/val.bin"},
 "training": {"steps": ${PRE_STEPS:-150}, "seed": 1, "eval_interval": 50, "eval_steps": 4, "log_interval": 25}}
JSON
$B launch --nproc-per-node 2 -- $B train --config $D/pretrain.json --export-safetensors $D/base 2>&1 | grep -E "step +(1|50|100|150) |val" | head
cp $D/tok/llama3/tokenizer.json $D/tok/llama3/tokenizer_config.json $D/base/
ls $D/base
# 2. chat data: a system turn, a question, one fixed style of answer
/usr/bin/python3 - <<PY
import json, random
random.seed(3)
names = ["Moses", "Aaron", "David", "Ruth", "Jonah", "Esther", "Samuel", "Elijah"]
with open("$D/chat.jsonl", "w") as f:
    for i in range(600):
        n = random.choice(names)
        msgs = [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": f"Who was {n}?"},
                {"role": "assistant", "content": f"{n} is a person of the Bible."}]
        f.write(json.dumps({"messages": msgs}) + "\n")
PY
$B data prepare --input $D/chat.jsonl --format sft --tokenizer hf --vocab $D/base --chat-template jinja:$D/base \
   --output $D/chat --val-fraction 0.1
# 3. LoRA on the frozen base, packed with per-document attention and positions
cat > $D/lora.json <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": ${LORA_LR:-0.01}, "weight_decay": 0.0}},
 "model": {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "intermediate_size": 352,
           "vocab_size": $V, "seq_len": 128, "rope_theta": 500000, "tie_embeddings": false, "init_from": "$D/base"},
 "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"},
 "data": {"train": "$D/chat/train.bin", "val": "$D/chat/val.bin", "packing": "document", "document_token": $BOS},
 "training": {"steps": ${LORA_STEPS:-150}, "seed": 1, "eval_interval": 30, "eval_steps": 1, "log_interval": 10}}
JSON
$B plan --config $D/lora.json --world-size 2 | head -30
$B launch --nproc-per-node 2 -- $B train --config $D/lora.json --export-adapter $D/out/adapter \
   --export-safetensors $D/out/merged 2>&1 | grep -E "step|val|wrote" | head -20
ls $D/out/adapter $D/out/merged
# 4. sample the merged model
$B sample --init-from $D/out/merged --config $D/lora.json --tokenizer hf --vocab $D/base --temperature 0 --tokens 16 \
   --prompt "<|begin_of_text|><|start_header_id|>user<|end_header_id|>

Who was Ruth?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

"
