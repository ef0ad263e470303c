# Warnings for adaptcomm's own targets (not for third-party headers, included as SYSTEM).
function(adaptcomm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(ADAPTCOMM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
    # GCC 12 at -O3 (Release) reports -Wrestrict on std::string assignments and appends inlined from
    # libstdc++ with impossible sizes (GCC bug 105651, fixed in 13): kept a warning, not an error.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE -Wno-error=restrict)
    endif()
  endif()
endfunction()
