# Helper functions used by every component's CMakeLists.txt.
#
# bagpipe_library(NAME SOURCES ... [CUDA_SOURCES ...] DEPS ...)
#   A static library `bagpipe_<NAME>`. CUDA_SOURCES are added only when the CUDA backend is
#   built, together with the compile definition BAGPIPE_WITH_CUDA=1, so the CPU-only build
#   always compiles.
# bagpipe_test(NAME SOURCES ... DEPS ... [LABELS ...])
#   A GoogleTest executable registered with ctest through gtest_discover_tests.
# bagpipe_mpi_test(NAME SOURCES ... DEPS ... NP n [ARGS ...])
#   A GoogleTest executable run by ctest under `mpirun -np n` (oversubscription allowed).
# bagpipe_benchmark(NAME SOURCES ... DEPS ...)
#   A Google Benchmark executable in bench/.

include(GoogleTest OPTIONAL)
include(GNUInstallDirs)

function(bagpipe_library name)
  cmake_parse_arguments(A "" "" "SOURCES;CUDA_SOURCES;DEPS" ${ARGN})
  set(target bagpipe_${name})
  set(srcs ${A_SOURCES})
  if(BAGPIPE_WITH_CUDA)
    list(APPEND srcs ${A_CUDA_SOURCES})
  endif()
  add_library(${target} STATIC ${srcs})
  # Headers are included from the repository root ("core/status.h"), in the build and in the
  # installed package alike (cmake/BagpipePackage.cmake).
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_libraries(${target} PUBLIC ${A_DEPS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(BAGPIPE_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC BAGPIPE_WITH_CUDA=1)
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  endif()
endfunction()

function(bagpipe_test name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    BAGPIPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    BAGPIPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${A_LABELS}")
endfunction()

function(bagpipe_mpi_test name)
  cmake_parse_arguments(A "" "NP" "SOURCES;DEPS;ARGS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock)
  target_compile_definitions(${name} PRIVATE
    BAGPIPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    BAGPIPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} ${A_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "mpi;${A_LABELS}" TIMEOUT 300
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endfunction()

function(bagpipe_benchmark name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} benchmark::benchmark)
endfunction()
