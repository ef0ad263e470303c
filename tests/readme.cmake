# readme_commands: the README's demo command builds only the programs it runs, and its test
# command is the one CI runs (tests/readme/check_commands.cmake).
if(TARGET adaptcomm_cli AND TARGET adaptcomm_trainer)
  # The programs the demo may build, as target=file (the files are what the README runs).
  set(readme_programs "adaptcomm_cli=$<TARGET_FILE:adaptcomm_cli>")
  string(APPEND readme_programs ",adaptcomm_trainer=$<TARGET_FILE:adaptcomm_trainer>")
  add_test(NAME readme_commands
           COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md
                   -DCI_RUN=${PROJECT_SOURCE_DIR}/.ci/run -DBINARY_DIR=${PROJECT_BINARY_DIR}
                   -DPROGRAMS=${readme_programs}
                   -P ${CMAKE_CURRENT_LIST_DIR}/readme/check_commands.cmake)
  set_tests_properties(readme_commands PROPERTIES TIMEOUT 30)
endif()
