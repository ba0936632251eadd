# FindCAF: the C++ Actor Framework 0.17 as Debian's libcaf-dev installs it, which ships neither a
# CMake package nor a pkg-config file. Used by libcomm's build and installed with its CMake
# package, so find_package(libcomm) finds CAF the same way.
#
# Defines the imported targets CAF::core and CAF::io (headers under CAF_INCLUDE_DIR), and sets
# CAF_FOUND. The cache variables CAF_CORE_LIBRARY, CAF_IO_LIBRARY and CAF_INCLUDE_DIR point it
# elsewhere.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
find_library(CAF_IO_LIBRARY caf_io)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_INCLUDE_DIR)

if(CAF_FOUND AND NOT TARGET CAF::core)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES
    IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
  add_library(CAF::io UNKNOWN IMPORTED)
  set_target_properties(CAF::io PROPERTIES
    IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
    INTERFACE_LINK_LIBRARIES CAF::core)
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY)
