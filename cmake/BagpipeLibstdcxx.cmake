# Every program and module links the shared libstdc++, ahead of every other library.
#
# Bagpipe's processes always hold libstdc++.so.6: oneTBB, Abseil and Open MPI's C++ parts load
# it, and so does PyTorch around the Python extension. A GCC whose own library directory holds
# libstdc++.a but no libstdc++.so (one such toolchain is the GPU machine's, in /opt/gcc) makes
# -lstdc++ find the archive first: part of libstdc++ then goes inside the binary, exported, the
# shared libraries bind some of their calls to that copy and some to libstdc++.so.6, and the
# first number formatted through a std::ostream crashes on the mixed locale state (it did, in the
# extension). Naming the shared library explicitly, with --no-as-needed, resolves every
# libstdc++ symbol there first; where the driver links the shared library anyway (Debian's GCC)
# nothing changes. tests/apps/shared_libstdcxx_test.sh checks the result (ctest
# python_extension_links, bagpipe_links_shared_libstdcxx, shared_libstdcxx_self_test).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  return()
endif()
set(BAGPIPE_SHARED_LIBSTDCXX "")
foreach(name libstdc++.so libstdc++.so.6)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${name}
                  OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${found}" AND EXISTS "${found}")
    set(BAGPIPE_SHARED_LIBSTDCXX "${found}")
    break()
  endif()
endforeach()
if(BAGPIPE_SHARED_LIBSTDCXX)
  add_link_options(
    "SHELL:-Wl,--push-state,--no-as-needed ${BAGPIPE_SHARED_LIBSTDCXX} -Wl,--pop-state")
else()
  message(WARNING "Bagpipe: ${CMAKE_CXX_COMPILER} finds no shared libstdc++ "
                  "(-print-file-name=libstdc++.so): programs may carry a copy of libstdc++")
endif()
