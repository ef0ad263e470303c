# tools_bench_test, tools_cli_test and tune_test run the built `adaptcomm` command: build it first.
foreach(cli_test tools_bench_test tools_cli_test tune_test)
  if(TARGET ${cli_test} AND TARGET adaptcomm_cli)
    add_dependencies(${cli_test} adaptcomm_cli)
  endif()
endforeach()
