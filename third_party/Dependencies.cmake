# Finds every external dependency. Two supported columns (docs/architecture.md s8):
# Debian 12 (CLI11 2.1, spdlog 1.10, yaml-cpp 0.7, Catch2 2.13) and Ubuntu 24.04
# (CLI11 2.4, spdlog 1.12, yaml-cpp 0.8, Catch2 3.4). Nothing is vendored.

# --- Python + libtorch ------------------------------------------------------
if(NOT LOONGFORGE_PYTHON)
  if(EXISTS "$ENV{HOME}/.cache/loongforge/venv/bin/python")
    set(LOONGFORGE_PYTHON "$ENV{HOME}/.cache/loongforge/venv/bin/python" CACHE FILEPATH "" FORCE)
  else()
    find_program(_py python3 REQUIRED)
    set(LOONGFORGE_PYTHON "${_py}" CACHE FILEPATH "" FORCE)
  endif()
endif()
execute_process(
  COMMAND ${LOONGFORGE_PYTHON} -c "import torch,sys; sys.stdout.write(torch.utils.cmake_prefix_path + ';' + str(int(torch.version.cuda is not None)))"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc ERROR_QUIET)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "LoongForge needs torch in ${LOONGFORGE_PYTHON}. Run scripts/setup.sh, "
                      "or pass -DLOONGFORGE_PYTHON=/path/to/python-with-torch.")
endif()
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 _torch_has_cuda)
list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")

# --- CUDA decision ------------------------------------------------------------
set(LOONGFORGE_WITH_CUDA OFF)
if(NOT LOONGFORGE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND _torch_has_cuda)
    set(LOONGFORGE_WITH_CUDA ON)
  elseif(LOONGFORGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOONGFORGE_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or a CUDA-enabled torch "
                        "(${LOONGFORGE_PYTHON}) was not found. Use -DLOONGFORGE_CUDA=AUTO or OFF.")
  endif()
endif()
if(LOONGFORGE_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${LOONGFORGE_CUDA_ARCHS})
  set(CMAKE_CUDA_STANDARD 17)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
else()
  # A CUDA build of torch still loads without a GPU; its CMake config only
  # needs to be told not to look for the toolkit when we build CPU-only.
  set(USE_CUDA OFF)
endif()

# Torch's CMake config prints a lot and probes CUDA on its own.
set(CAFFE2_USE_CUDNN OFF)
# TorchConfig appends its own -gencode list (down to sm_50, which CUDA 13
# rejects) to CMAKE_CUDA_FLAGS; our kernels use CMAKE_CUDA_ARCHITECTURES only.
set(_cuda_flags_before "${CMAKE_CUDA_FLAGS}")
find_package(Torch REQUIRED)
set(CMAKE_CUDA_FLAGS "${_cuda_flags_before}")
# ... and sets CMAKE_CUDA_ARCHITECTURES to OFF (it uses TORCH_CUDA_ARCH_LIST), which left
# our kernels built for nvcc's default architecture: set ours again.
if(LOONGFORGE_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${LOONGFORGE_CUDA_ARCHS})
endif()
# TorchConfig adds its flags globally (e.g. -D_GLIBCXX_USE_CXX11_ABI); keep them.
set(Torch_VERSION_STRING "${Torch_VERSION}")

# --- One C++ runtime: the shared libstdc++ that libtorch uses ------------------
# Note [One C++ runtime]: libtorch links the shared libstdc++. A binary of ours
# linked against a static copy defines its own __cxa_throw, and an exception it
# throws into libtorch's catch (an operator's TORCH_CHECK reaching Python) kills
# the process with SIGSEGV instead of raising: the GPU machine's compiler
# wrapper (/opt/gcc/bin/g++, -B a directory that holds libstdc++.a only) did
# this to libloongforge_ops.so (sessions 54-56, scripts/dev/gpu/op_throw_probe.py).
# So every link names the shared runtime before the compiler's own -lstdc++,
# and the test build_cxx_runtime checks that no binary of ours defines
# __cxa_throw.
foreach(_lf_name libstdc++.so libstdc++.so.6)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_lf_name}
                  OUTPUT_VARIABLE _lf_stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${_lf_stdcxx}" AND EXISTS "${_lf_stdcxx}")
    break()
  endif()
  unset(_lf_stdcxx)
endforeach()
if(NOT _lf_stdcxx)
  find_library(_lf_stdcxx NAMES libstdc++.so.6 PATHS /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64)
