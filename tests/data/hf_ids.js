// Computes the expected ids of tests/data/hf_cases.json with the npm package
// @huggingface/tokenizers@0.2.0 (Hugging Face's own JavaScript tokenizer.json implementation),
// independently of dstrain, on the tokenizer.json files tests/data/hf_tokenizer_make.py writes,
// and renders the chat templates of their tokenizer_config.json with @huggingface/jinja@0.5.13.
//   python3 tests/data/hf_tokenizer_make.py data/gpt2 /tmp/hf
//   (cd /tmp/hfjs && npm install --ignore-scripts @huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.13)
//   NODE_PATH=/tmp/hfjs/node_modules node tests/data/hf_ids.js /tmp/hf > tests/data/hf_cases.json
// Ids are encoded without the post-processor's BOS (add_special_tokens false), as `data prepare`
// writes the document token itself. JavaScript's \s lacks U+0085 and has U+FEFF, so the strings
// avoid both.
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@huggingface/tokenizers');
const { Template } = require('@huggingface/jinja');
const dir = process.argv[2] || '/tmp/hf';
const strings = [
  "Hello world",
  "I'm sure you'll see we've done what they're saying she'd do, it's 'S' I'M WE'LL YOU'RE",
  "don't DON'T o'clock rock'n'roll '''",
  "0 12 345 6789 1234567 3.14159 2024-05-20 1,000,000 x12345y",
  "abc123def 42nd x2 ½ ² Ⅻ",
  "Hello 👋🏽 world 🎉🎉 👨‍👩‍👧",
  "日本語のテキスト、中文字符。한국어 텍스트",
  "a  b   c    d     e",
  "   leading and trailing   ",
  "line1\nline2\n\n\nline3\r\nline4\n",
  "\tindent\t\tx \t y\n\t\n  \n   z\n \n",
  "def f(x):\n    return x**2  # square\n\nclass A:\n    pass\n",
  "for (int i = 0; i < n; ++i) { sum += a[i]; }\n}\n\n)\n",
  "café naïve Ærøskøbing façade",
  "cafe\u0301 nai\u0308ve A\u030angstrom \u1100\u1161\u11a8",
  "Привет мир Γειά σου Κόσμε",
  "مرحبا بالعالم नमस्ते दुनिया",
  "!!!??? ... --- *** ### (hello) \"quoted\" [x]",
  "https://example.com/path?query=1&x=y#frag",
  " $100.00 and 50% off!",
  "In the beginning God created the heaven and the earth.\n\nAnd the earth was without form.",
  "\u00a0non\u00a0breaking\u3000ideographic\u2003em",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
  "text<|eot_id|>more <|eot_id|> <|end_of_text|>x<|im_start|>system\nHi<|im_end|>\n",
  "<|endoftext|>after<|endoftext|> <|endoftext",
  "<|begin_of_text|<|eot_id|>>",
  " ",
  "\n",
  "x",
  "  \n  \n",
];
// 150 random strings from pieces that stress the pre-tokenizer scanners (deterministic LCG).
// No U+017F (ſ): this JS implementation folds (?i:...) in ASCII only, the Rust and tiktoken
// regex engines (and dstrain) fold ſ to s.
const alphabet = ["a", "Z", "é", "ß", "日", "本", "한", "Ω", "0", "7", "٣", "½", "Ⅻ", " ", "  ", "\t",
  "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "'", "'s", "'S", "'ll", "'LL", "'Re", "!", ".",
  ",", "(", ")", "#", "$", "😀", "👍🏽", "e\u0301", "\u0301", "-", "_", "<|eot_id|>", "<|im_start|>",
  "<|endoftext|>", "<|", "|>", "word", " the", "1234567", "\n\n", " \n", "\t\n "];
let seed = 12345;
const rand = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const fuzz = [];
for (let k = 0; k < 150; ++k) {
  let t = '';
  const n = 5 + rand(36);
  for (let j = 0; j < n; ++j) t += alphabet[rand(alphabet.length)];
  fuzz.push(t);
}
const kinds = ['gpt2', 'llama3', 'qwen2'];
const out = { source: "@huggingface/tokenizers@0.2.0 and @huggingface/jinja@0.5.13 (node " +
              process.version + "), tests/data/hf_ids.js", cases: [], chats: [] };
const toks = {};
for (const k of kinds) {
  const tj = JSON.parse(fs.readFileSync(path.join(dir, k, 'tokenizer.json'), 'utf8'));
  const cfgPath = path.join(dir, k, 'tokenizer_config.json');
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
  toks[k] = { tok: new Tokenizer(tj, cfg), cfg };
}
for (const text of strings.concat(fuzz)) {
  const c = { text };
  for (const k of kinds) {
    const ids = toks[k].tok.encode(text, { add_special_tokens: false }).ids;
    const back = toks[k].tok.decode(ids, { clean_up_tokenization_spaces: false });
    if (back !== (k === 'qwen2' ? text.normalize('NFC') : text)) {
      console.error(`hf_ids.js: ${k} does not round-trip ${JSON.stringify(text)}`); process.exit(1);
    }
    c[k] = ids;
  }
  out.cases.push(c);
}
const conversations = [
  [{ role: 'user', content: 'Hello!' }, { role: 'assistant', content: '  Hi there.\n' }],
  [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2+2?' },
   { role: 'assistant', content: '4' }, { role: 'user', content: 'And 3+3?' },
   { role: 'assistant', content: '6' }],
];
for (const k of ['llama3', 'qwen2']) {
  const cfg = toks[k].cfg;
  const tmpl = new Template(cfg.chat_template);
  const tokenText = t => t == null ? '' : (typeof t === 'string' ? t : t.content);
  for (const messages of conversations) {
    const render = (msgs, gen) => tmpl.render({ messages: msgs, add_generation_prompt: gen,
      bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) });
    const prefixes = messages.map((m, i) => render(messages.slice(0, i + 1), false));
    const gen = messages.map((m, i) => render(messages.slice(0, i), true));
    out.chats.push({ kind: k, messages, text: prefixes[prefixes.length - 1], prefixes, gen });
  }
}
process.stdout.write('{"source": ' + JSON.stringify(out.source) + ',\n "cases": [\n' +
  out.cases.map(c => '  ' + JSON.stringify(c)).join(',\n') + '\n ],\n "chats": [\n' +
  out.chats.map(c => '  ' + JSON.stringify(c)).join(',\n') + '\n]}\n');
