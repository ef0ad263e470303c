# Checks the README's two set-up commands (run by tests/readme.cmake):
#   1. the demo command builds only the targets of the programs it then runs (`--target ...`; a
#      plain `cmake --build build` builds every test and bench first, minutes more on 2 cores);
#   2. the test command is, verbatim, the one CI runs (.ci/run).
# Usage: cmake -DREADME=... -DCI_RUN=... -DBINARY_DIR=... -DPROGRAMS=target=file,... -P this
cmake_minimum_required(VERSION 3.22)
foreach(var README CI_RUN BINARY_DIR PROGRAMS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_commands.cmake needs -D${var}=...")
  endif()
endforeach()

file(READ "${README}" readme)
string(REGEX MATCHALL "\n```\n[^`\n]+\n```" blocks "${readme}")
list(LENGTH blocks block_count)
if(block_count LESS 2)
  message(FATAL_ERROR "README: expected the demo and test commands as its first one-line blocks")
endif()
list(GET blocks 0 demo)
list(GET blocks 1 test_command)
string(REGEX REPLACE "\n?```\n?" "" demo "${demo}")
string(REGEX REPLACE "\n?```\n?" "" test_command "${test_command}")

# --- 1. the demo builds only what it runs ---
# target name -> its program's path relative to the build dir (README writes it under build/).
string(REPLACE "," ";" programs "${PROGRAMS}")
set(known_targets "")
foreach(entry ${programs})
  string(REGEX MATCH "^([^=]+)=(.+)$" ignored "${entry}")
  file(RELATIVE_PATH relative "${BINARY_DIR}" "${CMAKE_MATCH_2}")
  set(file_of_${CMAKE_MATCH_1} "${relative}")
  list(APPEND known_targets ${CMAKE_MATCH_1})
endforeach()

if(NOT demo MATCHES "cmake --build build( -j[0-9]+)? --target ([^&]+)&&(.*)$")
  message(FATAL_ERROR "README demo command builds every target (no --target): ${demo}")
endif()
string(STRIP "${CMAKE_MATCH_2}" built_targets)
set(after_build "${CMAKE_MATCH_3}")
separate_arguments(built_targets UNIX_COMMAND "${built_targets}")
set(built_files "")
foreach(target ${built_targets})
  if(NOT target IN_LIST known_targets)
    message(FATAL_ERROR "README demo command builds '${target}', not one of: ${known_targets}")
  endif()
  list(APPEND built_files "${file_of_${target}}")
endforeach()
string(REGEX MATCHALL "(^| )build/[^ ]+" run_programs "${after_build}")
if(NOT run_programs)
  message(FATAL_ERROR "README demo command runs no program from build/: ${demo}")
endif()
foreach(program ${run_programs})
  string(REGEX REPLACE "^ ?build/" "" program "${program}")
  if(NOT program IN_LIST built_files)
    message(FATAL_ERROR "README demo command runs build/${program}, which its --target list "
                        "(${built_targets}) does not build")
  endif()
endforeach()

# --- 2. the test command is CI's, verbatim ---
file(STRINGS "${CI_RUN}" ci_lines REGEX "^scripts/install-deps.sh")
if(NOT ci_lines STREQUAL test_command)
  message(FATAL_ERROR "README test command differs from .ci/run:\n  README: ${test_command}\n"
                      "  CI:     ${ci_lines}")
endif()
message(STATUS "README commands ok: the demo builds ${built_targets}")
