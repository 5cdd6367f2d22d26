# Finds LibTorch inside the installed torch wheel and defines two imported targets:
#   remat::torch_cpu   libtorch_cpu + libc10 and the wheel's headers (everything the CPU integration needs)
#   remat::torch_cuda  libc10_cuda + libtorch_cuda (the CUDA allocator only)
#
# Why not find_package(Torch): the wheel's TorchConfig.cmake on a CUDA build insists on the full CUDA
# libraries (nvrtc, cuDNN, ...) that a machine without a GPU does not have, and it links every consumer against
# libtorch_cuda. We need neither, so we locate the same files the config would and link only what we use.
# Pass the wheel's prefix as CMake expects: -DCMAKE_PREFIX_PATH=$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')

find_path(REMAT_TORCH_CMAKE_DIR Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH} NO_DEFAULT_PATH)
if(NOT REMAT_TORCH_CMAKE_DIR)
  message(STATUS "remat: LibTorch not found on CMAKE_PREFIX_PATH; the PyTorch integration is skipped")
  return()
endif()
get_filename_component(REMAT_TORCH_ROOT "${REMAT_TORCH_CMAKE_DIR}/../.." ABSOLUTE)

find_library(REMAT_TORCH_CPU_LIB torch_cpu PATHS "${REMAT_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
find_library(REMAT_C10_LIB c10 PATHS "${REMAT_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)

add_library(remat_torch_cpu INTERFACE)
target_include_directories(remat_torch_cpu SYSTEM INTERFACE
  "${REMAT_TORCH_ROOT}/include" "${REMAT_TORCH_ROOT}/include/torch/csrc/api/include")
target_link_libraries(remat_torch_cpu INTERFACE "${REMAT_TORCH_CPU_LIB}" "${REMAT_C10_LIB}")
# The wheel is built with the C++11 ABI (torch._C._GLIBCXX_USE_CXX11_ABI is True since torch 2.7).
target_compile_definitions(remat_torch_cpu INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
add_library(remat::torch_cpu ALIAS remat_torch_cpu)

find_library(REMAT_C10_CUDA_LIB c10_cuda PATHS "${REMAT_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
find_library(REMAT_TORCH_CUDA_LIB torch_cuda PATHS "${REMAT_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
if(REMAT_C10_CUDA_LIB AND REMAT_TORCH_CUDA_LIB)
  add_library(remat_torch_cuda INTERFACE)
  target_link_libraries(remat_torch_cuda INTERFACE remat_torch_cpu "${REMAT_C10_CUDA_LIB}" "${REMAT_TORCH_CUDA_LIB}")
  add_library(remat::torch_cuda ALIAS remat_torch_cuda)
endif()

set(REMAT_HAVE_TORCH ON)
message(STATUS "remat: LibTorch at ${REMAT_TORCH_ROOT}")
