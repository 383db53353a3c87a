// DeepSpeed's monitor sections, `tensorboard` and `csv_monitor`: the same three keys each
// (`enabled`, `output_path`, `job_name`), rank 0 writing under output_path/job_name. A relative
// output_path resolves against the config file's directory like every dstrain path (DeepSpeed
// uses the working directory); DeepSpeed's default "" means that directory itself. Whether the
// directory can be written is the trainer's check, at start-up.
#include "config/config_sections.h"

namespace ds::config::detail {

void read_monitor(Section& root, const std::string& key, const std::string& config_path, MonitorConfig& out) {
  Section s = root.section(key, /*nullable=*/true);
  if (s.present()) {
    s.get_bool("enabled", out.enabled);
    s.get_string("output_path", out.output_path, /*nullable=*/true);
    s.get_string("job_name", out.job_name);
    s.finish();
  }
  out.output_path = resolve_path(config_path, out.output_path.empty() ? std::string(".") : out.output_path);
}

Json monitor_to_json(const MonitorConfig& c) {
  return Json{{"enabled", c.enabled}, {"output_path", c.output_path}, {"job_name", c.job_name}};
}

}  // namespace ds::config::detail
