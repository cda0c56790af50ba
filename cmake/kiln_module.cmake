# kiln_module(NAME DIR <dir> DEPS <targets...>)
# One static library per source folder (DESIGN.md §3): every *.cc in DIR except *_test.cc and
# *_benchmark.cc. Tests beside the code (*_test.cc) become one GoogleTest binary, <name>_test,
# registered with ctest (its own sources at -O1 in optimized builds). Sources are globbed so that adding a file needs no CMake edit.
function(kiln_module name)
  cmake_parse_arguments(KM "" "DIR" "DEPS;TEST_DEPS" ${ARGN})
  if(NOT KM_DIR)
    set(KM_DIR ${CMAKE_CURRENT_SOURCE_DIR})
  endif()
  file(GLOB srcs CONFIGURE_DEPENDS ${KM_DIR}/*.cc)
  file(GLOB tests CONFIGURE_DEPENDS ${KM_DIR}/*_test.cc ${KM_DIR}/test_util/*.cc)
  list(FILTER srcs EXCLUDE REGEX "(_test|_benchmark)\\.cc$")
  if(srcs)
    add_library(kiln_${name} STATIC ${srcs})
    target_include_directories(kiln_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(kiln_${name} PUBLIC ${KM_DEPS})
  else()
    # A module that is headers only (so far): an interface library, so dependents link the same.
    add_library(kiln_${name} INTERFACE)
    target_include_directories(kiln_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(kiln_${name} INTERFACE ${KM_DEPS})
  endif()
  if(KILN_BUILD_TESTS AND tests)
    add_executable(${name}_test ${tests})
    target_link_libraries(${name}_test PRIVATE kiln_${name} ${KM_TEST_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
    # The tests' own sources at -O1 in optimized builds: they compile about 30% faster than at -O2
    # (gtest's macro-heavy bodies), which CI's 2-core build feels, and nothing in them is timed
    # (speeds are measured in bench/). The code under test keeps the build type's flags.
    target_compile_options(${name}_test PRIVATE $<$<CONFIG:RelWithDebInfo,Release>:-O1>)
    gtest_discover_tests(${name}_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)
  endif()
endfunction()
