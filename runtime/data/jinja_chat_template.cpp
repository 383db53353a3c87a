// The chat-template Jinja subset (jinja_chat_template.h) in three steps:
//   1. split: the source becomes text, {{ output }} and {% statement %} pieces; comments go, and
//      whitespace control applies here ({%- / -%} strip all whitespace on that side; without a
//      marker, lstrip_blocks removes the spaces and tabs before a {% or {# that starts its line
//      and trim_blocks the newline after a %} or #}), as transformers configures Jinja;
//   2. parse: statements nest into a tree (set, for, if/elif/else), expressions are parsed by
//      precedence climbing in Jinja's order (if-else < or < and < not < comparisons, in, is
//      < + - < ~ < unary < postfix . [] () and filters);
//   3. run: values are Python-like (undefined, none, bool, int, string, list, dict); a for loop
//      opens a scope per iteration, so a {% set %} inside it does not leak out, as in Jinja.
// Tags outside the subset fail at parse time; filters, tests, functions and methods outside it
// fail when they run (so a template's branch for tools, never taken here, may use tojson), each
// naming the template's line.
#include "data/jinja_chat_template.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ds::rt::data {

namespace jinja_detail {

struct Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;

  static Value of_kind(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
  static Value none() { return of_kind(Kind::kNone); }
  static Value boolean(bool v) {
    Value x = of_kind(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = of_kind(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = of_kind(Kind::kString);
    x.s = std::move(v);
    return x;
  }
  static Value of_list(List v) {
    Value x = of_kind(Kind::kList);
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value of_dict(Dict v) {
    Value x = of_kind(Kind::kDict);
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
};

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "a boolean";
    case Value::Kind::kInt:
      return "an integer";
    case Value::Kind::kString:
      return "a string";
    case Value::Kind::kList:
      return "a list";
    case Value::Kind::kDict:
      return "a dict";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->empty();
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool an = a.kind == K::kInt || a.kind == K::kBool,
             bn = b.kind == K::kInt || b.kind == K::kBool;
  if (an && bn) return (a.kind == K::kInt ? a.i : a.b) == (b.kind == K::kInt ? b.i : b.b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kString:
      return a.s == b.s;
    case K::kList:
      return a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), equal);
    case K::kDict:
      return a.dict == b.dict;
    default:
      return true;  // undefined == undefined, none == none
  }
}

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// ---- Expressions ------------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kBinary,
    kNot,
    kAnd,
    kOr,
    kCond,
    kTest
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;     // name, attribute, operator, filter, test, function
  bool negate = false;  // `is not`, `not in`
  std::vector<ExprPtr> args;
};

struct Token {
  enum class Type { kName, kString, kInt, kOp, kEnd };
  Type type;
  std::string text;
  int64_t number = 0;
};

// Where errors point: the template's name and the line of the piece being read or run.
struct Site {
  const std::string* name;
  int line;
  [[noreturn]] void fail(const std::string& what) const {
    throw invalid_argument("chat template {}: line {}: {}", *name, line, what);
  }
};

// The string literal opening at s[i] into out; returns the index after its closing quote.
size_t lex_string(std::string_view s, size_t i, const Site& site, std::vector<Token>& out) {
  static const std::map<char, char> kEscapes = {{'n', '\n'},  {'t', '\t'},  {'r', '\r'},
                                                {'\\', '\\'}, {'\'', '\''}, {'"', '"'}};
  const char quote = s[i];
  std::string v;
  size_t j = i + 1;
  for (; j < s.size() && s[j] != quote; ++j) {
    if (s[j] != '\\' || j + 1 >= s.size()) {
      v.push_back(s[j]);
      continue;
    }
    const char e = s[++j];
    if (auto it = kEscapes.find(e); it != kEscapes.end()) {
      v.push_back(it->second);
    } else {
      v.push_back('\\');
      v.push_back(e);
    }
  }
  if (j >= s.size()) site.fail("a string literal is not closed");
  out.push_back({Token::Type::kString, v, 0});
  return j + 1;
}

std::vector<Token> lex(std::string_view s, const Site& site) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Type::kName, std::string(s.substr(i, j - i)), 0});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      if (j < s.size() && s[j] == '.') site.fail("floating-point literals are not supported");
      if (j - i > 18) site.fail(fmt::format("the integer {} is too large", s.substr(i, j - i)));
      Token t{Token::Type::kInt, std::string(s.substr(i, j - i)), 0};
      t.number = std::stoll(t.text);
      out.push_back(t);
      i = j;
    } else if (c == '\'' || c == '"') {
      i = lex_string(s, i, site, out);
    } else {
      static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* t : two) {
        if (s.substr(i, 2) == t) op = t;
      }
      if (std::string("=!<>+-~()[].,|:*/%{}").find(c) == std::string::npos) {
        site.fail(fmt::format("unexpected character '{}'", c));
      }
      out.push_back({Token::Type::kOp, op, 0});
      i += op.size();
    }
  }
  out.push_back({Token::Type::kEnd, "", 0});
  return out;
}

