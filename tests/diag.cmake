# Command-line checks of the diagnostics tools: exit codes and the named causes, as a CI job or an
# on-call engineer sees them.
if(TARGET adaptcomm_cli)
  set(_cli $<TARGET_FILE:adaptcomm_cli>)
  set(_logs ${CMAKE_CURRENT_LIST_DIR}/fixtures/logs)
  # doctor: exit 1 (failures found) and the IB root cause named with its peer.
  add_test(NAME diag_cli_doctor
           COMMAND sh -c "out=$(\"$0\" doctor --json \"$1\"); rc=$?; echo \"$out\"; [ $rc -eq 1 ] && echo \"$out\" | grep -q '\"id\": \"ib_retry_exceeded\"' && echo \"$out\" | grep -q '10.20.1.14:47185' && echo \"$out\" | grep -q '\"verdict\": \"known_failure\"'"
                   ${_cli} ${_logs}/ib_retry_exceeded.log)
  # doctor: error lines that no signature explains are an unknown failure, exit 3 (never 0, "all
  # clean"); a log with only healthy lines (NCCL INFO "dlerror"-style noise) exits 0.
  add_test(NAME diag_cli_doctor_unknown
           COMMAND sh -c "out=$(\"$0\" doctor \"$1\"); rc=$?; echo \"$out\"; [ $rc -eq 3 ] && echo \"$out\" | grep -q '2 error line(s) matched no known signature (1 of them NCCL WARN); first: .*socketFinalizeAccept' && \"$0\" doctor \"$2\""
                   ${_cli} ${_logs}/unknown_failure.log ${_logs}/clean_run.log)
  # doctor: a reworded IB event matches no signature but resembles the IB family: exit 4, and the
  # JSON names the family and its closest entry.
  add_test(NAME diag_cli_doctor_resembles
           COMMAND sh -c "out=$(\"$0\" doctor --json \"$1\"); rc=$?; echo \"$out\"; [ $rc -eq 4 ] && echo \"$out\" | grep -q '\"verdict\": \"resembles_known_family\"' && echo \"$out\" | grep -q '\"closest\": \"ib_async_event\"'"
                   ${_cli} ${_logs}/ib_event_reworded.log)
  # diagnose on this machine with a clean environment: no failure.
  add_test(NAME diag_cli_diagnose_clean
           COMMAND env -i PATH=/usr/bin:/bin ADAPTCOMM_CONFIG_DIR=${PROJECT_SOURCE_DIR}/configs
                   ${_cli} diagnose --multi-host no)
  # Planted problems: a dead NCCL variable and a missing interface both fail, each named.
  add_test(NAME diag_cli_diagnose_planted
           COMMAND sh -c "out=$(env NCCL_MAX_RINGS=8 NCCL_SOCKET_IFNAME=nosuchif0 \"$0\" diagnose --multi-host no 2>/dev/null); rc=$?; echo \"$out\"; [ $rc -eq 1 ] && echo \"$out\" | grep -q 'env.NCCL_MAX_RINGS  *FAIL' && echo \"$out\" | grep -q 'env.NCCL_SOCKET_IFNAME  *FAIL'"
                   ${_cli})
  # A stalled rank under the launcher is named by `diagnose --ranks`.
  add_test(NAME diag_cli_diagnose_ranks_stalled
           COMMAND sh -c "out=$(\"$0\" launch -n 4 -- \"$0\" diagnose --ranks --inject-delay 2:60 --multi-host no 2>&1); rc=$?; echo \"$out\"; [ $rc -ne 0 ] && echo \"$out\" | grep -q 'ranks.slow_rank  *FAIL   rank 2 arrives'"
                   ${_cli})
  set_tests_properties(diag_cli_doctor diag_cli_doctor_unknown diag_cli_doctor_resembles
                       diag_cli_diagnose_clean diag_cli_diagnose_planted
                       diag_cli_diagnose_ranks_stalled PROPERTIES TIMEOUT 120 LABELS diag
                       ENVIRONMENT "ADAPTCOMM_CONFIG_DIR=${PROJECT_SOURCE_DIR}/configs")
endif()
