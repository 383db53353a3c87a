// Every environment variable dstrain reads, in one table (after NCCL's NCCL_PARAM): grep for
// DS_ENV_KNOBS to find them all; docs/configuration.md lists the same table.
//
// Variables of the worker environment contract (RANK, WORLD_SIZE, ...) are listed too, since the
// runtime reads them; the launcher writes them (lib/launch/world.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ds::env {

// X(name, default-as-text, description)
#define DS_ENV_KNOBS(X)                                                                       \
  X("DSTRAIN_LOG_LEVEL", "info", "log level: trace, debug, info, warn, error, off")           \
  X("DSTRAIN_STORE", "", "host:port of the job's rendezvous store (set by the launcher)")      \
  X("DSTRAIN_JOB_ID", "", "job identifier (set by the launcher)")                              \
  X("DSTRAIN_JOB_TOKEN", "", "secret that authenticates the job's store clients (launcher)")   \
  X("DSTRAIN_COMM_BACKEND", "auto", "collectives backend: auto (shm on one host, else gloo), shm, gloo, nccl") \
  X("DSTRAIN_CUDA_MODULE", "", "path of libdstrain_cuda.so (default: beside the executable)")  \
  X("DSTRAIN_RESTART_COUNT", "0", "how many times the job was restarted (set by the launcher)") \
  X("RANK", "0", "global rank of this worker (set by the launcher)")                          \
  X("LOCAL_RANK", "0", "rank of this worker on its node (set by the launcher)")               \
  X("WORLD_SIZE", "1", "number of workers in the job (set by the launcher)")                  \
  X("LOCAL_WORLD_SIZE", "1", "number of workers on this node (set by the launcher)")          \
  X("NODE_RANK", "0", "index of this node in the hostfile order (set by the launcher)")       \
  X("MASTER_ADDR", "127.0.0.1", "address of the first node (set by the launcher)")            \
  X("MASTER_PORT", "29500", "port left free for the job's own use (set by the launcher)")

// The raw value, or nullopt when unset. Only names from DS_ENV_KNOBS may be read (checked).
std::optional<std::string> get(const char* name);
// The value, or the table's default when unset or empty.
std::string get_or_default(const char* name);
// Integer value with the table's default; a non-integer value is an invalid_argument naming it.
int64_t get_int(const char* name);

struct KnobInfo {
  const char* name;
  const char* default_value;
  const char* description;
};
// The whole table, in order (for `dstrain report` and the docs).
const KnobInfo* knobs(size_t* count);

}  // namespace ds::env
