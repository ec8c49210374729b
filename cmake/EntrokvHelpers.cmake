# One helper per kind of target, so every module's CMakeLists reads the same way.

# entrokv_library(NAME name SRCS ... DEPS ...): a static library with an entrokv:: alias.
function(entrokv_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(entrokv_${ARG_NAME} STATIC ${ARG_SRCS})
  add_library(entrokv::${ARG_NAME} ALIAS entrokv_${ARG_NAME})
  target_include_directories(entrokv_${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(entrokv_${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

# entrokv_test(NAME name LABEL unit|integration|e2e|gpu SRCS ... DEPS ...)
function(entrokv_test)
  cmake_parse_arguments(ARG "" "NAME;LABEL" "SRCS;DEPS" ${ARGN})
  if(NOT ENTROKV_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} entrokv::testing GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${ARG_NAME} PROPERTIES LABELS ${ARG_LABEL} DISCOVERY_TIMEOUT 60)
endfunction()

# entrokv_benchmark(NAME name SRCS ... DEPS ...): a Google Benchmark binary.
function(entrokv_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} benchmark::benchmark benchmark::benchmark_main)
endfunction()
