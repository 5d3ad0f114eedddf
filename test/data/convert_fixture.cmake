# Converts the bundled dataset for the C++ tests (fresh each run).
file(REMOVE_RECURSE ${DST})
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${SRC} ${DST} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "converting ${SRC} failed (exit ${rc}); is the shared dataset there? (LOONGFORGE_DATASETS)")
endif()
