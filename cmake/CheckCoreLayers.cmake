# The runtime's folders (lib/core/<folder>/, lib/core/README.md): the layer check one level down,
# included by cmake/CheckLayers.cmake, which gives SOURCE_DIR and collects `violations`. A folder
# may include its own headers and those of the folders listed for it, bottom to top:
#   elastic, selection          no other core folder
#   executor                    elastic
#   resilience                  elastic executor
#   tuning                      executor
#   communicator                every folder above
# Every runtime file lives in a folder: one directly in lib/core/ is refused.
set(core_may_elastic "elastic")
set(core_may_selection "selection")
set(core_may_executor "executor;elastic")
set(core_may_resilience "resilience;elastic;executor")
set(core_may_tuning "tuning;executor")
set(core_may_communicator "communicator;elastic;selection;executor;resilience;tuning")

file(GLOB_RECURSE core_files RELATIVE ${SOURCE_DIR}
     ${SOURCE_DIR}/lib/core/*.h ${SOURCE_DIR}/lib/core/*.cc ${SOURCE_DIR}/lib/core/*.cu)
foreach(file ${core_files})
  if(NOT file MATCHES "^lib/core/([a-z_]+)/[^/]+$")
    list(APPEND violations "${file}: lib/core/ keeps its files in folders by concern (lib/core/README.md): move it into one")
    continue()
  endif()
  set(folder "${CMAKE_MATCH_1}")
  if(NOT DEFINED core_may_${folder})
    list(APPEND violations "${file}: folder lib/core/${folder}/ is in no core layer (add it to cmake/CheckCoreLayers.cmake)")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^#include \"lib/core/")
  file(STRINGS ${SOURCE_DIR}/${file} all_lines)
  foreach(line ${lines})
    if(line MATCHES "^#include \"lib/core/([a-z_]+)/")
      set(target "${CMAKE_MATCH_1}")
    else()
      set(target "(no folder)")
    endif()
    if(NOT target IN_LIST core_may_${folder})
      list(FIND all_lines "${line}" index)
      math(EXPR line_no "${index} + 1")
      list(APPEND violations "${file}:${line_no}: lib/core/${folder} may not include lib/core/${target} (${line})")
    endif()
  endforeach()
endforeach()