// Precedence climbing over one piece's tokens.
class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, Site site) : t_(std::move(toks)), site_(site) {}

  ExprPtr parse() { return cond(); }
  bool at_end() const { return t_[p_].type == Token::Type::kEnd; }
  bool accept_name(const char* word) {
    if (t_[p_].type == Token::Type::kName && t_[p_].text == word) return ++p_, true;
    return false;
  }
  bool is_op(const char* op) const { return t_[p_].type == Token::Type::kOp && t_[p_].text == op; }
  bool accept_op(const char* op) {
    if (t_[p_].type == Token::Type::kOp && t_[p_].text == op) return ++p_, true;
    return false;
  }
  std::string name() {
    if (t_[p_].type != Token::Type::kName)
      site_.fail(fmt::format("expected a name, got {}", describe()));
    return t_[p_++].text;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) site_.fail(fmt::format("expected '{}', got {}", op, describe()));
  }
  void expect_end() {
    if (!at_end()) site_.fail(fmt::format("unexpected {}", describe()));
  }
  std::string describe() const {
    const Token& t = t_[p_];
    if (t.type == Token::Type::kEnd) return "the end of the tag";
    return fmt::format("'{}'", t.text);
  }

 private:
  ExprPtr node(Expr::Kind k, std::string n = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->name = std::move(n);
    e->line = site_.line;
    return e;
  }
  ExprPtr binary(Expr::Kind k, std::string op, ExprPtr a, ExprPtr b) {
    auto e = node(k, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  ExprPtr cond() {
    ExprPtr e = or_();
    if (!accept_name("if")) return e;
    auto c = node(Expr::Kind::kCond);
    c->args.push_back(or_());
    c->args.push_back(std::move(e));
    if (accept_name("else")) c->args.push_back(cond());
    return c;
  }
  ExprPtr or_() {
    ExprPtr e = and_();
    while (accept_name("or")) e = binary(Expr::Kind::kOr, "or", std::move(e), and_());
    return e;
  }
  ExprPtr and_() {
    ExprPtr e = not_();
    while (accept_name("and")) e = binary(Expr::Kind::kAnd, "and", std::move(e), not_());
    return e;
  }
  ExprPtr not_() {
    if (accept_name("not")) {
      auto e = node(Expr::Kind::kNot);
      e->args.push_back(not_());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math();
    for (;;) {
      bool matched = false;
      for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
        if (accept_op(op)) {
          e = binary(Expr::Kind::kBinary, op, std::move(e), math());
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (accept_name("in")) {
        e = binary(Expr::Kind::kBinary, "in", std::move(e), math());
      } else if (t_[p_].type == Token::Type::kName && t_[p_].text == "not" &&
                 t_[p_ + 1].type == Token::Type::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        e = binary(Expr::Kind::kBinary, "in", std::move(e), math());
        e->negate = true;
      } else if (accept_name("is")) {
        auto t = node(Expr::Kind::kTest);
        t->negate = accept_name("not");
        t->name = name();
        t->args.push_back(std::move(e));
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr math() {
    ExprPtr e = concat();
    for (;;) {
      if (accept_op("+"))
        e = binary(Expr::Kind::kBinary, "+", std::move(e), concat());
      else if (accept_op("-"))
        e = binary(Expr::Kind::kBinary, "-", std::move(e), concat());
      else
        return e;
    }
  }
  ExprPtr concat() {
    ExprPtr e = unary();
    while (accept_op("~")) e = binary(Expr::Kind::kBinary, "~", std::move(e), unary());
    return e;
  }
  ExprPtr unary() {
    if (accept_op("-")) {  // -x as 0 - x (messages[-1])
      auto zero = node(Expr::Kind::kLiteral);
      zero->literal = Value::integer(0);
      return binary(Expr::Kind::kBinary, "-", std::move(zero), unary());
    }
    ExprPtr e = postfix(primary());
    while (accept_op("|")) {
      auto f = node(Expr::Kind::kFilter, name());
      f->args.push_back(std::move(e));
      if (accept_op("(")) arguments(*f);
      e = postfix(std::move(f));
    }
    if (t_[p_].type == Token::Type::kOp) {
      for (const char* op : {"*", "/", "//", "%", "**"}) {
        if (t_[p_].text == op) site_.fail(fmt::format("the operator '{}' is not supported", op));
      }
    }
    return e;
  }
  ExprPtr primary() {
    const Token t = t_[p_];
    if (t.type == Token::Type::kString) {
      ++p_;
      auto e = node(Expr::Kind::kLiteral);
      e->literal = Value::string(t.text);
      // Adjacent literals concatenate, as in Python.
      while (t_[p_].type == Token::Type::kString) e->literal.s += t_[p_++].text;
      return e;
    }
    if (t.type == Token::Type::kInt) {
      ++p_;
      auto e = node(Expr::Kind::kLiteral);
      e->literal = Value::integer(t.number);
      return e;
    }
    if (t.type == Token::Type::kName) {
      ++p_;
      auto e = node(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True")
        e->literal = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        e->literal = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        e->literal = Value::none();
      else
        e = node(Expr::Kind::kName, t.text);
      return e;
    }
    if (accept_op("(")) {
      ExprPtr e = cond();
      expect_op(")");
      return e;
    }
    if (t.type == Token::Type::kOp && (t.text == "[" || t.text == "{")) {
      site_.fail(fmt::format("{} literals are not supported", t.text == "[" ? "list" : "dict"));
    }
    site_.fail(fmt::format("expected an expression, got {}", describe()));
  }
  // Call arguments after '(' up to ')', into e.args; keyword arguments (k=v) keep only v.
  void arguments(Expr& e) {
    if (accept_op(")")) return;
    do {
      if (t_[p_].type == Token::Type::kName && t_[p_ + 1].type == Token::Type::kOp &&
          t_[p_ + 1].text == "=")
        p_ += 2;
      e.args.push_back(cond());
    } while (accept_op(","));
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto a = node(Expr::Kind::kAttr, name());
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (accept_op("[")) {
        // x[i], or the slice x[a:b] with either bound left out (args: x, a, b; null = none).
        auto a = node(Expr::Kind::kIndex);
        a->args.push_back(std::move(e));
        auto bound = [&] { return is_op(":") || is_op("]") ? nullptr : cond(); };
        a->args.push_back(bound());
        if (accept_op(":")) {
          a->kind = Expr::Kind::kSlice;
          a->args.push_back(bound());
          if (is_op(":")) site_.fail("slices with a step are not supported");
        } else if (a->args[1] == nullptr) {
          site_.fail(fmt::format("expected an index, got {}", describe()));
        }
        expect_op("]");
        e = std::move(a);
      } else if (accept_op("(")) {
        auto c =
            node(Expr::Kind::kCall, e->kind == Expr::Kind::kName   ? e->name + "()"
                                    : e->kind == Expr::Kind::kAttr ? "the method ." + e->name + "()"
                                                                   : "(a call)");
        c->args.push_back(std::move(e));
        arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  Site site_;
};

// ---- Template pieces and statements -------------------------------------------------------------

struct Piece {
  enum class Type { kText, kOutput, kStatement };
  Type type;
  std::string text;
  int line;
};

int line_of(const std::string& src, size_t pos) {
  return 1 + static_cast<int>(
                 std::count(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

// The end of the tag opened at `open` (index of its closing delimiter), skipping string literals.
size_t tag_end(const std::string& src, size_t open, char closer) {
  char quote = 0;
  for (size_t i = open + 2; i + 1 < src.size(); ++i) {
    if (quote != 0) {
      if (src[i] == '\\')
        ++i;
      else if (src[i] == quote)
        quote = 0;
    } else if (closer != '#' && (src[i] == '\'' || src[i] == '"')) {
      quote = src[i];
    } else if (src[i] == closer && src[i + 1] == '}') {
      return i;
    }
  }
  return std::string::npos;
}

std::vector<Piece> split_pieces(const std::string& src, const std::string& name) {
  std::vector<Piece> out;
  std::string text;
  bool strip_next = false, trim_newline = false;
  size_t pos = 0;
  auto flush_text = [&](int line) {
    if (!text.empty()) out.push_back({Piece::Type::kText, text, line});
    text.clear();
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() &&
           std::string("{%#").find(src[open + 1]) == std::string::npos) {
      open = src.find('{', open + 1);
    }
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string chunk = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (trim_newline && !chunk.empty() && chunk[0] == '\n') chunk.erase(0, 1);
    if (strip_next) chunk.erase(0, std::min(chunk.size(), chunk.find_first_not_of(" \t\n\r")));
    text += chunk;
    strip_next = trim_newline = false;
    if (open == std::string::npos) break;
    const char kind = src[open + 1];
    const char closer = kind == '{' ? '}' : kind;
    const int line = line_of(src, open);
    const size_t close = tag_end(src, open, closer);
    if (close == std::string::npos) {
      throw invalid_argument("chat template {}: line {}: the tag opened here is not closed", name,
                             line);
    }
    std::string inner = src.substr(open + 2, close - open - 2);
    const bool lstrip = !inner.empty() && inner[0] == '-', plus = !inner.empty() && inner[0] == '+';
    if (lstrip || plus) inner.erase(0, 1);
    const bool rstrip = !inner.empty() && inner.back() == '-';  // "{%-%}" is only a left marker
    if (rstrip) inner.pop_back();
    if (lstrip) {
      text.erase(text.find_last_not_of(" \t\n\r") + 1);
    } else if (!plus && kind != '{') {
      size_t k = 0;  // lstrip_blocks: spaces and tabs from the start of the line
      while (k < open - pos && (src[open - k - 1] == ' ' || src[open - k - 1] == '\t')) ++k;
      if ((open - k == 0 || src[open - k - 1] == '\n') && k <= text.size())
        text.resize(text.size() - k);
    }
    flush_text(line);
    if (kind == '{')
      out.push_back({Piece::Type::kOutput, inner, line});
    else if (kind == '%')
      out.push_back({Piece::Type::kStatement, inner, line});
    strip_next = rstrip;
    trim_newline = !rstrip && kind != '{';
    pos = close + 2;
  }
  flush_text(line_of(src, src.size()));
  return out;
}

struct Node {
  enum class Kind { kText, kOutput, kSet, kFor, kIf };
  Kind kind;
  int line = 0;
  std::string text;  // text; set and for: the variable
  ExprPtr expr;      // output, set value, for iterable
  std::vector<Node> body;
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if: (condition or null, body)
};

class TemplateParser {
 public:
  TemplateParser(std::vector<Piece> pieces, const std::string& name)
      : pieces_(std::move(pieces)), name_(name) {}

  std::vector<Node> parse_all() {
    std::string end;
    auto nodes = block({}, &end);
    return nodes;
  }

 private:
  // Nodes up to one of `enders` (whose word is left in *ended, its parser in parser_).
  std::vector<Node> block(const std::set<std::string>& enders, std::string* ended) {
    std::vector<Node> out;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_++];
      const Site site{&name_, p.line};
      if (p.type == Piece::Type::kText) {
        out.push_back(Node{Node::Kind::kText, p.line, p.text, nullptr, {}, {}});
        continue;
      }
      parser_ = std::make_unique<ExprParser>(lex(p.text, site), site);
      if (p.type == Piece::Type::kOutput) {
        Node n{Node::Kind::kOutput, p.line, {}, parser_->parse(), {}, {}};
        parser_->expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string word = parser_->name();
      if (enders.count(word)) {
        *ended = word;
        return out;
      }
      if (word == "set") {
        Node n{Node::Kind::kSet, p.line, parser_->name(), nullptr, {}, {}};
        if (parser_->accept_op("."))
          site.fail("assigning to an attribute (namespace) is not supported");
        if (parser_->accept_op(",")) site.fail("{% set a, b = ... %} is not supported");
        parser_->expect_op("=");
        n.expr = parser_->parse();
        parser_->expect_end();
        out.push_back(std::move(n));
      } else if (word == "for") {
        Node n{Node::Kind::kFor, p.line, parser_->name(), nullptr, {}, {}};
        if (parser_->accept_op(",")) site.fail("{% for a, b in ... %} is not supported");
        if (!parser_->accept_name("in"))
          site.fail(fmt::format("expected 'in', got {}", parser_->describe()));
        n.expr = parser_->parse();
        if (!parser_->at_end())
          site.fail(fmt::format("{} in a for tag is not supported", parser_->describe()));
        std::string end;
        n.body = block({"endfor", "else"}, &end);
        if (end == "else") site.fail("{% for %}...{% else %} is not supported");
        if (end.empty()) site.fail("this {% for %} has no {% endfor %}");
        out.push_back(std::move(n));
      } else if (word == "if") {
        out.push_back(if_node(site));
      } else {
        site.fail(fmt::format("the tag {{% {} %}} is not supported (set, for, if)", word));
      }
    }
    return out;
  }

  Node if_node(const Site& site) {
    Node n{Node::Kind::kIf, site.line, {}, nullptr, {}, {}};
    ExprPtr cond = parser_->parse();
    parser_->expect_end();
    for (;;) {
      std::string end;
      auto body = block({"elif", "else", "endif"}, &end);
      if (end.empty()) site.fail("this {% if %} has no {% endif %}");
      n.branches.emplace_back(std::move(cond), std::move(body));
      if (end == "endif") {
        parser_->expect_end();
        return n;
      }
      if (end == "else") {
        parser_->expect_end();
        std::string e2;
        auto rest = block({"endif"}, &e2);
        if (e2.empty()) site.fail("this {% if %} has no {% endif %}");
        n.branches.emplace_back(nullptr, std::move(rest));
        return n;
      }
      cond = parser_->parse();  // elif
      parser_->expect_end();
    }
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
  const std::string& name_;
  std::unique_ptr<ExprParser> parser_;
};

// ---- Running ----------------------------------------------------------------------------------

class Runner {
 public:
  Runner(const std::string& name, const std::string& where) : name_(name), where_(where) {}
  std::vector<Dict> scopes;

  void run(const std::vector<Node>& nodes, std::string& out) {
    for (const Node& n : nodes) {
      switch (n.kind) {
        case Node::Kind::kText:
          out += n.text;
          break;
        case Node::Kind::kOutput:
          out += to_text(eval(*n.expr), n.line);
          break;
        case Node::Kind::kSet:
          scopes.back()[n.text] = eval(*n.expr);
          break;
        case Node::Kind::kIf:
          for (const auto& [cond, body] : n.branches) {
            if (cond == nullptr || truthy(eval(*cond))) {
              run(body, out);
              break;
            }
          }
          break;
        case Node::Kind::kFor:
          run_for(n, out);
          break;
      }
    }
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw invalid_argument("{}: chat template {}: line {}: {}", where_, name_, line, what);
  }

  void run_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.expr);
    List items;
    if (seq.kind == Value::Kind::kList)
      items = *seq.list;
    else if (seq.kind == Value::Kind::kDict)
      for (const auto& kv : *seq.dict) items.push_back(Value::string(kv.first));
    else if (seq.kind == Value::Kind::kString)
      for (char c : seq.s) items.push_back(Value::string(std::string(1, c)));
    else if (seq.kind != Value::Kind::kUndefined)
      fail(n.line, fmt::format("cannot loop over {}", kind_name(seq)));
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      Dict loop{{"index0", Value::integer(k)},
                {"index", Value::integer(k + 1)},
                {"first", Value::boolean(k == 0)},
                {"last", Value::boolean(k + 1 == len)},
                {"length", Value::integer(len)},
                {"revindex", Value::integer(len - k)},
                {"revindex0", Value::integer(len - k - 1)}};
      scopes.push_back(
          Dict{{n.text, items[static_cast<size_t>(k)]}, {"loop", Value::of_dict(std::move(loop))}});
      run(n.body, out);
      scopes.pop_back();
    }
  }

  std::string to_text(const Value& v, int line) const {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return "";
      case Value::Kind::kNone:
        return "None";
      case Value::Kind::kBool:
        return v.b ? "True" : "False";
      case Value::Kind::kInt:
        return std::to_string(v.i);
      case Value::Kind::kString:
        return v.s;
      default:
        fail(line, fmt::format("printing {} is not supported", kind_name(v)));
    }
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      if (auto f = it->find(name); f != it->end()) return f->second;
    }
    return Value{};
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kAttr:
        return member(eval(*e.args[0]), Value::string(e.name), e.line, true);
      case Expr::Kind::kIndex:
        return member(eval(*e.args[0]), eval(*e.args[1]), e.line, false);
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall: {
        // Known only at run time, so that a template's unused branches (tools) may call more.
        if (e.args[0]->kind != Expr::Kind::kName || e.args[0]->name != "raise_exception" ||
            e.args.size() != 2) {
          fail(e.line, fmt::format("{} is not supported (raise_exception(msg) only)",
                                   e.args[0]->kind == Expr::Kind::kName ? "the function " + e.name
                                                                        : e.name));
        }
        const Value msg = eval(*e.args[1]);
        throw invalid_argument(
            "{}: chat template {}: line {}: the template raised an exception: {}", where_, name_,
            e.line, to_text(msg, e.line));
      }
      case Expr::Kind::kFilter:
        if (e.args.size() > 1 && (e.name == "trim" || e.name == "length")) {
          fail(e.line, fmt::format("the filter |{} takes no arguments", e.name));
        }
        return filter(e.name, eval(*e.args[0]), e.line);
      case Expr::Kind::kNot:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args.size() > 2 ? eval(*e.args[2]) : Value{};
      case Expr::Kind::kTest:
        return Value::boolean(test(e.name, eval(*e.args[0]), e.line) != e.negate);
      case Expr::Kind::kBinary:
        return binary(e, eval(*e.args[0]), eval(*e.args[1]));
    }
    return Value{};
  }

  Value member(const Value& obj, const Value& key, int line, bool attr) const {
    if (obj.kind == Value::Kind::kDict && key.kind == Value::Kind::kString) {
      auto it = obj.dict->find(key.s);
      return it == obj.dict->end() ? Value{} : it->second;
    }
    if ((obj.kind == Value::Kind::kList || obj.kind == Value::Kind::kString) && !attr &&
        key.kind == Value::Kind::kInt) {
      const auto n =
          static_cast<int64_t>(obj.kind == Value::Kind::kList ? obj.list->size() : obj.s.size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n)
        fail(line, fmt::format("index {} is out of range (length {})", key.i, n));
      if (obj.kind == Value::Kind::kString)
        return Value::string(std::string(1, obj.s[static_cast<size_t>(k)]));
      return (*obj.list)[static_cast<size_t>(k)];
    }
    if (attr) fail(line, fmt::format("{} has no attribute .{}", kind_name(obj), key.s));
    fail(line, fmt::format("cannot index {} with {}", kind_name(obj), kind_name(key)));
  }

  // Python's x[a:b] on a list or string, bounds clamped, negative ones from the end.
  Value slice(const Expr& e) {
    const Value x = eval(*e.args[0]);
    if (x.kind != Value::Kind::kList && x.kind != Value::Kind::kString) {
      fail(e.line, fmt::format("cannot slice {}", kind_name(x)));
    }
    const auto n = static_cast<int64_t>(x.kind == Value::Kind::kList ? x.list->size() : x.s.size());
    auto bound = [&](const ExprPtr& b, int64_t dflt) {
      if (b == nullptr) return dflt;
      const Value v = eval(*b);
      if (v.kind != Value::Kind::kInt)
        fail(e.line, fmt::format("a slice bound must be an integer, got {}", kind_name(v)));
      return std::clamp(v.i < 0 ? v.i + n : v.i, int64_t{0}, n);
    };
    const int64_t lo = bound(e.args[1], 0), hi = std::max(lo, bound(e.args[2], n));
    if (x.kind == Value::Kind::kString)
      return Value::string(x.s.substr(static_cast<size_t>(lo), static_cast<size_t>(hi - lo)));
    return Value::of_list(List(x.list->begin() + lo, x.list->begin() + hi));
  }

  Value filter(const std::string& f, const Value& v, int line) const {
    if (f != "trim" && f != "length")
      fail(line, fmt::format("the filter |{} is not supported (trim, length)", f));
    if (f == "trim") {
      if (v.kind != Value::Kind::kString)
        fail(line, fmt::format("|trim needs a string, got {}", kind_name(v)));
      return Value::string(strip(v.s));
    }
    switch (v.kind) {  // length
      case Value::Kind::kString:
        return Value::integer(static_cast<int64_t>(v.s.size()));
      case Value::Kind::kList:
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case Value::Kind::kDict:
        return Value::integer(static_cast<int64_t>(v.dict->size()));
      default:
        fail(line, fmt::format("|length needs a string, list or dict, got {}", kind_name(v)));
    }
  }

  bool test(const std::string& t, const Value& v, int line) const {
    if (t == "defined") return v.kind != Value::Kind::kUndefined;
    if (t == "undefined") return v.kind == Value::Kind::kUndefined;
    if (t == "none") return v.kind == Value::Kind::kNone;
    if (t == "string") return v.kind == Value::Kind::kString;
    if (t == "number") return v.kind == Value::Kind::kInt;
    if (t == "boolean") return v.kind == Value::Kind::kBool;
    if (t == "mapping") return v.kind == Value::Kind::kDict;
    if (t == "sequence" || t == "iterable") {
      return v.kind == Value::Kind::kList || v.kind == Value::Kind::kString ||
             v.kind == Value::Kind::kDict;
    }
    fail(line,
         fmt::format("the test `is {}` is not supported (defined, undefined, none, string, number, "
                     "boolean, mapping, sequence, iterable)",
                     t));
  }

  Value binary(const Expr& e, const Value& a, const Value& b) const {
    const std::string& op = e.name;
    using K = Value::Kind;
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "~") return Value::string(to_text(a, e.line) + to_text(b, e.line));
    if (op == "in") {
      bool found = false;
      if (b.kind == K::kString && a.kind == K::kString)
        found = b.s.find(a.s) != std::string::npos;
      else if (b.kind == K::kList)
        found = std::any_of(b.list->begin(), b.list->end(),
                            [&](const Value& x) { return equal(a, x); });
      else if (b.kind == K::kDict && a.kind == K::kString)
        found = b.dict->count(a.s) > 0;
      else
        fail(e.line,
             fmt::format("`in` needs a string, list or dict on its right, got {}", kind_name(b)));
      return Value::boolean(found != e.negate);
    }
    if (op == "+" && a.kind == K::kString && b.kind == K::kString) return Value::string(a.s + b.s);
    if (op == "+" && a.kind == K::kList && b.kind == K::kList) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(l));
    }
    if (a.kind == K::kInt && b.kind == K::kInt) {
      if (op == "+") return Value::integer(a.i + b.i);
      if (op == "-") return Value::integer(a.i - b.i);
      if (op == "<") return Value::boolean(a.i < b.i);
      if (op == ">") return Value::boolean(a.i > b.i);
      if (op == "<=") return Value::boolean(a.i <= b.i);
      if (op == ">=") return Value::boolean(a.i >= b.i);
    }
    if (a.kind == K::kString && b.kind == K::kString) {
      if (op == "<") return Value::boolean(a.s < b.s);
      if (op == ">") return Value::boolean(a.s > b.s);
      if (op == "<=") return Value::boolean(a.s <= b.s);
      if (op == ">=") return Value::boolean(a.s >= b.s);
    }
    fail(e.line, fmt::format("cannot apply '{}' to {} and {}", op, kind_name(a), kind_name(b)));
  }

  const std::string& name_;
  const std::string& where_;
};

// The string literals of the template (roles it may name).
void collect_literals(const Expr& e, std::set<std::string>& out) {
  if (e.kind == Expr::Kind::kLiteral && e.literal.kind == Value::Kind::kString)
    out.insert(e.literal.s);
  for (const auto& a : e.args) {
    if (a) collect_literals(*a, out);  // a slice's missing bound is null
  }
}

void collect_literals(const std::vector<Node>& nodes, std::set<std::string>& out) {
  for (const Node& n : nodes) {
    if (n.expr) collect_literals(*n.expr, out);
    collect_literals(n.body, out);
    for (const auto& [c, body] : n.branches) {
      if (c) collect_literals(*c, out);
      collect_literals(body, out);
    }
  }
}

}  // namespace jinja_detail

namespace jd = jinja_detail;

struct JinjaChatTemplate::Program {
  std::vector<jd::Node> nodes;
};

JinjaChatTemplate::JinjaChatTemplate(const std::string& source, std::string bos_token,
                                     std::string eos_token, std::string name)
    : program_(std::make_unique<Program>()),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      name_(std::move(name)) {
  program_->nodes = jd::TemplateParser(jd::split_pieces(source, name_), name_).parse_all();
  std::set<std::string> literals;
  jd::collect_literals(program_->nodes, literals);
  roles_ = {"system", "user", "assistant"};
  for (const std::string& s : literals) {
    const bool word = !s.empty() && s.size() <= 32 && std::all_of(s.begin(), s.end(), [](char c) {
      return std::islower(static_cast<unsigned char>(c)) || c == '_';
    });
    if (word && std::find(roles_.begin(), roles_.end(), s) == roles_.end()) roles_.push_back(s);
  }
}

JinjaChatTemplate::~JinjaChatTemplate() = default;

std::string JinjaChatTemplate::render_text(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt,
                                           const std::string& where) const {
  jd::List list;
  for (const auto& m : messages) {
    list.push_back(jd::Value::of_dict(
        {{"role", jd::Value::string(m.role)}, {"content", jd::Value::string(m.content)}}));
  }
  jd::Runner r(name_, where);
  r.scopes.push_back({{"messages", jd::Value::of_list(std::move(list))},
                      {"bos_token", jd::Value::string(bos_)},
                      {"eos_token", jd::Value::string(eos_)},
                      {"add_generation_prompt", jd::Value::boolean(add_generation_prompt)}});
  r.scopes.emplace_back();  // the template's own top-level {% set %}s
  std::string out;
  r.run(program_->nodes, out);
  return out;
}

std::vector<ChatSegment> JinjaChatTemplate::render(const std::vector<ChatMessage>& messages,
                                                   const std::string& where) const {
  if (messages.empty()) throw invalid_argument("{}: an empty conversation", where);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (std::find(roles_.begin(), roles_.end(), messages[i].role) == roles_.end()) {
      throw invalid_argument(
          "{}: message {}: the role \"{}\" is not one the chat template {} "
          "knows ({})",
          where, i, messages[i].role, name_, fmt::join(roles_, ", "));
    }
  }
  std::vector<ChatSegment> out;
  std::string prev;
  std::vector<ChatMessage> upto;
  for (size_t i = 0; i < messages.size(); ++i) {
    const bool assistant = messages[i].role == "assistant";
    std::string gen;
    if (assistant) gen = render_text(upto, true, where);
    upto.push_back(messages[i]);
    std::string full = render_text(upto, false, where);
    if (full.compare(0, prev.size(), prev) != 0) {
      throw invalid_argument(
          "{}: chat template {}: the text for messages 0..{} does not extend "
          "the text for messages 0..{}, so message {} has no segment of its own",
          where, name_, i, i - 1, i);
    }
    size_t start = prev.size();
    if (assistant && gen.size() > prev.size() && gen.compare(0, prev.size(), prev) == 0 &&
        full.compare(0, gen.size(), gen) == 0) {
      out.push_back({gen.substr(start), false});  // the assistant header
      start = gen.size();
    }
    if (full.size() > start) out.push_back({full.substr(start), assistant});
    prev = std::move(full);
  }
  return out;
}

