// .dstrain_env parsing: comments, blank lines, export, literal values, and errors that never
// contain a value.
#include "launch/env_file.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::launch {
namespace {

TEST(EnvFile, ParsesAssignmentsCommentsAndBlankLines) {
  auto env = parse_env_file("# comment\n\n  A=1\r\nexport B = x=y \nC=\n  # indented comment\n",
                            ".dstrain_env");
  EXPECT_EQ(env, (EnvList{{"A", "1"}, {"B", " x=y"}, {"C", ""}}));
}

TEST(EnvFile, ErrorsNameTheLineButNeverTheValue) {
  for (const char* text : {"A=1\nsecret-without-key\n", "A=1\n9BAD=hunter2\n", "A=1\nB C=hunter2\n"}) {
    try {
      parse_env_file(text, "/x/.dstrain_env");
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("/x/.dstrain_env:2"), std::string::npos) << m;
      EXPECT_EQ(m.find("hunter2"), std::string::npos) << m;
      EXPECT_EQ(m.find("secret-without-key"), std::string::npos) << m;
    }
  }
}

TEST(EnvFile, AMissingFileIsEmpty) { EXPECT_TRUE(load_env_file("/nonexistent/.dstrain_env").empty()); }

}  // namespace
}  // namespace ds::launch
