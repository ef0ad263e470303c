# Profile tests: compile-time source dir for the profile tests, the CLI check, and the libFuzzer
# target for the profile loader (built with clang only when clang++ is available).
foreach(t profile_units_test profile_registry_test profile_resolve_test profile_apply_test
          profile_consistency_test profile_golden_test)
  if(TARGET ${t})
    target_compile_definitions(${t} PRIVATE ADAPTCOMM_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  endif()
endforeach()
