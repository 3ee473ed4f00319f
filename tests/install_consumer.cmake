# Installs the built tree into BIN/install-test, then builds examples/consumer against it
# with find_package, runs it, and checks llama3d.pc with pkg-config. Run with cmake -P.
set(prefix ${BIN}/install-test)
file(REMOVE_RECURSE ${prefix} ${BIN}/consumer-build)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC}/examples/consumer -B ${BIN}/consumer-build
                        -DCMAKE_PREFIX_PATH=${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN}/consumer-build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${BIN}/consumer-build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
# pkg-config: the link line must build the same program, with --static and without it (the
# archive is all llama3d installs, so what it needs is in Libs/Requires: a plain
# `pkg-config --cflags --libs llama3d` missed pcre2, jansson and openblas).
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
foreach(args "--cflags --libs llama3d" "--static --cflags --libs llama3d")
  separate_arguments(args UNIX_COMMAND "${args}")
  execute_process(COMMAND ${PKG_CONFIG} ${args}
                  OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config ${args} failed")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  execute_process(COMMAND cc -std=c11 ${SRC}/examples/consumer/main.c -o ${BIN}/consumer-pc
                          ${flags} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "linking the consumer with pkg-config ${args} failed")
  endif()
  execute_process(COMMAND ${BIN}/consumer-pc RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the consumer linked with pkg-config ${args} failed: ${rc}")
  endif()
endforeach()
message(STATUS "install consumer: find_package and pkg-config builds both ran")
# examples/chat: serving on the installed headers only (device, model, tokenizer, cache,
# sampler), here on a checkpoint the installed l3d writes (the byte tokenizer: plain
# continuation of each input line).
file(REMOVE_RECURSE ${BIN}/chat-build ${BIN}/chat-ck)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC}/examples/chat -B ${BIN}/chat-build
                        -DCMAKE_PREFIX_PATH=${prefix} RESULT_VARIABLE rc)
if(NOT rc)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN}/chat-build RESULT_VARIABLE rc)
endif()
if(rc)
  message(FATAL_ERROR "building examples/chat against the installed archive failed: ${rc}")
endif()
execute_process(COMMAND ${prefix}/bin/l3d train --steps 5 --save ${BIN}/chat-ck
                OUTPUT_QUIET RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the installed l3d could not write a checkpoint: ${rc}")
endif()
file(WRITE ${BIN}/chat-input.txt "The GNU General\nPublic License\n")
execute_process(COMMAND ${BIN}/chat-build/l3d-chat ${BIN}/chat-ck 12
                INPUT_FILE ${BIN}/chat-input.txt OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(REGEX MATCHALL "\n" lines "${out}")
list(LENGTH lines nlines)
if(rc OR NOT nlines EQUAL 2)
  message(FATAL_ERROR "l3d-chat failed (exit ${rc}) or did not answer both lines: '${out}'")
endif()
message(STATUS "examples/chat: answered two lines on the installed archive")
