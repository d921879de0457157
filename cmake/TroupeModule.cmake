# Compiler flags for troupe's own sources: every target created in this project (modules, tests,
# tools, bench; examples/ set theirs), not the targets of projects that embed or install troupe.
# Third-party headers come in as system headers (imported targets, or SYSTEM include folders), so
# their warnings stay silent; generated Cap'n Proto sources opt out in train/CMakeLists.txt.
# TROUPE_WERROR turns every warning into an error (COMPILE_WARNING_AS_ERROR: -Werror, and
# `-Werror all-warnings` for nvcc).
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra>")
set(CMAKE_COMPILE_WARNING_AS_ERROR ${TROUPE_WERROR})
# Deterministic numerics, the same in every module and in the tests that recompute their results:
# no fused multiply-add contraction, in host code and in device code (nvcc --fmad=false).
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-ffp-contract=off>"
  "$<$<COMPILE_LANGUAGE:CUDA>:--fmad=false;-Xcompiler=-ffp-contract=off>")

# troupe_module(<name> SOURCES ... DEPS ... [PRIVATE_DEPS ...])
#   One module = one library target `troupe_<name>`, alias and export name `troupe::<name>`,
#   public headers in <name>/include/troupe/<name>/.
function(troupe_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(troupe_${name} ${M_SOURCES})
  add_library(troupe::${name} ALIAS troupe_${name})
  set_target_properties(troupe_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME troupe_${name})
  target_include_directories(troupe_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(troupe_${name} PUBLIC ${M_DEPS} PRIVATE ${M_PRIVATE_DEPS})
  # Our public headers need C++17: consumers of the installed package get it too.
  target_compile_features(troupe_${name} PUBLIC cxx_std_17)
  set_property(GLOBAL APPEND PROPERTY TROUPE_INSTALLED_MODULES troupe_${name})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

# troupe_test(<target> LEVEL unit|integration|chaos|gpu MODULE <module> SOURCES ... [LIBS ...] [TIMEOUT s] [SERIAL])
#   A GoogleTest binary; each TEST is its own CTest test (gtest_discover_tests) carrying exactly
#   one level label and one module label, so `ctest -L '^runtime$'` selects precisely.
set(TROUPE_LEVELS unit integration chaos gpu)
set(TROUPE_MODULE_LABELS base runtime scheduler collectives model kernels train actors tools)
function(troupe_test target)
  # SERIAL: ctest runs the test alone (RUN_SERIAL), for tests that take the whole machine.
  cmake_parse_arguments(T "SERIAL" "LEVEL;MODULE;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LEVEL IN_LIST TROUPE_LEVELS)
    message(FATAL_ERROR "troupe_test(${target}): LEVEL must be one of ${TROUPE_LEVELS}, got '${T_LEVEL}'")
  endif()
  if(NOT T_MODULE IN_LIST TROUPE_MODULE_LABELS)
    message(FATAL_ERROR "troupe_test(${target}): MODULE must be one of ${TROUPE_MODULE_LABELS}, got '${T_MODULE}'")
  endif()
  if(TROUPE_TEST_MODULES AND NOT T_MODULE IN_LIST TROUPE_TEST_MODULES)
    return()  # e.g. the asan preset registers only the runtime's tests
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  find_package(GTest REQUIRED)
  include(GoogleTest)
  add_executable(${target} ${T_SOURCES})
  target_link_libraries(${target} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  gtest_discover_tests(${target}
    DISCOVERY_MODE PRE_TEST
    NO_PRETTY_VALUES
    PROPERTIES TIMEOUT ${T_TIMEOUT})
  # CMake 3.25 flattens list-valued PROPERTIES of gtest_discover_tests, so LABELS "a;b" cannot
  # pass through it: set them from a CTest include file that runs after the discovery script and
  # sees its test list.
  set(serial_property "")
  if(T_SERIAL)
    set(serial_property " RUN_SERIAL TRUE")
  endif()
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${labels_file}
    "if(${target}_TESTS)\n"
    "  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${T_LEVEL};${T_MODULE}\"${serial_property})\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
endfunction()