endif()
if(_lf_stdcxx)
  get_filename_component(LOONGFORGE_STDCXX "${_lf_stdcxx}" REALPATH)
  set(CMAKE_CXX_STANDARD_LIBRARIES "${CMAKE_CXX_STANDARD_LIBRARIES} \"${LOONGFORGE_STDCXX}\"")
  set(CMAKE_CUDA_STANDARD_LIBRARIES "${CMAKE_CUDA_STANDARD_LIBRARIES} \"${LOONGFORGE_STDCXX}\"")
  message(STATUS "C++ runtime: ${LOONGFORGE_STDCXX} (shared, as libtorch's; Note [One C++ runtime])")
else()
  message(WARNING "no shared libstdc++ found (${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so): the binaries "
                  "link whatever -lstdc++ resolves to; build_cxx_runtime fails if that is a static copy")
endif()

# --- Small C++ libraries ------------------------------------------------------
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
if(TARGET yaml-cpp::yaml-cpp)
  set(LOONGFORGE_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(LOONGFORGE_YAML_TARGET yaml-cpp)
endif()
if(TARGET CLI11::CLI11)
  set(LOONGFORGE_CLI11_TARGET CLI11::CLI11)
else()
  set(LOONGFORGE_CLI11_TARGET CLI11)
endif()

# --- OpenSSL (optional) -------------------------------------------------------
# libcrypto's SHA-256 (SHA-NI/AVX2 code paths) hashes checkpoint chunks several
# times faster than the built-in reference code (src/common/sha256.cpp), which
# is used where libssl-dev is absent; both give the same digests.
find_package(OpenSSL QUIET COMPONENTS Crypto)
if(OpenSSL_FOUND AND TARGET OpenSSL::Crypto)
  set(LOONGFORGE_WITH_OPENSSL ON)
else()
  set(LOONGFORGE_WITH_OPENSSL OFF)
  message(STATUS "LoongForge: OpenSSL's libcrypto not found (Debian/Ubuntu: libssl-dev): SHA-256 uses the built-in "
                 "code, which hashes checkpoints several times slower")
endif()

# --- zlib ---------------------------------------------------------------------
# CRC-32 of each chunk of a preemption save (Note [Preemption saves] in
# src/checkpoint/writer.cpp; Debian/Ubuntu: zlib1g-dev).
find_package(ZLIB REQUIRED)

# --- FFmpeg -----------------------------------------------------------------
# System FFmpeg through pkg-config, or a static prefix given as
# LOONGFORGE_FFMPEG_ROOT (scripts/dev/gpu/build_ffmpeg_static.sh, for machines
# without FFmpeg and without network).
set(LOONGFORGE_FFMPEG_ROOT "" CACHE PATH "Prefix of a static FFmpeg build (optional)")
set(LOONGFORGE_WITH_FFMPEG OFF)
if(LOONGFORGE_FFMPEG_ROOT)
  add_library(loongforge_ffmpeg INTERFACE)
  target_include_directories(loongforge_ffmpeg SYSTEM INTERFACE ${LOONGFORGE_FFMPEG_ROOT}/include)
  foreach(lib avformat avcodec swscale swresample avutil)  # static-link order: users first
    if(NOT EXISTS ${LOONGFORGE_FFMPEG_ROOT}/lib/lib${lib}.a)
      message(FATAL_ERROR "LOONGFORGE_FFMPEG_ROOT=${LOONGFORGE_FFMPEG_ROOT} lacks lib/lib${lib}.a "
                          "(build it with scripts/dev/gpu/build_ffmpeg_static.sh)")
    endif()
    target_link_libraries(loongforge_ffmpeg INTERFACE ${LOONGFORGE_FFMPEG_ROOT}/lib/lib${lib}.a)
  endforeach()
  # AV1 through libdav1d, built into the same prefix by the script (after
  # libavcodec, which uses it).
  if(NOT EXISTS ${LOONGFORGE_FFMPEG_ROOT}/lib/libdav1d.a)
    message(FATAL_ERROR "LOONGFORGE_FFMPEG_ROOT=${LOONGFORGE_FFMPEG_ROOT} lacks lib/libdav1d.a (AV1): "
                        "rebuild it with scripts/dev/gpu/build_ffmpeg_static.sh")
  endif()
  target_link_libraries(loongforge_ffmpeg INTERFACE ${LOONGFORGE_FFMPEG_ROOT}/lib/libdav1d.a)
  target_link_libraries(loongforge_ffmpeg INTERFACE m atomic dl Threads::Threads)
  add_library(PkgConfig::FFMPEG ALIAS loongforge_ffmpeg)
  set(LOONGFORGE_WITH_FFMPEG ON)
else()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(FFMPEG QUIET IMPORTED_TARGET libavformat libavcodec libswscale libswresample libavutil)
    if(FFMPEG_FOUND)
      set(LOONGFORGE_WITH_FFMPEG ON)
    endif()
  endif()
endif()

# --- Tests --------------------------------------------------------------------
if(LOONGFORGE_TESTS)
  find_package(Catch2 REQUIRED)
endif()
