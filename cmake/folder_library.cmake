# ds_folder_library(<target> <root> <folder> SOURCES ...): a static library holding one source
# folder (lib/<folder> or runtime/<folder>), whose headers are reachable ONLY through it.
#
# Every folder's headers are included by folder ("comm/comm.h", "model/gpt2.h"). Instead of
# giving every target the whole source root as an include path, each folder library exports an
# include directory of its own (build/include_views/<target>/) that holds one link, <folder> ->
# the source folder. A target therefore sees its own headers and those of the libraries it links
# (CMake propagates their include directories), and nothing else: an include across a dependency
# that the folders' CMakeLists do not declare (model -> comm, kernels -> optim, lib -> runtime)
# fails to compile with "No such file or directory". tests/build_rules proves it.
function(ds_folder_library target root folder)
  cmake_parse_arguments(A "" "" "SOURCES" ${ARGN})
  add_library(${target} STATIC ${A_SOURCES})
  set(view ${CMAKE_BINARY_DIR}/include_views/${target})
  file(MAKE_DIRECTORY ${view})
  get_filename_component(parent ${view}/${folder} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT EXISTS ${view}/${folder})
    file(CREATE_LINK ${root}/${folder} ${view}/${folder} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${view})
  target_link_libraries(${target} PRIVATE ds_warnings)
  ds_unity_build(${target})
endfunction()

# Unity batches for a library or binary of dstrain's own sources (DSTRAIN_UNITY_BUILD).
function(ds_unity_build target)
  if(DSTRAIN_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()
