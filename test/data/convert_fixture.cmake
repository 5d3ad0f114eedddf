# Converts the bundled dataset for the C++ tests (fresh each run). With
# PREBUILT set (the GPU machine, which has no ffprobe: scripts/dev/gpu/build.sh
# passes the copy prepare_carry.sh converted on the CPU machine) it copies that.
file(REMOVE_RECURSE ${DST})
if(PREBUILT)
  if(NOT EXISTS ${PREBUILT}/loongforge_dataset.json)
    message(FATAL_ERROR "LOONGFORGE_TEST_DATASET_PREBUILT=${PREBUILT} holds no converted dataset; run scripts/dev/gpu/prepare_carry.sh")
  endif()
  file(COPY ${PREBUILT}/ DESTINATION ${DST})
  message(STATUS "copied the converted dataset ${PREBUILT}")
  return()
endif()
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${SRC} ${DST} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "converting ${SRC} failed (exit ${rc}); is the shared dataset there? (LOONGFORGE_DATASETS)")
endif()
