# comm_add_header_check(<target>): an object library, outside `all`, with one translation unit per
# installed public header holding only `#include <that header>`, compiled with the public include
# directories alone (plus CAF's). Building it shows that every header compiles on its own and
# needs nothing that is not installed.
function(comm_add_header_check target)
  get_property(include_dirs GLOBAL PROPERTY COMM_PUBLIC_INCLUDE_DIRS)
  set(sources "")
  foreach(dir ${include_dirs})
    file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${dir} ${dir}/comm/*.hpp)
    foreach(header ${headers})
      string(MAKE_C_IDENTIFIER ${header} name)
      set(source ${CMAKE_CURRENT_BINARY_DIR}/${target}/${name}.cpp)
      file(CONFIGURE OUTPUT ${source} CONTENT "#include <${header}>\n")
      list(APPEND sources ${source})
    endforeach()
  endforeach()
  add_library(${target} OBJECT EXCLUDE_FROM_ALL ${sources})
  target_include_directories(${target} PRIVATE ${include_dirs})
  target_link_libraries(${target} PRIVATE CAF::core)
endfunction()
