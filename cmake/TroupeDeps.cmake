# Finds troupe's dependencies and defines imported targets where a package ships none.
# Used both by the build and by the installed troupeConfig.cmake.
find_package(Threads REQUIRED)
find_package(OpenSSL QUIET)

if(TROUPE_BLAS OR NOT DEFINED TROUPE_BLAS)
  find_path(TROUPE_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread)
  find_library(TROUPE_OPENBLAS_LIB NAMES openblas)
  set(TROUPE_OPENBLAS_SONAME "libopenblas.so.0" CACHE STRING "OpenBLAS library that kernels/ dlopens")
  if(TROUPE_CBLAS_INCLUDE AND TROUPE_OPENBLAS_LIB AND NOT TARGET troupe_deps::openblas)
    add_library(troupe_deps::openblas UNKNOWN IMPORTED)
    set_target_properties(troupe_deps::openblas PROPERTIES
      IMPORTED_LOCATION ${TROUPE_OPENBLAS_LIB}
      INTERFACE_INCLUDE_DIRECTORIES ${TROUPE_CBLAS_INCLUDE})
  endif()
endif()

if(TROUPE_MODEL_ONLY)
  return()
endif()

find_package(absl CONFIG REQUIRED)
# runtime/log.cc's logger (Debian's libspdlog-dev, compiled, with an external fmt).
find_package(spdlog CONFIG REQUIRED)

# CAF 0.17 ships neither a CMake config nor pkg-config (docs/STACK.md).
find_path(TROUPE_CAF_INCLUDE caf/config.hpp REQUIRED)
find_library(TROUPE_CAF_CORE caf_core REQUIRED)
find_library(TROUPE_CAF_IO caf_io REQUIRED)
find_library(TROUPE_CAF_OPENSSL caf_openssl REQUIRED)
find_package(OpenSSL REQUIRED)
if(NOT TARGET troupe_deps::caf_core)
  add_library(troupe_deps::caf_core SHARED IMPORTED)
  set_target_properties(troupe_deps::caf_core PROPERTIES
    IMPORTED_LOCATION ${TROUPE_CAF_CORE}
    INTERFACE_INCLUDE_DIRECTORIES ${TROUPE_CAF_INCLUDE}
    INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(troupe_deps::caf_io SHARED IMPORTED)
  set_target_properties(troupe_deps::caf_io PROPERTIES
    IMPORTED_LOCATION ${TROUPE_CAF_IO}
    INTERFACE_LINK_LIBRARIES troupe_deps::caf_core)
  if(TROUPE_CAF_OPENSSL)
    add_library(troupe_deps::caf_openssl SHARED IMPORTED)
    set_target_properties(troupe_deps::caf_openssl PROPERTIES
      IMPORTED_LOCATION ${TROUPE_CAF_OPENSSL}
      INTERFACE_LINK_LIBRARIES "troupe_deps::caf_io;OpenSSL::SSL;OpenSSL::Crypto")
  endif()
endif()

find_package(ucx CONFIG QUIET)

# Every HTTP client and server in troupe: cpp-httplib (Debian's libcpp-httplib-dev, compiled with
# OpenSSL, zlib and brotli). Its pkg-config file carries the CPPHTTPLIB_* definitions it was built
# with, which change its classes: a program must use exactly those. JSON: nlohmann-json3-dev.
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::httplib)
  pkg_check_modules(httplib REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
find_package(nlohmann_json CONFIG REQUIRED)

# Cap'n Proto's libraries, which troupe_train links privately (its generated code). A static
# troupe_train still puts them on its consumers' link line, so the installed package needs them
# too, but not Cap'n Proto's CMake package: that one checks for libatomic with the C compiler and
# fails in a project declared `LANGUAGES CXX`. Only the libraries are located here (no error when
# absent: only a program linking troupe::train needs them). The build itself finds the package in
# train/CMakeLists.txt, for its code generator.
# troupe_deps::<name>: an interface target linking the libraries `libs` (found by find_library;
# when one is missing, by plain name, so that the linker names what is missing) and `extra`.
function(troupe_link_only_libraries name libs extra)
  if(TARGET troupe_deps::${name})
    return()
  endif()
  set(found "")
  foreach(lib ${libs})
    find_library(TROUPE_${lib}_LIB ${lib})
    if(NOT TROUPE_${lib}_LIB)
      set(found ${libs})
      break()
    endif()
    list(APPEND found ${TROUPE_${lib}_LIB})
  endforeach()
  list(APPEND found ${extra})
  add_library(troupe_deps::${name} INTERFACE IMPORTED)
  set_target_properties(troupe_deps::${name} PROPERTIES INTERFACE_LINK_LIBRARIES "${found}")
endfunction()

troupe_link_only_libraries(capnp "capnp;kj" Threads::Threads)

# libnetfilter_queue (Debian's libnetfilter-queue-dev), which troupe_runtime links privately for
# `troupe relay` (latency on a host's links without netem). Located the same way as Cap'n Proto's.
troupe_link_only_libraries(netfilter_queue "netfilter_queue;nfnetlink" "")

# zstd (Debian's libzstd-dev), which troupe_train links privately: the parameter share's lossless
# delta encoding on slow links (train/param_delta.h).
troupe_link_only_libraries(zstd "zstd" "")

# SQLite (Debian's libsqlite3-dev), which troupe_runtime links privately: the head's store.
troupe_link_only_libraries(sqlite3 "sqlite3" "")
