# `cmake --install`: public headers, libadaptcomm.so and libadaptcomm_diag.so, the `adaptcomm`
# tool, a CMake package (adaptcomm::adaptcomm, adaptcomm::diag) and a pkg-config file, so a
# trainer needs only
#   find_package(adaptcomm CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE adaptcomm::adaptcomm)
# The package is relocatable: `cmake --install build --prefix DIR` works for any DIR.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ADAPTCOMM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/adaptcomm"
    CACHE STRING "Where adaptcommConfig.cmake goes, relative to the prefix")
set(ADAPTCOMM_INSTALL_CONFIGSDIR "${CMAKE_INSTALL_DATADIR}/adaptcomm/configs")

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/adaptcomm
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

# adaptcomm::diag (libadaptcomm_diag.so, adaptcomm/diagnose.h) is installed beside it: a trainer
# that runs the pre-flight checks itself links both.
install(TARGETS adaptcomm adaptcomm_diag_shared EXPORT adaptcommTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT adaptcommTargets
        NAMESPACE adaptcomm::
        FILE adaptcommTargets.cmake
        DESTINATION ${ADAPTCOMM_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/adaptcommConfig.cmake.in
  ${PROJECT_BINARY_DIR}/adaptcommConfig.cmake
  INSTALL_DESTINATION ${ADAPTCOMM_INSTALL_CMAKEDIR}
  PATH_VARS ADAPTCOMM_INSTALL_CONFIGSDIR)
# 0.x: a minor version may break the API.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/adaptcommConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/adaptcommConfig.cmake
              ${PROJECT_BINARY_DIR}/adaptcommConfigVersion.cmake
        DESTINATION ${ADAPTCOMM_INSTALL_CMAKEDIR})

# pkg-config: paths relative to the .pc file itself (${pcfiledir}) keep it relocatable.
set(ADAPTCOMM_PKGCONFIG_DIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ADAPTCOMM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ADAPTCOMM_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(ADAPTCOMM_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH ADAPTCOMM_PC_UP "/root/${ADAPTCOMM_PKGCONFIG_DIR}" "/root")
  string(REGEX REPLACE "/$" "" ADAPTCOMM_PC_UP "${ADAPTCOMM_PC_UP}")
  set(ADAPTCOMM_PC_PREFIX "\${pcfiledir}/${ADAPTCOMM_PC_UP}")
  set(ADAPTCOMM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ADAPTCOMM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/adaptcomm.pc.in ${PROJECT_BINARY_DIR}/adaptcomm.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/adaptcomm.pc DESTINATION ${ADAPTCOMM_PKGCONFIG_DIR})

# YAML profiles and templates (3B/7B/30B, size tiers) for `adaptcomm profile` and trainers.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${ADAPTCOMM_INSTALL_CONFIGSDIR})

# The demo trainer (examples/) finds the installed library through a path relative to itself, so
# it works wherever the prefix is installed or moved. The `adaptcomm` tool links the library's
# objects statically (adaptcomm_internal) and finds the installed configs from bin/ itself
# (lib/config/CMakeLists.txt).
file(RELATIVE_PATH ADAPTCOMM_BIN_TO_LIBDIR "${CMAKE_INSTALL_PREFIX}/bin"
     "${CMAKE_INSTALL_FULL_LIBDIR}")
foreach(program adaptcomm_trainer)
  if(TARGET ${program})
    set_target_properties(${program} PROPERTIES INSTALL_RPATH "$ORIGIN/${ADAPTCOMM_BIN_TO_LIBDIR}")
  endif()
endforeach()
