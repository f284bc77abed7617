# Sanitizer builds (scripts/sanitize.sh).
#
# BAGPIPE_SANITIZE: empty (default), "address,undefined" or "thread". Compiles and links every
# C and C++ target with -fsanitize=<value> and frame pointers; UndefinedBehaviorSanitizer
# reports are fatal (-fno-sanitize-recover), so a test that triggers one fails. GCC's
# target_clones are turned off (BAGPIPE_NO_TARGET_CLONES, core/target_clones.h): their ifunc
# resolvers run before the sanitizer runtime is initialised, which ThreadSanitizer does not
# survive, and a sanitizer build gains nothing from them. CUDA sources are not instrumented:
# configure sanitizer builds with -DBAGPIPE_CUDA=OFF.
#
# BAGPIPE_ABSL_SOURCE_DIR: an Abseil source tree (Debian's source package of the installed
# libabsl-dev) built as part of this project with the project's flags instead of Debian's
# prebuilt libraries. ThreadSanitizer needs it: Abseil's Mutex, CondVar and Notification tell
# the sanitizer about their locking only when compiled with -fsanitize=thread, so with the
# uninstrumented Debian libraries every wait on them is invisible and races are reported (or
# missed) wrongly. Only the Abseil libraries the project links are compiled.

set(BAGPIPE_SANITIZE "" CACHE STRING "Sanitizers to build with: empty, address,undefined or thread")
set(BAGPIPE_ABSL_SOURCE_DIR "" CACHE PATH
    "Build Abseil from this source tree with the project's flags (ThreadSanitizer builds)")

if(BAGPIPE_SANITIZE)
  if(NOT BAGPIPE_SANITIZE MATCHES "^(address,undefined|address|undefined|thread)$")
    message(FATAL_ERROR "BAGPIPE_SANITIZE=${BAGPIPE_SANITIZE}: expected address,undefined or thread")
  endif()
  set(flags -fsanitize=${BAGPIPE_SANITIZE} -fno-omit-frame-pointer)
  if(BAGPIPE_SANITIZE MATCHES "undefined")
    list(APPEND flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${flags}>")
  add_link_options(-fsanitize=${BAGPIPE_SANITIZE})
  add_compile_definitions(BAGPIPE_NO_TARGET_CLONES=1)
  message(STATUS "Bagpipe: sanitizers ${BAGPIPE_SANITIZE}")
endif()
