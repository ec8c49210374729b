# The installed package: `cmake --install <build> --prefix <prefix>` (component `development`)
# lets a C++ project outside this tree do
#   find_package(entrokv 0.1 REQUIRED)
#   target_link_libraries(worker PRIVATE entrokv::client)
# with CMAKE_PREFIX_PATH=<prefix>. The libraries in it are those entrokv_install_library names
# (cmake/EntrokvHelpers.cmake); entrokvConfig.cmake finds what they link (gRPC, protobuf,
# Abseil). tests/install builds a consumer against such a prefix. Component `runtime` (the two
# binaries, what the container image installs) is separate and unchanged.
include(CMakePackageConfigHelpers)
set(_entrokv_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/entrokv)
install(EXPORT entrokvTargets
  NAMESPACE entrokv::
  DESTINATION ${_entrokv_cmake_dir}
  COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/entrokvConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/entrokvConfig.cmake
  INSTALL_DESTINATION ${_entrokv_cmake_dir})
# 0.x: a minor release may change the client's API, so only the same minor version matches.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/entrokvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
    ${CMAKE_CURRENT_BINARY_DIR}/entrokvConfig.cmake
    ${CMAKE_CURRENT_BINARY_DIR}/entrokvConfigVersion.cmake
  DESTINATION ${_entrokv_cmake_dir}
  COMPONENT development)
