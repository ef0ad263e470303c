# The export check (cmake/CheckExports.cmake): libadaptcomm.so exports the public API and nothing
# else, and every public declaration the library defines is exported. It runs on this build, and
# on a fixture symbol list that breaks both rules (so the check is known to fail when it should).
find_program(ADAPTCOMM_NM NAMES ${CMAKE_NM} nm)
add_test(NAME export_check
         COMMAND ${CMAKE_COMMAND} -DNM=${ADAPTCOMM_NM} -DLIBRARY=$<TARGET_FILE:adaptcomm>
                 -DARCHIVE=$<TARGET_FILE:adaptcomm_internal>
                 -DHEADERS=${PROJECT_SOURCE_DIR}/include/adaptcomm
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckExports.cmake)
# The diagnostics library (lib/CMakeLists.txt): the same rules over its own objects.
add_test(NAME export_check_diag
         COMMAND ${CMAKE_COMMAND} -DNM=${ADAPTCOMM_NM} -DLIBRARY=$<TARGET_FILE:adaptcomm_diag_shared>
                 -DARCHIVE=$<TARGET_FILE:adaptcomm_diag_internal>
                 -DHEADERS=${PROJECT_SOURCE_DIR}/include/adaptcomm
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckExports.cmake)
# libadaptcomm.so holds no diagnostics: a trainer that links it alone gets none of their code.
add_test(NAME export_check_no_diag
         COMMAND ${CMAKE_COMMAND} -DNM=${ADAPTCOMM_NM} -DLIBRARY=$<TARGET_FILE:adaptcomm>
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/CheckNoDiag.cmake)
set_tests_properties(export_check_diag export_check_no_diag PROPERTIES LABELS exports TIMEOUT 120)
set(_fixtures ${CMAKE_CURRENT_LIST_DIR}/fixtures/exports)
add_test(NAME export_check_refuses_leaks
         COMMAND ${CMAKE_COMMAND} -DEXPORTED=${_fixtures}/exported.txt
                 -DDEFINED=${_fixtures}/defined.txt
                 -DHEADERS=${PROJECT_SOURCE_DIR}/include/adaptcomm
                 -P ${PROJECT_SOURCE_DIR}/cmake/CheckExports.cmake)
set_tests_properties(export_check export_check_refuses_leaks PROPERTIES LABELS exports TIMEOUT 120)
set_tests_properties(export_check_refuses_leaks PROPERTIES PASS_REGULAR_EXPRESSION
  "8 exported symbol\\(s\\) outside the public API:\n  adaptcomm::internal::OpExecutor::Submit.*\n  adaptcomm::log::Emit.*\n  typeinfo for adaptcomm::nccl::NcclBackend\n  gloo::Context::~Context\\(\\)\n  YAML::Node::~Node\\(\\)\n  absl::.*\n  nlohmann::.*\n  std::vector<int, std::allocator<int> >::operator\\[\\]\\(unsigned long\\)\n1 public API symbol\\(s\\) not exported [^\n]*\n  adaptcomm::Communicator::size\\(\\) const\n")
