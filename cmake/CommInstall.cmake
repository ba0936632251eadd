# Installation: headers, libraries, the CMake package (find_package(libcomm) with the targets
# libcomm::comm, libcomm::actors, libcomm::sim) and pkg-config files (libcomm, libcomm-actors,
# libcomm-sim). A library opts in with comm_installed_library(); comm_install() at the end of the
# top-level CMakeLists.txt writes the rules.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Until 1.0 every minor version may change the ABI, so the soname carries major.minor.
set(COMM_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

# comm_installed_library(<target> <export name>): installs <target> as libcomm::<export name>
# (also its name in this build, for projects that add libcomm with add_subdirectory), versioned
# when shared. Installed libraries find each other in their own directory.
function(comm_installed_library target export_name)
  set_target_properties(${target} PROPERTIES
    EXPORT_NAME ${export_name}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${COMM_SOVERSION}
    INSTALL_RPATH "$ORIGIN"
    INSTALL_RPATH_USE_LINK_PATH ON)
  add_library(libcomm::${export_name} ALIAS ${target})
  set_property(GLOBAL APPEND PROPERTY COMM_INSTALLED_TARGETS ${target})
endfunction()

# comm_public_headers(<dir>...): include directories whose comm/ tree is installed as is.
function(comm_public_headers)
  set_property(GLOBAL APPEND PROPERTY COMM_PUBLIC_INCLUDE_DIRS ${ARGN})
endfunction()

# comm_pkg_config_libs(<out> <target>...): "-l<name>" for each target's library file.
function(comm_pkg_config_libs out)
  set(flags "")
  foreach(target ${ARGN})
    get_target_property(name ${target} OUTPUT_NAME)
    if(NOT name)
      set(name ${target})
    endif()
    string(APPEND flags " -l${name}")
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# comm_write_pkg_config(FILE <name.pc> TARGETS <target>... DESCRIPTION <text> [REQUIRES <pc>...]
#   [PRIVATE_REQUIRES <pc>...] [PRIVATE_TARGETS <target>...] [LIBS <flag>...]): one relocatable
# .pc file (its paths are relative to where it is installed). TARGETS, REQUIRES and LIBS are what
# a program calling the functions its headers declare links; PRIVATE_* what those libraries use
# in turn. A static install makes those public too, so that a plain `pkg-config --libs` links; a
# shared one keeps them private (for `pkg-config --static`).
function(comm_write_pkg_config)
  cmake_parse_arguments(PARSE_ARGV 0 PC "" "FILE;DESCRIPTION"
    "TARGETS;REQUIRES;PRIVATE_REQUIRES;PRIVATE_TARGETS;LIBS")
  get_filename_component(COMM_PC_NAME ${PC_FILE} NAME_WE)
  set(COMM_PC_DESCRIPTION "${PC_DESCRIPTION}")
  comm_pkg_config_libs(libs ${PC_TARGETS})
  comm_pkg_config_libs(private_libs ${PC_PRIVATE_TARGETS})
  if(BUILD_SHARED_LIBS)
    list(JOIN PC_REQUIRES " " COMM_PC_REQUIRES)
    list(JOIN PC_PRIVATE_REQUIRES " " COMM_PC_REQUIRES_PRIVATE)
    set(COMM_PC_LIBS_PRIVATE "${private_libs}")
  else()
    list(JOIN PC_REQUIRES " " COMM_PC_REQUIRES)
    list(JOIN PC_PRIVATE_REQUIRES " " private_requires)
    string(STRIP "${COMM_PC_REQUIRES} ${private_requires}" COMM_PC_REQUIRES)
    set(COMM_PC_REQUIRES_PRIVATE "")
    string(APPEND libs "${private_libs}")
    set(COMM_PC_LIBS_PRIVATE "")
  endif()
  list(JOIN PC_LIBS " " extra_libs)
  string(STRIP "${libs} ${extra_libs}" COMM_PC_LIBS)
  cmake_path(RELATIVE_PATH CMAKE_INSTALL_PREFIX BASE_DIRECTORY
    "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig" OUTPUT_VARIABLE COMM_PC_PREFIX)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/libcomm.pc.in
    ${PROJECT_BINARY_DIR}/pkgconfig/${PC_FILE} @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${PC_FILE}
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()

# comm_install(): the install rules for everything registered above.
function(comm_install)
  get_property(targets GLOBAL PROPERTY COMM_INSTALLED_TARGETS)
  install(TARGETS ${targets} EXPORT libcommTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  get_property(include_dirs GLOBAL PROPERTY COMM_PUBLIC_INCLUDE_DIRS)
  foreach(dir ${include_dirs})
    install(DIRECTORY ${dir}/comm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endforeach()

  set(package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/libcomm)
  install(EXPORT libcommTargets NAMESPACE libcomm:: DESTINATION ${package_dir})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/libcommConfig.cmake.in
    ${PROJECT_BINARY_DIR}/libcommConfig.cmake INSTALL_DESTINATION ${package_dir})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/libcommConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/libcommConfig.cmake
    ${PROJECT_BINARY_DIR}/libcommConfigVersion.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
    DESTINATION ${package_dir})

  # Registered bottom-up; a static link line names each library before those it uses.
  list(REVERSE targets)
  list(REMOVE_ITEM targets comm_actors comm_sim)
  if(BUILD_SHARED_LIBS)
    # Public headers declare functions of comm, comm_transports (tl::all_components) and
    # comm_transport_base (status, log, transport options).
    set(public_targets comm comm_transports comm_transport_base)
  else()
    set(public_targets ${targets})
  endif()
  list(REMOVE_ITEM targets ${public_targets})
  comm_write_pkg_config(FILE libcomm.pc TARGETS ${public_targets} LIBS -pthread
    DESCRIPTION "Messaging in the style of UCX: active messages, tag matching, RMA over shm, tcp, verbs"
    PRIVATE_TARGETS ${targets}
    PRIVATE_REQUIRES hwloc pmix libibverbs librdmacm capnp kj libcrypto)
  comm_write_pkg_config(FILE libcomm-actors.pc TARGETS comm_actors LIBS -lcaf_core
    DESCRIPTION "Remote CAF 0.17 actors over libcomm" REQUIRES libcomm)
  comm_write_pkg_config(FILE libcomm-sim.pc TARGETS comm_sim
    DESCRIPTION "Parallel discrete-event simulation over libcomm" REQUIRES libcomm)
endfunction()
