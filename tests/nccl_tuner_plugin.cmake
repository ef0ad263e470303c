# The NCCL tuner plugin (plugins/nccl_tuner), where it is built: tests/nccl_tuner_plugin_test.cc
# dlopen()s the built .so (without it the test skips), and the export check proves the plugin
# exports only its interface structs (and fails on a list that leaks).
if(TARGET adaptcomm-nccl-tuner AND TARGET nccl_tuner_plugin_test)
  target_compile_definitions(nccl_tuner_plugin_test PRIVATE
    ADAPTCOMM_NCCL_TUNER_PLUGIN="$<TARGET_FILE:adaptcomm-nccl-tuner>")
  add_dependencies(nccl_tuner_plugin_test adaptcomm-nccl-tuner)
  find_program(ADAPTCOMM_NM NAMES ${CMAKE_NM} nm)
  set(_check ${PROJECT_SOURCE_DIR}/plugins/nccl_tuner/CheckPluginExports.cmake)
  add_test(NAME nccl_tuner_exports
           COMMAND ${CMAKE_COMMAND} -DNM=${ADAPTCOMM_NM}
                   -DLIBRARY=$<TARGET_FILE:adaptcomm-nccl-tuner> -P ${_check})
  add_test(NAME nccl_tuner_exports_refuses_leaks
           COMMAND ${CMAKE_COMMAND}
                   -DSYMBOLS=${CMAKE_CURRENT_LIST_DIR}/fixtures/tuned/leaky_exports.txt
                   -P ${_check})
  set_tests_properties(nccl_tuner_exports nccl_tuner_exports_refuses_leaks PROPERTIES
                       LABELS exports TIMEOUT 60)
  set_tests_properties(nccl_tuner_exports_refuses_leaks PROPERTIES PASS_REGULAR_EXPRESSION
    "exports 1 symbol\\(s\\) besides the plugin structs:.*_ZN9adaptcomm6config15ParseTunedTable.*missing: ncclTunerPlugin_v2")
endif()
