# The fuzz build (-DBAGPIPE_FUZZ=ON; scripts/fuzz.sh): only the parsers under test and what they
# link (core, data, tests/fuzz), every translation unit instrumented with AddressSanitizer,
# UndefinedBehaviorSanitizer (any finding aborts) and libFuzzer's coverage; the harnesses link
# libFuzzer's driver. Needs clang (Debian: clang and libclang-rt-dev of the same version).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "BAGPIPE_FUZZ needs clang for libFuzzer: configure with "
                      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                    -fno-omit-frame-pointer)
# -O1 and line tables only: symbolised reports at a fraction of the compile time of -O2 -g (the
# whole stage has to fit in CI's budget on 2 cores).
foreach(lang C CXX)
  foreach(config RELEASE RELWITHDEBINFO DEBUG)
    set(CMAKE_${lang}_FLAGS_${config} "-O1 -gline-tables-only")
  endforeach()
endforeach()
add_link_options(-fsanitize=address,undefined)
add_subdirectory(core)
add_subdirectory(data)
add_subdirectory(tests/fuzz)
message(STATUS "Bagpipe: fuzz build (tests/fuzz only, ASan + UBSan + libFuzzer)")
