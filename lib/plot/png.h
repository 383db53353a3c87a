// PNG output through librsvg's rsvg-convert (Debian: librsvg2-bin): the SVG is written to a
// temporary file and converted by a child process (fork/exec, no shell), at 1:1 scale.
#pragma once

#include <string>

#include "common/deadline.h"

namespace ds::plot {

// Writes `svg` as a PNG at `png_path`, running rsvg-convert found on PATH. Throws ds::Error:
//   invalid_usage  rsvg-convert is not on PATH (the hint names the package, and the SVG way out)
//   system_error   the temporary SVG cannot be written, fork fails, or rsvg-convert fails
//                  (its exit status and the last of its stderr in the message)
//   timeout_error  rsvg-convert runs past `deadline` (it is killed)
void write_png(const std::string& svg, const std::string& png_path,
               Deadline deadline = Deadline::after(Millis(60000)));

}  // namespace ds::plot
