# Unity builds (-DCMAKE_UNITY_BUILD=ON; scripts/sanitize.sh asan uses one): CMake compiles each
# target's sources in batches, one translation unit per batch, so the heavy headers (Abseil,
# nlohmann/json, GoogleTest, oneTBB) are parsed once per batch instead of once per file.
# Included after every component's directory is added. The files below define a name in an
# anonymous namespace that another file of the same target also defines (a constant or helper
# of the same name): they are compiled on their own.
if(CMAKE_UNITY_BUILD)
  foreach(entry IN ITEMS data:csv_reader.cc oracle:planner_residency.cc server:shard_file.cc
                         trainer_hooks:options_agreement.cc)
    string(REPLACE ":" ";" entry "${entry}")
    list(GET entry 0 dir)
    list(GET entry 1 file)
    # The path is absolute: a relative one would be read against this (the top) directory.
    set_source_files_properties(${PROJECT_SOURCE_DIR}/${dir}/${file}
                                DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}
                                PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endforeach()
endif()
