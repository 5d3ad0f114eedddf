# Makes an AV1 copy of the bundled LeRobot dataset and converts it, for the
# AV1 decode and training tests (test_video.cpp, test/e2e/test_video_data.py).
# Each video is re-encoded the way LeRobot encodes AV1 datasets (SVT-AV1,
# -g 2, crf 30, yuv420p); -preset 12 only makes the fixture fast on 2 cores.
#
#   cmake -DPYTHON=... -DSRC=<lerobot dataset> -DWORK=<scratch> -DDST=<converted> -DSCRIPT=convert_lerobot.py -P av1_fixture.cmake
execute_process(COMMAND ffmpeg -hide_banner -encoders OUTPUT_VARIABLE encoders RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT encoders MATCHES "libsvtav1")
  message(FATAL_ERROR "ffmpeg with the libsvtav1 encoder is needed to make the AV1 test dataset "
                      "(Debian 12's ffmpeg has it: apt-get install ffmpeg; scripts/setup.sh installs it)")
endif()
file(REMOVE_RECURSE ${WORK} ${DST})
file(MAKE_DIRECTORY ${WORK})
file(COPY ${SRC}/meta ${SRC}/data DESTINATION ${WORK})
file(READ ${WORK}/meta/info.json info)
string(REPLACE "\"video.codec\": \"h264\"" "\"video.codec\": \"av1\"" info "${info}")
file(WRITE ${WORK}/meta/info.json "${info}")
file(GLOB_RECURSE videos RELATIVE ${SRC} ${SRC}/videos/*.mp4)
foreach(v IN LISTS videos)
  get_filename_component(dir ${WORK}/${v} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  execute_process(COMMAND ffmpeg -v error -nostdin -y -i ${SRC}/${v} -c:v libsvtav1 -preset 12 -crf 30 -g 2
                          -pix_fmt yuv420p ${WORK}/${v}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "encoding ${v} to AV1 failed (exit ${rc}): ${err}")
  endif()
endforeach()
execute_process(COMMAND ${PYTHON} ${SCRIPT} ${WORK} ${DST} --quiet RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "converting the AV1 copy ${WORK} failed (exit ${rc})")
endif()
