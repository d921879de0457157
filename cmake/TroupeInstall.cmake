# `cmake --install` produces a package: find_package(troupe CONFIG REQUIRED) -> troupe::runtime, ...
include(CMakePackageConfigHelpers)
get_property(troupe_targets GLOBAL PROPERTY TROUPE_INSTALLED_MODULES)
if(NOT troupe_targets)
  return()
endif()
install(TARGETS ${troupe_targets} EXPORT troupeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set(troupe_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${troupe_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/troupeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${troupe_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/TroupeDeps.cmake
  DESTINATION ${troupe_cmake_dir})
