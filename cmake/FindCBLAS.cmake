# Finds a BLAS with the CBLAS interface (Debian: libopenblas-dev, whose cblas.h lives under
# openblas-pthread/) and defines the imported target CBLAS::cblas (BLAS::BLAS plus the header).
# Used by the build and by projects that find the installed Bagpipe package. Set
# CBLAS_INCLUDE_DIR to override the header's directory, BLA_VENDOR to pick the BLAS.
find_package(BLAS QUIET)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CBLAS REQUIRED_VARS CBLAS_INCLUDE_DIR BLAS_FOUND)
if(CBLAS_FOUND AND NOT TARGET CBLAS::cblas)
  add_library(CBLAS::cblas INTERFACE IMPORTED)
  set_target_properties(CBLAS::cblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES BLAS::BLAS)
endif()
mark_as_advanced(CBLAS_INCLUDE_DIR)
