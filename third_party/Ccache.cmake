# Compiler caching: ccache when present. Precompiled headers need the pch
# sloppiness settings or ccache refuses to cache their users.
find_program(LOONGFORGE_CCACHE ccache)
if(LOONGFORGE_CCACHE)
  set(_launcher ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${LOONGFORGE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_launcher})
endif()
