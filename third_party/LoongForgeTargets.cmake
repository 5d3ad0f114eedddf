# Helpers that make every room look the same:
#   loongforge_room(<room> SOURCES ... DEPS ... [TORCH])
# creates the library loongforge_<room> with our warning set, the public
# include/ directory, and (with TORCH) libtorch plus the shared precompiled header.

set(LOONGFORGE_WARNINGS -Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor)
if(LOONGFORGE_WERROR)
  list(APPEND LOONGFORGE_WARNINGS -Werror)
endif()

# One precompiled header shared by every libtorch user (see src/common/pch_torch.hpp).
set(LOONGFORGE_TORCH_PCH_TARGET "")

function(loongforge_apply_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${LOONGFORGE_WARNINGS}>)
endfunction()

function(loongforge_use_torch target)
  target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES})
  # libtorch's include dirs are third-party: mark them SYSTEM so -Werror only
  # applies to our code.
  target_include_directories(${target} SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  if(LOONGFORGE_PCH)
    get_property(_pch GLOBAL PROPERTY LOONGFORGE_TORCH_PCH_TARGET)
    if(NOT _pch)
      set_property(GLOBAL PROPERTY LOONGFORGE_TORCH_PCH_TARGET ${target})
      target_precompile_headers(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:${PROJECT_SOURCE_DIR}/src/common/pch_torch.hpp>)
    else()
      target_precompile_headers(${target} REUSE_FROM ${_pch})
    endif()
  endif()
endfunction()

function(loongforge_room room)
  cmake_parse_arguments(R "TORCH" "" "SOURCES;DEPS;PUBLIC_DEPS" ${ARGN})
  set(target loongforge_${room})
  if(R_SOURCES)
    add_library(${target} STATIC ${R_SOURCES})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(${target} PUBLIC ${R_PUBLIC_DEPS} PRIVATE ${R_DEPS})
    loongforge_apply_warnings(${target})
    if(R_TORCH)
      loongforge_use_torch(${target})
      # Users of a torch room see torch too (its headers name torch types).
      target_link_libraries(${target} INTERFACE ${TORCH_LIBRARIES})
      target_include_directories(${target} SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
    endif()
  else()
    # A room whose issue has not landed: its contract header exists, no code yet.
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(${target} INTERFACE ${R_PUBLIC_DEPS} ${R_DEPS})
  endif()
  add_library(loongforge::${room} ALIAS ${target})
endfunction()
