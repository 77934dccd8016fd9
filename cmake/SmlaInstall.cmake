include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS smla EXPORT smlaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/smla DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT smlaTargets NAMESPACE smla:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/smla)
configure_package_config_file(cmake/smlaConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/smlaConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/smla)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/smlaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/smlaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/smlaConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/smla)
