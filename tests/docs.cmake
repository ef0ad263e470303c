# docs_xref: every cross-reference in README.md, CONTRIBUTING.md and docs/*.md (Markdown links
# and their #anchors, backticked repository paths, `see "Heading"`, `see Heading)`) names a file
# and a heading that exist (tests/docs/check_xrefs.py). docs_xref_refuses_broken proves that it
# fails, naming each broken reference, on a fixture tree that breaks every rule. No build needed.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME docs_xref
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/docs/check_xrefs.py
                   ${PROJECT_SOURCE_DIR})
  add_test(NAME docs_xref_refuses_broken
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/docs/check_xrefs.py
                   ${CMAKE_CURRENT_LIST_DIR}/docs/fixtures_bad)
  set_tests_properties(docs_xref_refuses_broken PROPERTIES
    PASS_REGULAR_EXPRESSION
    "README.md:6: link to 'docs/missing.md'.*README.md:7: .*no heading with anchor '#no-such-heading'.*README.md:8: `src/absent.cc`.*README.md:9: see \"No Such Section\".*README.md:14: see Failures: .*docs/guide.md:5: .*leaves the repository.*6 broken")
else()
  add_test(NAME docs_xref COMMAND ${CMAKE_COMMAND} -E echo "docs_xref skipped: needs python3")
  set_tests_properties(docs_xref PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: needs python3")
endif()
set_tests_properties(docs_xref PROPERTIES TIMEOUT 30)
