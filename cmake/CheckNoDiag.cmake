# The no-diagnostics check (test export_check_no_diag, tests/exports.cmake): libadaptcomm.so
# defines none of the diagnostics (lib/diag, adaptcomm/diagnose.h), exported or hidden: they live
# in libadaptcomm_diag.so.
#   cmake -DNM=<nm> -DLIBRARY=<libadaptcomm.so> [-DWORK_DIR=<dir>] -P cmake/CheckNoDiag.cmake
cmake_minimum_required(VERSION 3.22)
if(NOT WORK_DIR)
  get_filename_component(WORK_DIR ${LIBRARY} DIRECTORY)
endif()
# The symbol tables go through files: file(STRINGS) filters line by line, far faster than a
# regular expression over the whole text of a library with debug information.
set(tables "")
foreach(args "-C" "-C;-D;--defined-only")  # a stripped library keeps only the dynamic table
  string(MD5 tag "${args}")
  set(table ${WORK_DIR}/no_diag_${tag}.txt)
  execute_process(COMMAND ${NM} ${args} ${LIBRARY} OUTPUT_FILE ${table} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "no-diag check: ${NM} ${args} ${LIBRARY} failed")
  endif()
  list(APPEND tables ${table})
endforeach()
set(found "")
foreach(table ${tables})
  file(STRINGS ${table} lines
       REGEX "adaptcomm::diag::|adaptcomm::(RunPreflightChecks|AnyFailed|CheckStatusName)\\(")
  list(APPEND found ${lines})
  file(REMOVE ${table})
endforeach()
if(found)
  list(REMOVE_DUPLICATES found)
  string(REPLACE ";" "\n  " text "${found}")
  message(FATAL_ERROR "libadaptcomm.so defines diagnostics (they belong to libadaptcomm_diag.so):\n  ${text}")
endif()
message(STATUS "no-diag check: libadaptcomm.so holds no diagnostics")
