# The export check (README "Architecture"): libadaptcomm.so exports the public API of
# include/adaptcomm (ext/ included) and nothing else; so does libadaptcomm_diag.so, for its own
# objects. Run by ctest (tests/exports.cmake) as
#   cmake -DNM=<nm> -DLIBRARY=<libadaptcomm.so> -DARCHIVE=<libadaptcomm_internal.a>
#         -DHEADERS=<include/adaptcomm> -P cmake/CheckExports.cmake
# (or with -DEXPORTED=<file> -DDEFINED=<file> holding `nm -C` output instead of the two binaries,
# as the fixture test does). Exits non-zero listing each offending symbol:
#   1. every exported symbol must belong to the public API: a name in namespace adaptcomm, not in
#      one of its lower-case sub-namespaces (internal, nccl, config, diag, log, trace, shm, hier,
#      ...). Anything else (gloo::, YAML::, nlohmann::, absl::, std:: instantiations, the CUDA
#      runtime) is a leak. TSan builds also export the __wrap_ functions of
#      lib/base/tsan_absl_wrap.cc.
#   2. every function or object that the library defines for a class or function declared in a
#      public header (a name of include/adaptcomm directly in namespace adaptcomm) must be
#      exported: a declaration without ADAPTCOMM_EXPORT (include/adaptcomm/export.h) fails here
#      rather than at a trainer's link.
cmake_minimum_required(VERSION 3.22)

function(read_symbols out binary file nm_args)
  if(file)
    file(READ ${file} text)
  else()
    execute_process(COMMAND ${NM} ${nm_args} ${binary} OUTPUT_VARIABLE text
                    RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "export check: ${NM} ${nm_args} ${binary} failed: ${err}")
    endif()
  endif()
  # Square brackets (operator[], array types) would stop CMake's list splitting.
  string(REPLACE "[" "<LB>" text "${text}")
  string(REPLACE "]" "<RB>" text "${text}")
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

# "vtable for adaptcomm::Backend" -> "adaptcomm::Backend"
function(entity_of out name)
  string(REGEX REPLACE "^(vtable for |typeinfo for |typeinfo name for |VTT for |guard variable for |non-virtual thunk to |virtual thunk to |covariant return thunk to |construction vtable for )+" "" name "${name}")
  set(${out} "${name}" PARENT_SCOPE)
endfunction()

if((NOT LIBRARY AND NOT EXPORTED) OR (NOT ARCHIVE AND NOT DEFINED) OR NOT HEADERS)
  message(FATAL_ERROR "usage: cmake -DNM=<nm> -DLIBRARY=<.so>|-DEXPORTED=<file> "
                      "-DARCHIVE=<.a>|-DDEFINED=<file> -DHEADERS=<include/adaptcomm> "
                      "-P CheckExports.cmake")
endif()

read_symbols(exported_lines "${LIBRARY}" "${EXPORTED}" "-D;--defined-only;-C")
set(exported "")
set(leaks "")
foreach(line ${exported_lines})
  if(NOT line MATCHES "^[0-9a-fA-F]* *[A-Za-z] (.+)$")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  list(APPEND exported "${name}")
  entity_of(entity "${name}")
  if(entity MATCHES "^adaptcomm::[a-z_][a-z0-9_]*::" OR NOT entity MATCHES "^(adaptcomm::|__wrap_)")
    list(APPEND leaks "${name}")
  endif()
endforeach()

# Names that the public headers declare as classes, structs or functions.
file(GLOB_RECURSE headers ${HEADERS}/*.h)
set(public_names "")
foreach(header ${headers})
  file(READ ${header} text)
  # A friend declaration names an internal type (HookHandle's MixedOpRunner), not a public one.
  string(REGEX REPLACE "friend +(class|struct) +[A-Za-z0-9_]+" "" text "${text}")
  string(REGEX MATCHALL "(class|struct)( +(ADAPTCOMM_EXPORT|\\[\\[[a-z_]+\\]\\]))* +[A-Z][A-Za-z0-9_]*"
         decls "${text}")
  string(REGEX MATCHALL "[A-Z][A-Za-z0-9_]*\\(" calls "${text}")
  foreach(decl ${decls} ${calls})
    string(REGEX MATCH "[A-Z][A-Za-z0-9_]*\\(?$" name "${decl}")
    string(REPLACE "(" "" name "${name}")
    list(APPEND public_names "${name}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES public_names)

read_symbols(defined_lines "${ARCHIVE}" "${DEFINED}" "--defined-only;-C")
set(hidden "")
foreach(line ${defined_lines})
  # Strong definitions only (T text, D/B data, R read-only): inline code is every user's own.
  if(NOT line MATCHES "^[0-9a-fA-F]* *[TDBR] (adaptcomm::([A-Z][A-Za-z0-9_]*).*)$")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  if(CMAKE_MATCH_2 IN_LIST public_names AND NOT name IN_LIST exported)
    list(APPEND hidden "${name}")
  endif()
endforeach()
list(REMOVE_DUPLICATES hidden)

set(report "")
if(leaks)
  list(LENGTH leaks n)
  string(REPLACE ";" "\n  " text "${leaks}")
  string(APPEND report "${n} exported symbol(s) outside the public API:\n  ${text}\n")
endif()
if(hidden)
  list(LENGTH hidden n)
  string(REPLACE ";" "\n  " text "${hidden}")
  string(APPEND report "${n} public API symbol(s) not exported (mark the declaration "
                       "ADAPTCOMM_EXPORT, include/adaptcomm/export.h):\n  ${text}\n")
endif()
if(report)
  string(REPLACE "<LB>" "[" report "${report}")
  string(REPLACE "<RB>" "]" report "${report}")
  message("${report}")
  message(FATAL_ERROR "export check: libadaptcomm.so's export table is not the public API")
endif()
list(LENGTH exported n)
message(STATUS "export check: ${n} exported symbols, all of the public API")
