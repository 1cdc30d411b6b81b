pkg_check_modules(CRITERION REQUIRED IMPORTED_TARGET criterion)

# kf_unit_test(NAME source... LIBS lib...): one Criterion binary, one CTest
# entry. Each test runs in its own process (Criterion forks), with a timeout.
function(kf_unit_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE PkgConfig::CRITERION ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name} --timeout 60)
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS unit)
endfunction()
