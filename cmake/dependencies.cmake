# Every third-party dependency, found through its CMake config file or pkg-config.
# Debian 12 packages: scripts/install-deps.sh installs all of them.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(Boost 1.74 REQUIRED COMPONENTS filesystem)
find_package(Gloo CONFIG REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
pkg_check_modules(LIBSSH2 REQUIRED IMPORTED_TARGET libssh2)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# oneDNN (libdnnl-dev): the CPU matmuls (runtime/kernels/cpu/onednn.h). Found by hand, not through
# Debian's dnnl-config.cmake: that one also asks for the OpenCL headers (ocl-icd-opencl-dev, only
# a recommendation of libdnnl-dev), which the CPU engine never uses.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY dnnl)
if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found (oneapi/dnnl/dnnl.hpp, libdnnl.so): apt-get install libdnnl-dev, "
                      "or run scripts/install-deps.sh")
endif()
add_library(DNNL::dnnl UNKNOWN IMPORTED)
set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION "${DNNL_LIBRARY}"
                                            INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
if(DSTRAIN_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()

# Debian's Gloo config names the library but not its include directory as SYSTEM, and it needs
# the threads library: wrap it once.
add_library(ds_gloo INTERFACE)
target_link_libraries(ds_gloo INTERFACE gloo Threads::Threads)
get_target_property(_gloo_inc gloo INTERFACE_INCLUDE_DIRECTORIES)
if(_gloo_inc)
  target_include_directories(ds_gloo SYSTEM INTERFACE ${_gloo_inc})
endif()

# Tokenizers (runtime/data): ICU's character classes for GPT-2's pre-tokenisation, and
# SentencePiece (libicu-dev, libsentencepiece-dev).
pkg_check_modules(ICU_UC REQUIRED IMPORTED_TARGET icu-uc)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
