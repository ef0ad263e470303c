# tools_bench_test runs the built `adaptcomm` command: build it first.
if(TARGET tools_bench_test AND TARGET adaptcomm_cli)
  add_dependencies(tools_bench_test adaptcomm_cli)
endif()
