# Helpers that give every remat target the same flags.
#
#   remat_library(NAME SOURCES a.cc b.cc DEPS x y)   static library
#   remat_executable(NAME SOURCES main.cc DEPS x)     program
#   remat_test(NAME SOURCES t.cc DEPS x [LABELS l])   GoogleTest program, one ctest per test case

if(REMAT_SANITIZE)
  # Applied to everything built here, so sanitized code never calls unsanitized remat code.
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()

function(remat_apply_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
  if(REMAT_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

function(remat_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  remat_apply_warnings(${name})
endfunction()

function(remat_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  remat_apply_warnings(${name})
endfunction()

function(remat_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  remat_apply_warnings(${name})
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    # A hung test (a deadlock) fails after 15 minutes instead of eating CI's 90; the slowest test takes seconds
    # (minutes under the sanitizers).
    PROPERTIES LABELS "${ARG_LABELS}"
               ENVIRONMENT "REMAT_SHARED_DIR=${REMAT_SHARED_DIR}"
               TIMEOUT 900)
endfunction()
