# Finds Intel ISA-L (Debian: libisal-dev, which ships no CMake package) and defines the imported
# target ISAL::isal. Used by the build and, installed next to BagpipeConfig.cmake, by projects
# that find the installed Bagpipe package. Set ISAL_INCLUDE_DIR / ISAL_LIBRARY to override.
find_path(ISAL_INCLUDE_DIR isa-l/crc.h)
find_library(ISAL_LIBRARY isal)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ISAL REQUIRED_VARS ISAL_LIBRARY ISAL_INCLUDE_DIR)
if(ISAL_FOUND AND NOT TARGET ISAL::isal)
  add_library(ISAL::isal UNKNOWN IMPORTED)
  set_target_properties(ISAL::isal PROPERTIES
    IMPORTED_LOCATION "${ISAL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ISAL_INCLUDE_DIR}")
endif()
mark_as_advanced(ISAL_INCLUDE_DIR ISAL_LIBRARY)
