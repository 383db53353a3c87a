// --launcher none: this process is one node of a job whose every node runs
// `dstrain launch --launcher none --node-rank N` itself, with the same hostfile, --master-addr,
// --store-port and DSTRAIN_JOB_TOKEN (as under a Kubernetes PyTorchJob, or by hand).
//
// Node 0 hosts the job's store at --master-addr:--store-port; every node (node 0 too) joins it
// and runs its own ranks with an in-process agent. Through the store, keys under "launch/":
//   node/<N>                  node N is here (its host name)
//   go                        node 0, once every node is here: "ok <MASTER_PORT> <JOB_ID>", or
//                             "abort <why>" when a node did not come within --join-timeout
//   gen<R>/failure            the job's first failure in generation R (first writer wins): every
//                             other node stops its ranks after the failure grace
//   gen<R>/done/<N>           node N's end of generation R (its first failure, preempted ranks)
//   gen<R>/next               node 0's verdict: restart (--max-restarts) or the job's outcome,
//                             which every node prints and exits with
//   gen<R>/ack/<N>            node N read the verdict; node 0 keeps the store up until then
// A node that never arrives ends the job after --join-timeout with an error naming it (nodes
// other than 0 wait twice that for node 0's verdict, since node 0 may start last).
//
// Internal to lib/launch. Output: each node shows its own ranks only.
#pragma once

#include "launch/launcher.h"

namespace ds::launch {

int run_none_node(const JobSpec& spec, OutputMux& mux);

}  // namespace ds::launch
