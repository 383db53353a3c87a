// The programs of the cluster backends (--launcher slurm, openmpi, mpich): finding them, making
// sure they are what their backend expects, and --launcher-args.
//
//   slurm    srun                                   (Debian: slurm-client)
//   openmpi  mpirun.openmpi, else mpirun            (Debian: openmpi-bin); its --version must
//                                                    say "Open MPI" or "OpenRTE"
//   mpich    mpiexec.hydra, mpirun.mpich,            (Debian: mpich); its --version must say
//            mpiexec.mpich, else mpiexec             "HYDRA"
// Open MPI and MPICH install side by side on Debian (update-alternatives picks what `mpirun`
// is), which is why the flavour-specific names come first.
#pragma once

#include <string>
#include <vector>

#include "launch/launcher.h"

namespace ds::launch {

// The absolute path of the backend's program on PATH, checked as above. Throws invalid_usage
// naming every name looked for and the package to install, or when the program found is another
// MPI's ("mpirun is MPICH's, but --launcher openmpi ...").
std::string find_cluster_program(Backend backend);

// "srun", "mpirun" or "mpiexec": how messages call the backend's program.
std::string cluster_program_label(Backend backend);

// --launcher-args "--mca btl self,tcp -x 'A=b c'" -> its words (single and double quotes,
// backslash escapes, as a POSIX shell splits them; no expansions). An unterminated quote is an
// invalid_argument naming --launcher-args.
std::vector<std::string> split_launcher_args(const std::string& text);

}  // namespace ds::launch
