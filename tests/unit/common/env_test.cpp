#include "common/env.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds {
namespace {

TEST(Env, DefaultsAndIntegers) {
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(env::get_int("WORLD_SIZE"), 1);
  ::setenv("WORLD_SIZE", "8", 1);
  EXPECT_EQ(env::get_int("WORLD_SIZE"), 8);
  ::setenv("WORLD_SIZE", "eight", 1);
  try {
    env::get_int("WORLD_SIZE");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE='eight'"), std::string::npos);
  }
  ::unsetenv("WORLD_SIZE");
}

TEST(Env, UnknownNameIsABug) {
  EXPECT_THROW(env::get("NOT_A_KNOB"), Error);
}

}  // namespace
}  // namespace ds
