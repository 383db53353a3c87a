// The `.dstrain_env` file (like DeepSpeed's `.deepspeed_env`): extra environment variables for
// every worker, one KEY=VALUE per line, '#' comments and blank lines allowed, an optional
// leading "export ". Values are taken literally (no quotes removed, no expansion).
//
// Values may be secrets: no error message here ever contains a value, only file:line and the key.
#pragma once

#include <string>
#include <string_view>

#include "launch/world.h"

namespace ds::launch {

inline constexpr const char* kEnvFileName = ".dstrain_env";

// Parses the text of an env file; `path` is only used in messages ("path:3: ...").
EnvList parse_env_file(std::string_view text, const std::string& path);
// Reads `path` if it exists (a missing file gives an empty list); unreadable: system_error.
EnvList load_env_file(const std::string& path);

}  // namespace ds::launch
