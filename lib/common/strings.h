// Small string helpers shared by the parsers: trimming, splitting, strict integer parsing,
// edit distance for "did you mean" suggestions, byte-size formatting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

std::string_view trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);

// Whole-string decimal integer (optional sign); nullopt on anything else or overflow.
std::optional<int64_t> parse_int(std::string_view s);

// Levenshtein distance, for suggesting the closest known key.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word`, if one is close enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// "1.50 GiB", "312.0 MiB", "512 B".
std::string format_bytes(double bytes);
// Parses "80GB", "80 GiB", "1.5e9", "512MiB" into bytes (GB = 1e9, GiB = 2^30).
std::optional<double> parse_bytes(std::string_view s);

}  // namespace ds
