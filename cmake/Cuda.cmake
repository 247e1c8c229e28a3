# Decides whether CUDA code is built. An impossible request (ON without a toolkit) is a
# configure-time error, never a silent fallback.
#
# With a toolkit, the CUDA language is enabled for runtime/'s one small .cu file (proxy
# kernels), compiled for sm_80 (A100) and sm_90 (H100/H200) only: nvcc is slow and CI has two
# cores. Everything else of the CUDA backend is C++ against the runtime, cuBLASLt and NCCL
# headers. base/, traces/, sim/ and analysis/ never see CUDA.
set(SHARDSCOPE_HAVE_CUDA OFF)
if(NOT SHARDSCOPE_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SHARDSCOPE_CUDA must be AUTO, ON or OFF, got '${SHARDSCOPE_CUDA}'")
endif()
if(NOT SHARDSCOPE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  find_package(CUDAToolkit QUIET)
  set(shardscope_cuda_missing "")
  if(NOT CUDAToolkit_FOUND)
    set(shardscope_cuda_missing "no CUDA toolkit was found (set CUDAToolkit_ROOT)")
  elseif(NOT CMAKE_CUDA_COMPILER)
    set(shardscope_cuda_missing "no nvcc was found (set CMAKE_CUDA_COMPILER)")
  else()
    # NCCL ships with the toolkit here (/usr/local/cuda) or as libnccl-dev; neither CMake nor
    # the toolkit provides a package for it.
    find_path(SHARDSCOPE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(SHARDSCOPE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NOT SHARDSCOPE_NCCL_INCLUDE_DIR OR NOT SHARDSCOPE_NCCL_LIBRARY)
      set(shardscope_cuda_missing "NCCL (nccl.h, libnccl) was not found next to the CUDA toolkit")
    elseif(NOT TARGET CUDA::cublasLt OR NOT TARGET CUDA::cudart)
      set(shardscope_cuda_missing "the toolkit has no cudart or cuBLASLt")
    elseif(NOT EXISTS ${CUDAToolkit_INCLUDE_DIRS}/nvtx3/nvToolsExt.h)
      set(shardscope_cuda_missing "the toolkit has no NVTX3 headers (include/nvtx3)")
    endif()
  endif()
  if(shardscope_cuda_missing STREQUAL "")
    set(SHARDSCOPE_HAVE_CUDA ON)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100 (sm_80) and H100/H200 (sm_90); fp8 GEMMs need sm_89+ and go through cuBLASLt,
      # whose own kernels cover every architecture it supports.
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    if(NOT CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    endif()
    enable_language(CUDA)
    add_library(shardscope_nccl UNKNOWN IMPORTED)
    set_target_properties(shardscope_nccl PROPERTIES IMPORTED_LOCATION ${SHARDSCOPE_NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${SHARDSCOPE_NCCL_INCLUDE_DIR})
  elseif(SHARDSCOPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDSCOPE_CUDA=ON but ${shardscope_cuda_missing}")
  endif()
endif()
message(STATUS "shardscope: CUDA backend ${SHARDSCOPE_HAVE_CUDA} (SHARDSCOPE_CUDA=${SHARDSCOPE_CUDA})")
