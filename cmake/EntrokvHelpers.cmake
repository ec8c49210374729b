# One helper per kind of target, so every module's CMakeLists reads the same way.

# Warnings for the project's own code (not for generated protobuf code): every helper below links
# it; plain add_executable targets link it themselves. -Werror is off in a plain build, so that a
# user's compiler (another g++, another build type) never fails the build over a warning; the
# project's own scripts (deploy/local.sh, deploy/tsan.sh), and so CI, turn it on, and CI builds
# with it: g++'s Release build, clang's sanitized build and g++'s TSan build (docs/testing.md).
option(ENTROKV_WERROR "Treat warnings in the project's own code as errors" OFF)
set(_entrokv_warning_flags -Wall -Wextra -Wno-unused-parameter)
if(ENTROKV_WERROR)
  list(APPEND _entrokv_warning_flags -Werror)
endif()
# nvcc takes host-compiler flags through -Xcompiler (its own -Werror means something else).
list(JOIN _entrokv_warning_flags "," _entrokv_host_warning_flags)
# Clang checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) that
# g++ ignores. C++ units only (nvcc's host compiler may be g++). CI's sanitized build is clang's,
# so every unit is analysed there (docs/testing.md, "Thread-safety analysis").
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(APPEND _entrokv_warning_flags -Wthread-safety)
endif()
add_library(entrokv_warnings INTERFACE)
target_compile_options(entrokv_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:${_entrokv_warning_flags}>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_entrokv_host_warning_flags}>")

# entrokv_library(NAME name SRCS ... DEPS ...): a static library with an entrokv:: alias (also
# its name when installed, cmake/EntrokvInstall.cmake). The source tree and the warnings are
# build-tree requirements only, so an installed library carries neither.
function(entrokv_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(entrokv_${ARG_NAME} STATIC ${ARG_SRCS})
  add_library(entrokv::${ARG_NAME} ALIAS entrokv_${ARG_NAME})
  set_target_properties(entrokv_${ARG_NAME} PROPERTIES EXPORT_NAME ${ARG_NAME})
  target_include_directories(entrokv_${ARG_NAME} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(entrokv_${ARG_NAME} PUBLIC ${ARG_DEPS}
    PRIVATE $<BUILD_INTERFACE:entrokv_warnings>)
endfunction()

# entrokv_test(NAME name LABEL unit|integration|e2e|gpu SRCS ... DEPS ...)
function(entrokv_test)
  cmake_parse_arguments(ARG "" "NAME;LABEL" "SRCS;DEPS" ${ARGN})
  if(NOT ENTROKV_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} entrokv::testing entrokv_warnings
    GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${ARG_NAME} PROPERTIES LABELS ${ARG_LABEL} DISCOVERY_TIMEOUT 60)
endfunction()

# entrokv_benchmark(NAME name SRCS ... DEPS ...): a Google Benchmark binary.
function(entrokv_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} entrokv_warnings benchmark::benchmark
    benchmark::benchmark_main)
endfunction()

# entrokv_copy_plot_script(TARGET): puts sim/plots/eval_plots.py beside the target's binary,
# where DefaultPlotScript() (sim/report.h) looks for it, so the build tree can move.
function(entrokv_copy_plot_script target)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E copy_if_different
      ${PROJECT_SOURCE_DIR}/sim/plots/eval_plots.py $<TARGET_FILE_DIR:${target}>/eval_plots.py
    VERBATIM)
endfunction()

# entrokv_install_library(NAME name [HEADERS header...] [BASE_DIR dir]): puts entrokv_<name>
# in the installed package (export set entrokvTargets, component `development`; the package
# itself: cmake/EntrokvInstall.cmake), and each header at its path below BASE_DIR (default: the
# repository root) in include/entrokv, the folder the installed target adds to the include
# path. So "client/cpp/client.h" is included by that name inside and outside the tree.
include(GNUInstallDirs)
set(ENTROKV_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/entrokv)
function(entrokv_install_library)
  cmake_parse_arguments(ARG "" "NAME;BASE_DIR" "HEADERS" ${ARGN})
  if(NOT ARG_BASE_DIR)
    set(ARG_BASE_DIR ${PROJECT_SOURCE_DIR})
  endif()
  install(TARGETS entrokv_${ARG_NAME} EXPORT entrokvTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
    INCLUDES DESTINATION ${ENTROKV_INSTALL_INCLUDEDIR})
  foreach(header ${ARG_HEADERS})
    get_filename_component(header ${header} ABSOLUTE)
    file(RELATIVE_PATH relative ${ARG_BASE_DIR} ${header})
    get_filename_component(folder ${relative} DIRECTORY)
    install(FILES ${header} DESTINATION ${ENTROKV_INSTALL_INCLUDEDIR}/${folder}
      COMPONENT development)
  endforeach()
endfunction()
