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

# CAF 0.17 ships neither a CMake config nor pkg-config (STACK.md).
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

# Cap'n Proto's libraries, which troupe_actors links privately (its generated code). A static
# troupe_actors still puts them on its consumers' link line, so the installed package needs them
# too, but not Cap'n Proto's CMake package: that one checks for libatomic with the C compiler and
# fails in a project declared `LANGUAGES CXX`. Only the libraries are located here (no error when
# absent: only a program linking troupe::actors needs them). The build itself finds the package in
# actors/CMakeLists.txt, for its code generator.
if(NOT TARGET troupe_deps::capnp)
  find_library(TROUPE_CAPNP_LIB capnp)
  find_library(TROUPE_KJ_LIB kj)
  set(troupe_capnp_libs ${TROUPE_CAPNP_LIB} ${TROUPE_KJ_LIB})
  if(NOT TROUPE_CAPNP_LIB OR NOT TROUPE_KJ_LIB)
    set(troupe_capnp_libs capnp kj)  # the linker then names what is missing
  endif()
  add_library(troupe_deps::capnp INTERFACE IMPORTED)
  set_target_properties(troupe_deps::capnp PROPERTIES
    INTERFACE_LINK_LIBRARIES "${troupe_capnp_libs};Threads::Threads")
endif()

# libnetfilter_queue (Debian's libnetfilter-queue-dev), which troupe_runtime links privately for
# `troupe relay` (latency on a host's links without netem). Located the same way as Cap'n Proto's.
if(NOT TARGET troupe_deps::netfilter_queue)
  find_library(TROUPE_NFQ_LIB netfilter_queue)
  find_library(TROUPE_NFNETLINK_LIB nfnetlink)
  set(troupe_nfq_libs ${TROUPE_NFQ_LIB} ${TROUPE_NFNETLINK_LIB})
  if(NOT TROUPE_NFQ_LIB OR NOT TROUPE_NFNETLINK_LIB)
    set(troupe_nfq_libs netfilter_queue nfnetlink)  # the linker then names what is missing
  endif()
  add_library(troupe_deps::netfilter_queue INTERFACE IMPORTED)
  set_target_properties(troupe_deps::netfilter_queue PROPERTIES
    INTERFACE_LINK_LIBRARIES "${troupe_nfq_libs}")
endif()
