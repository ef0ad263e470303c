# Warnings for adaptcomm's own targets (not for third-party headers, included as SYSTEM).
function(adaptcomm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(ADAPTCOMM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
