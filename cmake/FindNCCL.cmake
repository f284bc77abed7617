# Finds NCCL (which ships no CMake package) next to the CUDA Toolkit or in the system paths and
# defines the imported target NCCL::nccl. Used by the build with the CUDA backend and by projects
# that find an installed Bagpipe built with it. Set NCCL_INCLUDE_DIR / NCCL_LIBRARY to override;
# BAGPIPE_NCCL_HINTS may name extra directories to search.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${BAGPIPE_NCCL_HINTS} ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
find_library(NCCL_LIBRARY nccl
  HINTS ${BAGPIPE_NCCL_HINTS} ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
