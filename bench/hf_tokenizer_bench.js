// Encode throughput of Hugging Face's JavaScript tokenizer.json implementation
// (@huggingface/tokenizers) on one text, one thread: the peer row of bench/hf_tokenizer_bench.sh.
//   NODE_PATH=DIR/node_modules node bench/hf_tokenizer_bench.js TOKENIZER_DIR TEXT [REPS]
// The text is encoded in 1 MB pieces cut after a newline (as dstrain's pipeline cuts), without
// the post-processor's BOS. Prints the median of REPS passes.
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@huggingface/tokenizers');
const [dir, file, repsArg] = process.argv.slice(2);
const reps = Number(repsArg || 3);
const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
const cfgPath = path.join(dir, 'tokenizer_config.json');
const tok = new Tokenizer(tj, fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {});
const text = fs.readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
const pieces = [];
for (let pos = 0; pos < text.length;) {
  let end = Math.min(text.length, pos + (1 << 20));
  const nl = text.indexOf('\n', end);
  end = end >= text.length || nl < 0 ? text.length : nl + 1;
  pieces.push(text.slice(pos, end));
  pos = end;
}
const runs = [];
for (let r = 0; r < reps; ++r) {
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const p of pieces) tokens += tok.encode(p, { add_special_tokens: false }).ids.length;
  runs.push({ s: Number(process.hrtime.bigint() - t0) / 1e9, tokens });
}
runs.sort((a, b) => a.s - b.s);
const m = runs[Math.floor(runs.length / 2)];
console.log(`js:${path.basename(dir).padEnd(11)} ${file.padEnd(40)} ${(bytes / 1e6).toFixed(1).padStart(7)} MB  1 thread   ` +
            `${(bytes / 1e6 / m.s).toFixed(2).padStart(7)} MB/s wall  ${(m.tokens / bytes).toFixed(3)} tokens/byte  ` +
            `${(m.tokens / m.s / 1e6).toFixed(2).padStart(6)} M tokens/s wall`);
