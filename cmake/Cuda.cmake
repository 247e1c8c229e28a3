# Decides whether CUDA code is built. An impossible request (ON without a toolkit) is a
# configure-time error, never a silent fallback.
#
# The CUDA backend needs only headers at build time (the CUDA runtime, cuBLASLt, NCCL, NVTX3,
# CUPTI) and nvcc for its one small .cu file (proxy kernels, compiled into an embedded fatbin
# for sm_80 (A100) and sm_90 (H100/H200) only: nvcc is slow and CI has two cores). Nothing of
# the CUDA stack is linked: runtime/ and profiler/ open the libraries with dlopen when
# `run --backend cuda` (or --profile) needs them, so the binary runs on a machine without them.
# base/, traces/, sim/ and analysis/ never see CUDA.
set(SHARDSCOPE_HAVE_CUDA OFF)
if(NOT SHARDSCOPE_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SHARDSCOPE_CUDA must be AUTO, ON or OFF, got '${SHARDSCOPE_CUDA}'")
endif()
if(NOT SHARDSCOPE_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  set(shardscope_cuda_missing "")
  if(NOT CUDAToolkit_FOUND)
    set(shardscope_cuda_missing "no CUDA toolkit was found (set CUDAToolkit_ROOT)")
  elseif(NOT CUDAToolkit_NVCC_EXECUTABLE)
    set(shardscope_cuda_missing "the toolkit has no nvcc")
  else()
    # NCCL ships with the toolkit here (/usr/local/cuda) or as libnccl-dev; neither CMake nor
    # the toolkit provides a package for it. Only its header is needed to build.
    find_path(SHARDSCOPE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT SHARDSCOPE_NCCL_INCLUDE_DIR)
      set(shardscope_cuda_missing "NCCL's header (nccl.h) was not found next to the CUDA toolkit")
    elseif(NOT EXISTS ${CUDAToolkit_INCLUDE_DIRS}/cuda_runtime.h OR NOT EXISTS ${CUDAToolkit_INCLUDE_DIRS}/cublasLt.h)
      set(shardscope_cuda_missing "the toolkit has no cuda_runtime.h or cublasLt.h")
    elseif(NOT EXISTS ${CUDAToolkit_INCLUDE_DIRS}/nvtx3/nvToolsExt.h)
      set(shardscope_cuda_missing "the toolkit has no NVTX3 headers (include/nvtx3)")
    elseif(CUDAToolkit_VERSION_MAJOR LESS 12)
      # cudaLibraryLoadData (the proxy kernels' loading) is CUDA 12.0's.
      set(shardscope_cuda_missing "the toolkit is CUDA ${CUDAToolkit_VERSION}; the backend needs CUDA 12 or newer")
    endif()
  endif()
  if(shardscope_cuda_missing STREQUAL "")
    set(SHARDSCOPE_HAVE_CUDA ON)
    # A100 (sm_80) and H100/H200 (sm_90), plus PTX of the last for newer GPUs; fp8 GEMMs need
    # sm_89+ and go through cuBLASLt, whose own kernels cover every architecture it supports.
    set(SHARDSCOPE_CUDA_ARCHITECTURES "80;90" CACHE STRING "SM architectures of the proxy kernels' fatbin")
  elseif(SHARDSCOPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDSCOPE_CUDA=ON but ${shardscope_cuda_missing}")
  endif()
endif()
message(STATUS "shardscope: CUDA backend ${SHARDSCOPE_HAVE_CUDA} (SHARDSCOPE_CUDA=${SHARDSCOPE_CUDA})")