std::unique_ptr<ChatTemplate> open_jinja_chat_template(const std::string& tokenizer_config_path) {
  std::ifstream in(tokenizer_config_path, std::ios::binary);
  if (!in) throw system_error("chat template: cannot open {}", tokenizer_config_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw invalid_argument("chat template {}: not valid JSON: {}", tokenizer_config_path, e.what());
  }
  if (!j.is_object())
    throw invalid_argument("chat template {}: expected a JSON object", tokenizer_config_path);
  auto token = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"];
    throw invalid_argument(
        "chat template {}: {}: expected a string, {{\"content\": ...}} or null, got {}",
        tokenizer_config_path, key, it->dump());
  };
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("chat template {}: there is no chat_template key", tokenizer_config_path),
        "a base model ships no chat template: use a built-in one (--chat-template llama3)");
  }
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        source = t["template"];
      }
    }
    if (source.empty()) {
      throw invalid_argument(
          "chat template {}: chat_template: a list with no {{\"name\": \"default\", "
          "\"template\": ...}} entry",
          tokenizer_config_path);
    }
  } else {
    throw invalid_argument("chat template {}: chat_template: expected a string, got {}",
                           tokenizer_config_path, it->type_name());
  }
  return std::make_unique<JinjaChatTemplate>(source, token("bos_token"), token("eos_token"),
                                             "jinja:" + tokenizer_config_path);
}

}  // namespace ds::rt::data
