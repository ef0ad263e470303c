# The layer check (cmake/CheckLayers.cmake) on this tree, and on a fixture tree that breaks it (so
# the check is known to fail when it should).
add_test(NAME layer_check
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckLayers.cmake)
add_test(NAME layer_check_refuses_upward_includes
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/layers_bad
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckLayers.cmake)
set_tests_properties(layer_check_refuses_upward_includes PROPERTIES
  PASS_REGULAR_EXPRESSION
  "lib/cuda/upward.cc:2: lib/cuda may not include lib/nccl.*lib/store/upward.cc:2: lib/store may not include lib/core.*include/adaptcomm/leaky.h: a public header includes")
# The public-header rules cover the extension interface (include/adaptcomm/ext), and keep it out
# of what a trainer includes.
add_test(NAME layer_check_refuses_public_leaks
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/layers_bad
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckLayers.cmake)
set_tests_properties(layer_check_refuses_public_leaks PROPERTIES
  PASS_REGULAR_EXPRESSION
  "include/adaptcomm/ext/leaky_ext.h: a public header includes #include \"lib/core/executor/op_executor.h\".*include/adaptcomm/peeks.h: a trainer's header includes the extension interface #include \"adaptcomm/ext/backend.h\"")
# The runtime's folders (cmake/CheckCoreLayers.cmake), on the same fixture tree.
add_test(NAME layer_check_refuses_core_crossings
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/layers_bad
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckLayers.cmake)
set_tests_properties(layer_check_refuses_core_crossings PROPERTIES
  PASS_REGULAR_EXPRESSION
  "lib/core/communicator/picks_backend.cc:2: lib/core may not include lib/gloo.*lib/core/executor/upward.cc:2: lib/core/executor may not include lib/core/resilience.*lib/core/loose.cc: lib/core/ keeps its files in folders")
