# Profile tests: compile-time source dir for the profile tests, the CLI check, and the libFuzzer
# target for the profile loader (built with clang only when clang++ is available).
foreach(t profile_units_test profile_registry_test profile_resolve_test profile_apply_test
          profile_consistency_test profile_golden_test settings_test)
  if(TARGET ${t})
    target_compile_definitions(${t} PRIVATE ADAPTCOMM_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  endif()
endforeach()

# The command itself prints the report (the golden test covers its content).
if(TARGET adaptcomm_cli)
  add_test(NAME profile_cli_explain_70b
           COMMAND adaptcomm_cli profile explain --model 70B --world 64)
  set_tests_properties(profile_cli_explain_70b PROPERTIES
    ENVIRONMENT "ADAPTCOMM_CONFIG_DIR=${PROJECT_SOURCE_DIR}/configs"
    PASS_REGULAR_EXPRESSION "timeouts\\.collective +4200s +profiles\\.yaml:[0-9]+ x world scaling"
    TIMEOUT 60)
  add_test(NAME profile_cli_explain_json
           COMMAND adaptcomm_cli profile explain --model 235B --world 512 --json)
  set_tests_properties(profile_cli_explain_json PROPERTIES
    ENVIRONMENT "ADAPTCOMM_CONFIG_DIR=${PROJECT_SOURCE_DIR}/configs"
    PASS_REGULAR_EXPRESSION "\"key\": \"nccl\\.NCCL_MIN_CTAS\",[^}]*\"value\": \"4\""
    TIMEOUT 60)
  add_test(NAME profile_cli_strict_refuses_article
           COMMAND adaptcomm_cli profile explain --model 235B --strict
                   --file ${PROJECT_SOURCE_DIR}/configs/templates/article.yaml)
  set_tests_properties(profile_cli_strict_refuses_article PROPERTIES
    ENVIRONMENT "ADAPTCOMM_CONFIG_DIR=${PROJECT_SOURCE_DIR}/configs"
    PASS_REGULAR_EXPRESSION "strict profile mode .*refuses.*NCCL_IB_MTU" TIMEOUT 60)
endif()

# libFuzzer target for the loader: a short run in the suite, a long one under `fuzz_long`.
find_program(ADAPTCOMM_CLANGXX NAMES clang++-14 clang++)
if(ADAPTCOMM_CLANGXX)
  include(ExternalProject)
  set(fuzz_bin ${CMAKE_CURRENT_BINARY_DIR}/profile_fuzz-build)
  # A launcher is passed only when ccache exists: a fresh machine has none (issue #11 item 1).
  set(fuzz_launcher_arg "")
  if(ADAPTCOMM_CCACHE)
    set(fuzz_launcher "${ADAPTCOMM_CCACHE}")  # a found path here, never ...-NOTFOUND
    set(fuzz_launcher_arg -DCMAKE_CXX_COMPILER_LAUNCHER=${fuzz_launcher})
  endif()
  ExternalProject_Add(profile_fuzz
    SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz
    BINARY_DIR ${fuzz_bin}
    CMAKE_ARGS -DCMAKE_CXX_COMPILER=${ADAPTCOMM_CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo
               -DADAPTCOMM_SOURCE_DIR=${PROJECT_SOURCE_DIR}
               ${fuzz_launcher_arg}
    BUILD_ALWAYS ON
    INSTALL_COMMAND "")
  # New inputs go to a scratch directory (the first one), never into the seed corpus.
  set(fuzz_scratch ${CMAKE_CURRENT_BINARY_DIR}/profile_fuzz_scratch)
  file(MAKE_DIRECTORY ${fuzz_scratch})
  set(fuzz_seed ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus)
  add_test(NAME profile_loader_fuzz_short
           COMMAND ${fuzz_bin}/profile_loader_fuzz -runs=3000 -max_total_time=30 -timeout=10
                   -rss_limit_mb=2048 ${fuzz_scratch} ${fuzz_seed})
  set_tests_properties(profile_loader_fuzz_short PROPERTIES TIMEOUT 120
                       ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=off")
  add_test(NAME profile_loader_fuzz_long
           COMMAND ${fuzz_bin}/profile_loader_fuzz -max_total_time=600 -timeout=10
                   -rss_limit_mb=2048 ${fuzz_scratch} ${fuzz_seed})
  set_tests_properties(profile_loader_fuzz_long PROPERTIES TIMEOUT 700 LABELS fuzz_long
                       ENVIRONMENT "ADAPTCOMM_LOG_LEVEL=off")
else()
  message(STATUS "clang++ not found: the profile loader fuzzer is not built")
endif()
