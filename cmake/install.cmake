# `cmake --install build --prefix P`: the engine's headers under P/include/tapestry/, the library,
# the CMake package (find_package(tapestry) gives tapestry::tapestry) and tapestry.pc for
# pkg-config. Both are relocatable: they find the prefix from where they are installed.
include(CMakePackageConfigHelpers)

# Only the public headers: the engine's folders without their internals (ops/detail/: the kernel
# entries, backends' shared rules and math; ops/cpu/ and ops/cuda/: the backends), which no public
# header includes (tools/check-layers.py checks it).
foreach(part ops autograd nn data optim models dist)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${part}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tapestry/${part}
          FILES_MATCHING PATTERN "*.h" PATTERN "detail" EXCLUDE PATTERN "cpu" EXCLUDE PATTERN "cuda" EXCLUDE)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/tapestry.h ${PROJECT_BINARY_DIR}/include/tapestry/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tapestry)
install(TARGETS tapestry EXPORT tapestryTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The dist component has an export set of its own, loaded only when asked for, so that only its
# users need MPI (and NCCL) found.
install(TARGETS tapestry_dist EXPORT tapestryDistTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(TAPESTRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tapestry)
install(EXPORT tapestryTargets NAMESPACE tapestry:: DESTINATION ${TAPESTRY_CMAKE_DIR})
install(EXPORT tapestryDistTargets NAMESPACE tapestry:: DESTINATION ${TAPESTRY_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tapestryConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tapestryConfig.cmake INSTALL_DESTINATION ${TAPESTRY_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tapestryConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tapestryConfig.cmake ${PROJECT_BINARY_DIR}/tapestryConfigVersion.cmake
        DESTINATION ${TAPESTRY_CMAKE_DIR})

# pkg-config: a static library lists what it links in Libs (plain `pkg-config --libs` works).
if(TAPESTRY_OPENMP)
  set(TAPESTRY_PC_OPENMP " -fopenmp")
endif()
if(TAPESTRY_ONEDNN)
  set(TAPESTRY_PC_DNNL " -ldnnl")
endif()
get_target_property(TAPESTRY_LIBRARY_TYPE tapestry TYPE)
if(TAPESTRY_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  set(TAPESTRY_PC_LIBS "-L\${libdir} -ltapestry -lopenblas${TAPESTRY_PC_DNNL} -lz${TAPESTRY_PC_OPENMP}")
  set(TAPESTRY_PC_LIBS_PRIVATE "")
else()
  set(TAPESTRY_PC_LIBS "-L\${libdir} -ltapestry")
  set(TAPESTRY_PC_LIBS_PRIVATE "-lopenblas${TAPESTRY_PC_DNNL} -lz${TAPESTRY_PC_OPENMP}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/tapestry.pc.in ${PROJECT_BINARY_DIR}/tapestry.pc @ONLY)
# The dist component for pkg-config users: tapestry-dist (its library, then tapestry's, and MPI's C
# library when the build had MPI: mpicc --showme:link).
if(TAPESTRY_MPI)
  set(TAPESTRY_PC_MPI " -lmpi")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/tapestry-dist.pc.in ${PROJECT_BINARY_DIR}/tapestry-dist.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tapestry.pc ${PROJECT_BINARY_DIR}/tapestry-dist.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
