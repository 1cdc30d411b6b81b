# kf_mapping_test_protos(OUT_SRCS GEN_DIR): generates the test-only protos
# of tests/unit/proto (mapping_test*.proto, package keyflow.test) with
# protoc-c into GEN_DIR, for the JSON mapping's unit tests and its fuzzer.
function(kf_mapping_test_protos out_srcs gen_dir)
  set(src_dir ${CMAKE_SOURCE_DIR}/tests/unit/proto)
  file(MAKE_DIRECTORY ${gen_dir})
  set(srcs)
  foreach(proto mapping_test mapping_test2)
    set(outs ${gen_dir}/${proto}.pb-c.c ${gen_dir}/${proto}.pb-c.h)
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${PROTOC_C} --c_out=${gen_dir} -I${src_dir} ${src_dir}/${proto}.proto
      DEPENDS ${src_dir}/${proto}.proto
      VERBATIM)
    list(APPEND srcs ${outs})
  endforeach()
  # Generated code is not ours to warn about.
  set_source_files_properties(${srcs} PROPERTIES COMPILE_OPTIONS "-w")
  set(${out_srcs} ${srcs} PARENT_SCOPE)
endfunction()
