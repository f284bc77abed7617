# Finds every dependency of the design (all from Debian's packages) and decides whether the CUDA
# backend is built. Sets BAGPIPE_WITH_CUDA.

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
# Only MPI's C API is used: keep Open MPI's deprecated C++ bindings out of every translation unit.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
find_package(TBB REQUIRED)
if(BAGPIPE_ABSL_SOURCE_DIR)
  # An instrumented Abseil (cmake/BagpipeSanitizers.cmake): built here, only what is linked.
  set(ABSL_PROPAGATE_CXX_STD ON)
  add_subdirectory(${BAGPIPE_ABSL_SOURCE_DIR} ${PROJECT_BINARY_DIR}/abseil EXCLUDE_FROM_ALL SYSTEM)
else()
  find_package(absl REQUIRED)
endif()
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(BLAS REQUIRED)

# xxHash, ISA-L and NCCL ship no CMake package, and OpenBLAS's CBLAS header sits in a
# subdirectory: the find modules next to this file (cmake/Find*.cmake, also installed with the
# package) define imported targets for them. bagpipe_xxhash, bagpipe_isal, bagpipe_blas and
# bagpipe_nccl are the names the components link; they are exported with the package
# (cmake/BagpipePackage.cmake).
find_package(xxHash REQUIRED)
add_library(bagpipe_xxhash INTERFACE)
target_link_libraries(bagpipe_xxhash INTERFACE xxHash::xxhash)

# CRC32C of checkpoint files (core/crc32c.h): Intel ISA-L (libisal-dev); Debian 12's Abseil
# predates absl/crc. No CMake package either (cmake/FindISAL.cmake).
find_package(ISAL REQUIRED)
add_library(bagpipe_isal INTERFACE)
target_link_libraries(bagpipe_isal INTERFACE ISAL::isal)

find_package(CBLAS REQUIRED)
add_library(bagpipe_blas INTERFACE)
target_link_libraries(bagpipe_blas INTERFACE CBLAS::cblas)

if(BAGPIPE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(BAGPIPE_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# CUDA: AUTO builds it when nvcc is found (also on machines without a GPU: the code compiles and
# its tests skip at run time). Architectures are named explicitly; `native` fails without a GPU.
set(BAGPIPE_WITH_CUDA OFF)
if(NOT BAGPIPE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(BAGPIPE_WITH_CUDA ON)
  elseif(BAGPIPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BAGPIPE_CUDA=ON but no CUDA compiler (nvcc) was found. Install the CUDA "
                        "Toolkit, pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc, or use -DBAGPIPE_CUDA=OFF.")
  else()
    message(STATUS "Bagpipe: nvcc not found; building the CPU backend only")
  endif()
endif()

if(BAGPIPE_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures" FORCE)
  endif()
  if(CMAKE_CUDA_ARCHITECTURES MATCHES "native|all")
    message(FATAL_ERROR "Name CUDA architectures explicitly (e.g. 80;90), not ${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  # NCCL: next to the toolkit or in the system paths (cmake/FindNCCL.cmake).
  find_package(NCCL)
  if(NOT NCCL_FOUND)
    message(FATAL_ERROR "The CUDA backend needs NCCL (nccl.h and libnccl.so) and none was found. "
                        "Install NCCL (e.g. libnccl-dev), set NCCL_INCLUDE_DIR/NCCL_LIBRARY, or "
                        "configure with -DBAGPIPE_CUDA=OFF.")
  endif()
  add_library(bagpipe_nccl INTERFACE)
  target_link_libraries(bagpipe_nccl INTERFACE NCCL::nccl)
  message(STATUS "Bagpipe: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
                 "NCCL ${NCCL_LIBRARY}")
endif()
