# NCCL tests: the fault-injecting fake NcclApi is a small library linked into every
# tests/nccl_*_test.cc binary (the library itself never contains it).
add_library(adaptcomm_fake_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/fake_nccl_api.cc)
target_link_libraries(adaptcomm_fake_nccl PUBLIC adaptcomm_internal absl::synchronization absl::strings)
target_include_directories(adaptcomm_fake_nccl PUBLIC ${PROJECT_SOURCE_DIR})
adaptcomm_warnings(adaptcomm_fake_nccl)

file(GLOB ADAPTCOMM_NCCL_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/nccl_*_test.cc)
foreach(src ${ADAPTCOMM_NCCL_TESTS})
  get_filename_component(name ${src} NAME_WE)
  if(TARGET ${name})
    target_link_libraries(${name} PRIVATE adaptcomm_fake_nccl)
  endif()
endforeach()
# Groups of ops run on every backend, NCCL's through the fake; the settings test counts the
# attempts made against the fake's failing communicators.
foreach(name groups_test settings_test)
  if(TARGET ${name})
    target_link_libraries(${name} PRIVATE adaptcomm_fake_nccl)
  endif()
endforeach()
