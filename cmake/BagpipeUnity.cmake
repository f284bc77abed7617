# Unity builds (-DCMAKE_UNITY_BUILD=ON; scripts/test.sh and scripts/sanitize.sh asan use one):
# CMake compiles each target's sources in batches, one translation unit per batch, so the heavy
# headers (Abseil, nlohmann/json, GoogleTest, oneTBB) are parsed once per batch instead of once
# per file.
# Included at the end of the top-level CMakeLists.txt, once every directory is added. The files
# below define a name in an anonymous namespace that another file compiled in the same target
# also defines (a constant or helper of the same name): they are compiled on their own, in every
# directory whose targets list them (tests/fuzz compiles some of the libraries' sources too).
if(CMAKE_UNITY_BUILD)
  set(dirs ${PROJECT_SOURCE_DIR})
  set(all_dirs "")
  while(dirs)
    list(POP_FRONT dirs dir)
    list(APPEND all_dirs ${dir})
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
  endwhile()
  set(alone data/csv_reader.cc oracle/planner_residency.cc server/shard_file.cc
            trainer_hooks/options_agreement.cc)
  list(TRANSFORM alone PREPEND ${PROJECT_SOURCE_DIR}/)
  # Absolute paths: relative ones would be read against this (the top) directory.
  set_source_files_properties(${alone} DIRECTORY ${all_dirs}
                              PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endif()
