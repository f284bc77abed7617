# The version header, `cmake --install` and the exported CMake package.
#
#   cmake --install build --prefix PREFIX
#     PREFIX/bin/bagpipe                      the command
#     PREFIX/lib/libbagpipe_<component>.a     one static library per component folder
#     PREFIX/include/<component>/*.h          public headers, included from the root as in the
#                                             repository ("trainer_hooks/trainer.h")
#     PREFIX/lib/cmake/Bagpipe/               BagpipeConfig.cmake, its version file, the exported
#                                             targets and the find modules of dependencies without
#                                             a CMake package of their own
#     PREFIX/lib/python3/dist-packages/bagpipe/  the Python package, where it is built
#                                             (python/CMakeLists.txt, BAGPIPE_PYTHON_INSTALL_DIR)
#
# A project then uses find_package(Bagpipe CONFIG) and links Bagpipe::bagpipe (every component
# and, transitively, every dependency, found again by BagpipeConfig.cmake) or one component,
# Bagpipe::<component>. examples/cpp_loop/ is such a project.

include(CMakePackageConfigHelpers)

set(BAGPIPE_COMPONENTS core data oracle cache sync server prefetch trainer_hooks model)

# core/version.h: the version of project(), the one place it is set.
configure_file(${PROJECT_SOURCE_DIR}/core/version.h.in ${PROJECT_BINARY_DIR}/generated/core/version.h
               @ONLY)
target_include_directories(bagpipe_core PUBLIC $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>)

# A sanitizer build (cmake/BagpipeSanitizers.cmake) is no package: its libraries need the
# sanitizer's runtime, and an Abseil built in the tree is not exported.
if(BAGPIPE_SANITIZE)
  return()
endif()

# Bagpipe::bagpipe: every component library.
add_library(bagpipe_all INTERFACE)
set_target_properties(bagpipe_all PROPERTIES EXPORT_NAME bagpipe)
add_library(Bagpipe::bagpipe ALIAS bagpipe_all)
set(package_targets bagpipe_all bagpipe_xxhash bagpipe_isal bagpipe_blas)
if(BAGPIPE_WITH_CUDA)
  list(APPEND package_targets bagpipe_nccl)
endif()
foreach(component ${BAGPIPE_COMPONENTS})
  target_link_libraries(bagpipe_all INTERFACE bagpipe_${component})
  set_target_properties(bagpipe_${component} PROPERTIES EXPORT_NAME ${component})
  list(APPEND package_targets bagpipe_${component})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${component}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${component}
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/core/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/core)

install(TARGETS ${package_targets} EXPORT BagpipeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The command keeps the non-system library directories it was linked with (CUDA, NCCL).
set_target_properties(bagpipe PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS bagpipe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/Bagpipe)
install(EXPORT BagpipeTargets NAMESPACE Bagpipe:: DESTINATION ${config_dir})
# Where the build found NCCL, a hint for projects using the package.
set(BAGPIPE_NCCL_HINTS "")
if(BAGPIPE_WITH_CUDA)
  get_filename_component(nccl_include ${NCCL_INCLUDE_DIR} ABSOLUTE)
  get_filename_component(nccl_lib ${NCCL_LIBRARY} DIRECTORY)
  set(BAGPIPE_NCCL_HINTS "${nccl_include};${nccl_lib}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/BagpipeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/BagpipeConfig.cmake
                              INSTALL_DESTINATION ${config_dir})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/BagpipeConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/BagpipeConfig.cmake
              ${PROJECT_BINARY_DIR}/BagpipeConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindxxHash.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindISAL.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindCBLAS.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
        DESTINATION ${config_dir})
