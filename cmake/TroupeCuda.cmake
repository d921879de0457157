# TROUPE_CUDA=AUTO|ON|OFF -> TROUPE_HAVE_CUDA. Must run before any target uses CUDA.
set(TROUPE_HAVE_CUDA OFF)
if(TROUPE_CUDA STREQUAL "AUTO")
  if(EXISTS /usr/local/cuda/bin/nvcc)
    set(TROUPE_HAVE_CUDA ON)
  endif()
elseif(TROUPE_CUDA)
  set(TROUPE_HAVE_CUDA ON)
endif()
if(TROUPE_HAVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # sm_80 and sm_90 SASS plus compute_90 PTX for newer GPUs (docs/STACK.md: `native` fails without a GPU).
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  find_package(CUDAToolkit REQUIRED)
endif()
# nvcc's options for troupe's own kernels (kernels/cuda, model/cuda): a kernel that spills
# registers or uses local memory fails the build whatever TROUPE_WERROR says; --resource-usage
# puts each kernel's registers and shared memory in the build log.
set(TROUPE_NVCC_STRICT
  "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xptxas=-warn-spills,-warn-lmem-usage;--resource-usage>")
message(STATUS "troupe: CUDA backend ${TROUPE_HAVE_CUDA} (TROUPE_CUDA=${TROUPE_CUDA})")
