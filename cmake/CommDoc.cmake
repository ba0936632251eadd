# The API reference: `cmake --build build --target doc` runs Doxygen over the public headers'
# `///` comments into build/doc/html. Every undocumented public declaration is a warning, and a
# warning fails the target. Without doxygen (Debian package doxygen) there is no doc target.
find_package(Doxygen)
if(NOT DOXYGEN_FOUND)
  message(STATUS "doxygen not found: no doc target (apt-get install doxygen)")
  return()
endif()

get_property(COMM_DOC_INPUTS GLOBAL PROPERTY COMM_PUBLIC_INCLUDE_DIRS)
set(DOXYGEN_PROJECT_BRIEF "Actor-model distributed messaging: a UCX-class stack with CAF on top")
set(DOXYGEN_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/doc)
set(DOXYGEN_FILE_PATTERNS *.hpp)
set(DOXYGEN_STRIP_FROM_PATH ${COMM_DOC_INPUTS})
set(DOXYGEN_STRIP_FROM_INC_PATH ${COMM_DOC_INPUTS})
set(DOXYGEN_JAVADOC_AUTOBRIEF YES)
set(DOXYGEN_EXTRACT_ALL NO)
set(DOXYGEN_WARN_IF_UNDOCUMENTED YES)
set(DOXYGEN_WARN_AS_ERROR FAIL_ON_WARNINGS)
set(DOXYGEN_QUIET YES)
set(DOXYGEN_HAVE_DOT NO)
set(DOXYGEN_GENERATE_LATEX NO)
# Implementation details live in namespaces named detail; GNU attributes are not API.
set(DOXYGEN_EXCLUDE_SYMBOLS detail *::detail)
set(DOXYGEN_MACRO_EXPANSION YES)
set(DOXYGEN_PREDEFINED "__attribute__(x)=")
doxygen_add_docs(doc ${COMM_DOC_INPUTS} COMMENT "API reference (Doxygen) in ${PROJECT_BINARY_DIR}/doc/html")
