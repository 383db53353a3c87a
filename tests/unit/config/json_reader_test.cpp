// The strict JSON reader: every syntax error with its exact message and position, duplicate
// keys, line tracking by JSON path, and the corners of strings and numbers.
#include "config/json_reader.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::config {
namespace {

std::string error_of(std::string_view text) {
  try {
    parse_json(text, "x.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonReader, SyntaxErrorsNameLineColumnAndWhatWasExpected) {
  struct Case {
    std::string text;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"", "x.json:1:1: empty input: expected a JSON value (a config is a JSON object)"},
      {"  \n ", "x.json:2:2: empty input: expected a JSON value (a config is a JSON object)"},
      {"{\"a\": 1,}", "x.json:1:9: trailing comma before '}'"},
      {"[1, 2,]", "x.json:1:7: trailing comma before ']'"},
      {"{\n  // note\n  \"a\": 1\n}", "x.json:2:3: comments are not allowed in JSON"},
      {"{\"a\": 1 /* x */}", "x.json:1:9: comments are not allowed in JSON"},
      {"{'a': 1}", "x.json:1:2: keys must be strings in double quotes"},
      {"{\"a\": 'b'}", "x.json:1:7: strings must use double quotes"},
      {"{a: 1}", "x.json:1:2: expected a string key in double quotes, got 'a'"},
      {"{\"a\" 1}", "x.json:1:6: expected ':' after key \"a\", got '1'"},
      {"{\"a\": 1 \"b\": 2}", "x.json:1:9: expected ',' or '}' after a member of an object, got '\"'"},
      {"[1 2]", "x.json:1:4: expected ',' or ']' after an array element, got '2'"},
      {"{\"a\": 01}", "x.json:1:8: numbers must not have leading zeros"},
      {"{\"a\": 1.}", "x.json:1:9: expected a digit after '.', got '}'"},
      {"{\"a\": 1e}", "x.json:1:9: expected a digit in the exponent, got '}'"},
      {"{\"a\": -}", "x.json:1:8: expected a digit, got '}'"},
      {"{\"a\": NaN}", "x.json:1:7: NaN and Infinity are not JSON numbers"},
      {"{\"a\": tru}", "x.json:1:7: expected a JSON value, got 't'"},
      {"{\"a\": 1e999}", "x.json:1:7: number 1e999 is out of range"},
      {"{\"a\": 1} x", "x.json:1:10: unexpected content after the end of the JSON value"},
      {"{\"a\": \"x\ny\"}", "x.json:1:9: unterminated string (newline inside a string)"},
      {"{\"a\": \"abc", "x.json:1:11: unterminated string"},
      {"{\"a\": \"\\q\"}", "x.json:1:9: invalid escape '\\q' in string"},
      {"{\"a\": \"\\ud83d\"}", "x.json:1:14: unpaired UTF-16 surrogate in \\u escape"},
      {"{\"a\": \"\\u12g4\"}", "x.json:1:12: invalid hex digit in \\u escape"},
      {"{\"a\": \"\xff\"}", "x.json:1:8: invalid UTF-8 in string"},
      {"{\"a\": \"\t\"}", "x.json:1:8: control character 0x09 inside a string (escape it)"},
      {"{\"a\": \xc3}", "x.json:1:7: expected a JSON value, got byte 0xc3"},
      {std::string(200, '['), "x.json:1:130: nesting deeper than 128 levels"},
  };
  for (const auto& c : cases) EXPECT_EQ(error_of(c.text), c.error) << "input: " << c.text;
}

TEST(JsonReader, ErrorsAreInvalidArgument) {
  try {
    parse_json("{", "x.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(JsonReader, ValuesAndTheirLines) {
  auto doc = parse_json("{\n  \"a\": {\n    \"b\": [1,\n      2.5, \"s\"]\n  },\n  \"c d\": null\n}",
                        "x.json");
  EXPECT_EQ(doc.value["a"]["b"][0], 1);
  EXPECT_DOUBLE_EQ(doc.value["a"]["b"][1].get<double>(), 2.5);
  EXPECT_EQ(doc.value["a"]["b"][2], "s");
  EXPECT_TRUE(doc.value["c d"].is_null());
  EXPECT_EQ(doc.line_of("$"), 1);
  EXPECT_EQ(doc.line_of("$.a"), 2);
  EXPECT_EQ(doc.line_of("$.a.b"), 3);
  EXPECT_EQ(doc.line_of("$.a.b[0]"), 3);
  EXPECT_EQ(doc.line_of("$.a.b[1]"), 4);
  EXPECT_EQ(doc.line_of("$[\"c d\"]"), 6);
  EXPECT_EQ(doc.line_of("$.nope"), 0);
  // Object keys keep file order.
  EXPECT_EQ(doc.value.begin().key(), "a");
}

TEST(JsonReader, StringsAndNumbers) {
  auto doc = parse_json(
      R"({"e": "\"\\\/\b\f\n\r\t", "u": "\u00e9\ud83d\ude00", "raw": "é", "big": 18446744073709551615,
          "neg": -9223372036854775808, "huge": 123456789012345678901234, "f": -1.5e-3, "z": -0})",
      "x.json");
  EXPECT_EQ(doc.value["e"], "\"\\/\b\f\n\r\t");
  EXPECT_EQ(doc.value["u"], "\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(doc.value["raw"], "\xc3\xa9");
  EXPECT_TRUE(doc.value["big"].is_number_unsigned());
  EXPECT_EQ(doc.value["big"].get<uint64_t>(), 18446744073709551615ULL);
  EXPECT_EQ(doc.value["neg"].get<int64_t>(), INT64_MIN);
  EXPECT_TRUE(doc.value["huge"].is_number_float());
  EXPECT_DOUBLE_EQ(doc.value["f"].get<double>(), -1.5e-3);
  EXPECT_EQ(doc.value["z"].get<int64_t>(), 0);
}

TEST(JsonReader, DuplicateKeysThrowOrAreCollected) {
  const std::string text = "{\n  \"a\": 1,\n  \"b\": {\"x\": 1, \"x\": 2},\n  \"a\": {\"y\": 3}\n}";
  EXPECT_EQ(error_of(text), "x.json:3: $.b.x: duplicate key \"x\" (first at line 3)");

  std::vector<std::string> dups;
  auto doc = parse_json(text, "x.json", &dups);
  ASSERT_EQ(dups.size(), 2u);
  EXPECT_EQ(dups[0], "x.json:3: $.b.x: duplicate key \"x\" (first at line 3)");
  EXPECT_EQ(dups[1], "x.json:4: $.a: duplicate key \"a\" (first at line 2)");
  // The first value wins and the dropped value's lines do not leak into the document.
  EXPECT_EQ(doc.value["a"], 1);
  EXPECT_EQ(doc.value["b"]["x"], 1);
  EXPECT_EQ(doc.line_of("$.a.y"), 0);
}

TEST(JsonReader, PathsQuoteKeysThatAreNotPlainNames) {
  EXPECT_EQ(json_path_child("$", "stage"), "$.stage");
  EXPECT_EQ(json_path_child("$.a", "b-c_1"), "$.a.b-c_1");
  EXPECT_EQ(json_path_child("$", "a.b"), "$[\"a.b\"]");
  EXPECT_EQ(json_path_child("$", ""), "$[\"\"]");
  EXPECT_EQ(json_path_index("$.betas", 1), "$.betas[1]");
}

}  // namespace
}  // namespace ds::config
