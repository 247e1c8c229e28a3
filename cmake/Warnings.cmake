# Floating-point results must not depend on the compiler: a fused multiply-add rounds once where
# a multiply then an add round twice, so a compiler (or target) that contracts a * b + c into an
# FMA changes the last bits of a duration, and an int64 ns timestamp or a golden file with it.
# GCC in ISO mode (-std=c++20) already does not contract; clang's default is "on", and -march
# flags with FMA make it matter: off everywhere, for C++ (CUDA code is cmake/Cuda.cmake's).
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)

# Warnings are errors in our own code only; third-party headers come in as SYSTEM.
function(shardscope_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
    -Woverloaded-virtual -Wimplicit-fallthrough -Werror)
endfunction()

# Adds a library for one top-level folder: public headers under include/, sources and
# private headers under src/, unit tests beside the code as src/*_test.cc.
function(shardscope_library name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB lib_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cc)
  list(FILTER lib_sources EXCLUDE REGEX "_(test|fuzz|benchmark)\\.cc$")
  add_library(${name} STATIC ${lib_sources})
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                                     PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  shardscope_warnings(${name})
  if(SHARDSCOPE_TESTS)
    file(GLOB test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*_test.cc)
    if(test_sources)
      add_executable(${name}_tests ${test_sources})
      target_include_directories(${name}_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
      target_link_libraries(${name}_tests PRIVATE ${name} GTest::gtest GTest::gmock GTest::gtest_main)
      target_compile_definitions(${name}_tests PRIVATE
        SHARDSCOPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
      shardscope_warnings(${name}_tests)
      gtest_discover_tests(${name}_tests DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "unit;${name}")
    endif()
  endif()
endfunction()
