# install_consumer: install this build into a scratch prefix, move the prefix (an install must be
# relocatable) and use it as a trainer would (the installed configs, find_package + a 4-rank
# allreduce under `adaptcomm launch`, and pkg-config).
# Sanitizer builds are skipped: the consumer is built without the sanitizer runtime.
include(GNUInstallDirs)
if(ADAPTCOMM_SANITIZE STREQUAL "" AND TARGET adaptcomm_cli)
  add_test(NAME install_consumer
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/consumer/run_consumer_test.sh ${CMAKE_COMMAND}
                   ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR} ${CMAKE_CXX_COMPILER}
                   ${CMAKE_INSTALL_LIBDIR})
  set_tests_properties(install_consumer PROPERTIES LABELS install TIMEOUT 600)
endif()

# launch_test runs the `adaptcomm` tool: build it first, and skip the test when tools are off.
if(TARGET launch_test)
  if(TARGET adaptcomm_cli)
    add_dependencies(launch_test adaptcomm_cli)
    target_compile_definitions(launch_test PRIVATE ADAPTCOMM_HAVE_TOOL=1)
  endif()
  # The flight-record tests run the demo trainer as a real adaptcomm rank.
  if(TARGET adaptcomm_trainer)
    add_dependencies(launch_test adaptcomm_trainer)
    target_compile_definitions(launch_test PRIVATE ADAPTCOMM_HAVE_TRAINER=1)
  endif()
endif()
