#!/usr/bin/env bash
# Issues #46 (DMF's text buckets) and #43 (the GR00T models' compiled step after the model-code changes of
# sessions 51-52) on one H100/H200, the bench config, micro-batch 32, bf16, the bundled data:
#   PART=1 (default), a fresh machine: build-gpu/ and the exports (n16-1b; gr00t-n1.6-3b as g16d0 with
#     state/action 64 and every dropout 0; gr00t-n1.7-3b as g17d0 with every dropout 0); n16-1b's
#     TorchScript step as CUDA graphs without and with DMF, and plain (lf-graphs, lf-graphs-dmf, lf-plain:
#     STEPS steps each, default 100), alone on the machine; scripts/bench/dmf_text_cut.py on the GPU (fp32);
#     then the four packages into the package cache /tmp/lf-cache at once, in a process session of their own
#     that outlives the call (`--compile-only`: n16-1b whole slot, n16-1b with dmf.enable=true (width 14),
#     g16d0, g17d0; each timed, logs /tmp/compile-NAME.log), and beside them test_masked_patch_embed on the
#     GPU (its failing assertion, then its crash under gdb);
#   PART=2, the same machine while warm: waits for the compiles; the runs from the cache: n16-1b
#     lf-default and lf-dmf (the DMF ratio with the compiled step); g16d0 lf-default and ref-opt (our
#     reference: torch.compile + CUDA graphs); g17d0 lf-default, 12 steps (fills the cache's cuda-jit/);
#     the cache's g17d0 entry and cuda-jit/ come back as $OUT/lf-cache17.tgz.partNN (`cat` them into
#     .gpu-carry/lf-cache17.tgz); then `ctest -L gpu -LE long` in the time left;
#   PART=3, a fresh machine given .gpu-carry/lf-cache17.tgz: build, export g17d0, lf-default (12 steps):
#     launch to first step with a cached package and the driver's JIT cache carried (issue #43 item 6).
#   PART=dmf, one call on a fresh machine, DMF alone: build-gpu/ and n16-1b's export; lf-graphs and
#     lf-graphs-dmf as in part 1; n16-1b's two packages compiled at once (whole
#     slot, width 14) beside test_masked_patch_embed and the micro-batch auto GPU test; then lf-default and lf-dmf from the cache (the DMF
#     ratio with the compiled step); dmf_text_cut.py and `ctest -L gpu -LE long` in the time left. COMPILE=0:
#     neither the packages nor the two runs from them; dmf_packages_gpu (n16-tiny's two packages) instead.
#   PART=4, the same machine after part 2 (build-gpu/ kept): dmf_packages_gpu (DMF's two packages for two text
#     widths, their CUDA graphs and shared gradients: n16-tiny fp32, two compiles), the micro-batch auto GPU
#     test, test_masked_patch_embed, then `ctest -L gpu -LE long` in the time left.
#   PART=tests, a short call on a fresh machine: the build; dmf_packages_gpu, the micro-batch auto GPU test,
#     test_masked_patch_embed, then `ctest -L gpu -LE long`, each capped by what is left of LIMIT.
#   PART=5, one call on a fresh machine given .gpu-carry/lf-cache17.tgz (session 55): the build; which bad call
#     of the custom operators crashes the process (scripts/dev/gpu/op_throw_probe.py); the micro-batch auto
#     GPU test; then part 3 (g17d0's first step on a fresh machine from the carried cache).
#   PART=short, a call of a few minutes: the build and export; the micro-batch auto GPU test; lf-graphs and
#     lf-graphs-dmf; test_masked_patch_embed while time is left.
# Every part ends within LIMIT s (default 585) of its start.
#   PART=1 bash scripts/dev/gpu/session53.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session53-part${PART:-1}
LIMIT=${LIMIT:-585}
cache=/tmp/lf-cache
cfg=configs/bench/n16-1b-h200.yaml
n16=(MODEL=n16-1b MB=32 HORIZON=16 TAG=n16-1b COMPILE_CACHE=$cache)
g16=(MODEL=gr00t-n1.6-3b "EXPORT_SET=max_state_dim=64 max_action_dim=64 gr00t_dropout=0" MB=32 HORIZON=16
     TAG=g16d0 COMPILE_CACHE=$cache)
g17=(MODEL=gr00t-n1.7-3b "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 TAG=g17d0 COMPILE_CACHE=$cache)
train() {  # train MODEL-VARS-NAME RUNS STEPS PROFILE [RUN_LIMIT]
  local -n vars=$1
  env "${vars[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS="$2" STEPS=$3 PROFILE=$4 FINAL_KILL=1 RUN_LIMIT=${5:-90} \
    BUDGET=$(( LIMIT - 10 - ($(date +%s) - t0) )) bash scripts/dev/gpu/issue11_step.sh | grep -vE "^== \[|fewer than"
}
compile_only() {  # compile_only NAME MODEL-FILE [--set k=v ...]: into $cache, log /tmp/compile-NAME.log, exit code .rc
  local name=$1 file=$2; shift 2
  /usr/bin/time -f "$name: compile-only wall %e s" timeout 1200 \
    build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=$file --set trainer.micro_batch_size=32 \
    --set trainer.compile_cache=$cache "$@" --compile-only > /tmp/compile-$name.log 2>&1
  echo $? > /tmp/compile-$name.rc
}
wait_compiles() {  # wait_compiles SECONDS: until the four compiles are done or SECONDS pass; their state and logs
  local end=$(( $(date +%s) + $1 )) n
  stamp "waiting for the compiles (at most $1 s)"
  while [ $(date +%s) -lt $end ] && [ $(ls /tmp/compile-*.rc 2>/dev/null | wc -l) -lt 4 ]; do sleep 5; done
  for n in n16-1b n16-1b-dmf g16d0 g17d0; do
    echo "-- $n: exit $(cat /tmp/compile-$n.rc 2>/dev/null || echo 'still running')"
    grep -vE "^\s*$" /tmp/compile-$n.log 2>/dev/null | tail -3 | cut -c1-300
    cp /tmp/compile-$n.log "$OUT/" 2>/dev/null
  done
  tail -2 /tmp/compile-memory.log; ls -l $cache; cat $cache/compile_times.jsonl 2>/dev/null
  [ $(ls /tmp/compile-*.rc 2>/dev/null | wc -l) -ge 4 ]
}
masked_patch_embed_gpu() {  # masked_patch_embed_gpu SECONDS: the op's GPU test (session 51: one assertion
  # failed, then a segmentation fault): the failing assertion alone (-x stops before the crash), then the
  # argument checks under gdb's stack; each at most SECONDS
  [ "$1" -gt 20 ] || { echo "${FUNCNAME[0]}: skipped, $1 s left"; return 0; }
  local pt=(-m pytest -q -x -p no:cacheprovider test/model/test_masked_patch_embed.py) dbg=()
  stamp "test_masked_patch_embed on the GPU"
  LOONGFORGE_TEST_DEVICE=cuda PYTHONPATH=scripts timeout $1 python3 "${pt[@]}" -k "not bad_arguments" 2>&1 | tail -30
  command -v gdb > /dev/null && dbg=(gdb -batch -ex run -ex bt --args)
  LOONGFORGE_TEST_DEVICE=cuda PYTHONPATH=scripts timeout $1 ${dbg[@]+"${dbg[@]}"} python3 -X faulthandler "${pt[@]}" \
    -k bad_arguments 2>&1 | grep -vE "^\[(New|Thread)" | tail -40
}
micro_batch_auto_gpu() {  # micro_batch_auto_gpu SECONDS: trainer.micro_batch_size auto's tests (log $OUT/ctest-mb-auto.log)
  [ "$1" -gt 20 ] || { echo "${FUNCNAME[0]}: skipped, $1 s left"; return 0; }
  stamp "trainer.micro_batch_size auto on the GPU"
  (cd build-gpu && timeout $1 ctest -V -R "e2e_micro_batch_auto_gpu|test_micro_batch" --output-on-failure \
     > "$OUT/ctest-mb-auto.log" 2>&1; echo "ctest exit $?")  # -V: the chosen sizes the test prints, passing too
  grep -E "Test +#|tests passed|the whole GPU:|under a cap|FAILED|Error|assert" "$OUT/ctest-mb-auto.log" | cut -c1-700 | tail -30
}
cap() {  # cap SECONDS: SECONDS, or less: what is left of LIMIT less 15 s (0 when nothing is)
  local left=$(( LIMIT - 15 - ($(date +%s) - t0) ))
  [ $left -lt 0 ] && left=0
  echo $(( $1 < left ? $1 : left ))
}
dmf_packages_gpu() {  # dmf_packages_gpu SECONDS: DMF's two packages for two text widths on the GPU (log in $OUT)
  [ "$1" -gt 20 ] || { echo "${FUNCNAME[0]}: skipped, $1 s left"; return 0; }
  stamp "dmf_packages_gpu: two packages, two text widths, CUDA graphs required"
  (cd build-gpu && timeout $1 ctest -R "^dmf_packages_gpu$" --output-on-failure > "$OUT/ctest-dmf-packages.log" 2>&1
   echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|assert|Error" "$OUT/ctest-dmf-packages.log" | cut -c1-400 | tail -20
}
first_step_from_cache() {  # g17d0 exported, .gpu-carry/lf-cache17.tgz as the package cache; lf-default twice
  # (launch to first step on a machine given the cache and the driver's JIT cache), then the GPU tests in the time left
  env "${g17[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
  rm -rf $cache && tar -xzf .gpu-carry/lf-cache17.tgz -C /tmp && ls -l $cache/*.pt2 && du -sh $cache/cuda-jit || exit 1
  stamp "g17d0: lf-default on a fresh machine given the cache (12 steps), then again"
  train g17 "lf-default lf-default-warm" 12 0 90
  grep -h "first step done" /tmp/lf-logs-g17d0/lf-default*.log
  tar -czf "$OUT/logs-g17d0.tgz" -C /tmp lf-logs-g17d0
  gpu_tests_in_time_left $LIMIT
}
case ${PART:-1} in
tests)  # a short call on a fresh machine: the build, then the GPU tests of this code, most wanted first
  stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
  dmf_packages_gpu $(cap 240)
  micro_batch_auto_gpu $(cap 150)
  masked_patch_embed_gpu $(cap 60)
  gpu_tests_in_time_left $LIMIT
  ;;
4)
  [ -x build-gpu/src/daemon/loongforge-train ] || { echo "part 4 needs part 1's build-gpu/ (the same warm machine)"; exit 1; }
  cmake --build build-gpu > /tmp/build4.log 2>&1 || { tail -30 /tmp/build4.log; exit 1; }
  dmf_packages_gpu 400
  micro_batch_auto_gpu 150
  left=$(( LIMIT - 60 - ($(date +%s) - t0) ))
  [ $left -gt 40 ] && masked_patch_embed_gpu $(( left / 3 ))
  gpu_tests_in_time_left $LIMIT
  ;;
short)
  env "${n16[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
  micro_batch_auto_gpu 150
  stamp "n16-1b, TorchScript step as CUDA graphs without and with DMF"
  train n16 "lf-graphs lf-graphs-dmf" ${STEPS:-100} 0 60
  grep -h "DMF:\|padding " /tmp/lf-logs-n16-1b/lf-graphs-dmf.log /tmp/lf-logs-n16-1b/lf-graphs.log | cut -c1-300
  python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-n16-1b lf-graphs lf-graphs-dmf
  tar -czf "$OUT/logs-n16-1b.tgz" -C /tmp lf-logs-n16-1b
  left=$(( LIMIT - 5 - ($(date +%s) - t0) ))
  [ $left -gt 20 ] && masked_patch_embed_gpu $(( left / 2 ))
  ;;
dmf)
  env "${n16[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
  stamp "n16-1b, TorchScript step as CUDA graphs without and with DMF"
  train n16 "lf-graphs lf-graphs-dmf" ${STEPS:-100} 0
  grep -h "DMF:\|padding " /tmp/lf-logs-n16-1b/lf-graphs-dmf.log /tmp/lf-logs-n16-1b/lf-graphs.log | cut -c1-300
  python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-n16-1b lf-graphs lf-graphs-dmf
  p1=""; p2=""
  if [ "${COMPILE:-1}" = 1 ]; then  # COMPILE=0: no packages, no lf-default / lf-dmf (a short call)
    stamp "n16-1b's two packages into $cache at once"
    rm -rf $cache /tmp/compile-*
    compile_only n16-1b /dev/shm/n16-1b.pt & p1=$!; sleep 20
    compile_only n16-1b-dmf /dev/shm/n16-1b.pt --set dmf.enable=true & p2=$!
  fi
  [ -z "$p1" ] && dmf_packages_gpu $(cap 240)  # COMPILE=0: the GPU compiles two small packages instead
  micro_batch_auto_gpu $(cap 200)
  masked_patch_embed_gpu $(cap 100)  # beside the compiles, as the next: correctness, not timings
  if [ -n "$p1" ]; then
    stamp "waiting for the two compiles"; wait $p1 $p2
    for n in n16-1b n16-1b-dmf; do
      echo "-- $n: exit $(cat /tmp/compile-$n.rc)"; grep -vE "^\s*$" /tmp/compile-$n.log | tail -3 | cut -c1-300
      cp /tmp/compile-$n.log "$OUT/"
    done
    ls -l $cache; cat $cache/compile_times.jsonl 2>/dev/null
    stamp "n16-1b: the defaults (package from the cache) without and with DMF"
    train n16 "lf-default lf-dmf" ${STEPS:-100} 0
    python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-n16-1b lf-default lf-dmf
    grep -h "DMF:\|padding \|cache" /tmp/lf-logs-n16-1b/lf-dmf.log | cut -c1-300
    stamp "steady state of the four"
    python3 scripts/dev/gpu/steady_state.py /tmp/lf-logs-n16-1b lf-graphs lf-graphs-dmf lf-default lf-dmf
  fi
  tar -czf "$OUT/logs-n16-1b.tgz" -C /tmp lf-logs-n16-1b
  if [ $(( LIMIT - ($(date +%s) - t0) )) -gt 60 ]; then
    stamp "DMF at the model: scripts/bench/dmf_text_cut.py on the GPU (fp32, micro-batch 32)"
    timeout 90 python3 scripts/bench/dmf_text_cut.py --model /dev/shm/n16-1b.pt --config n16-1b --batch 32 --device cuda
  fi
  gpu_tests_in_time_left $LIMIT
  ;;
1)
  env "${n16[@]}" SECTIONS="none" EXTRA_EXPORTS="g16d0=gr00t-n1.6-3b:max_state_dim=64,max_action_dim=64,gr00t_dropout=0 g17d0=gr00t-n1.7-3b:gr00t_dropout=0" \
    bash scripts/dev/gpu/issue11_step.sh || exit 1
  ls -l /dev/shm/*.pt
  stamp "n16-1b, TorchScript step as CUDA graphs without and with DMF, and plain (alone on the machine)"
  train n16 "lf-graphs lf-graphs-dmf lf-plain" ${STEPS:-100} 0
  grep -h "DMF:\|padding " /tmp/lf-logs-n16-1b/lf-graphs-dmf.log /tmp/lf-logs-n16-1b/lf-graphs.log | cut -c1-300
  python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-n16-1b lf-graphs lf-graphs-dmf
  stamp "DMF at the model: scripts/bench/dmf_text_cut.py on the GPU (fp32, micro-batch 32)"
  timeout 90 python3 scripts/bench/dmf_text_cut.py --model /dev/shm/n16-1b.pt --config n16-1b --batch 32 --device cuda
  tar -czf "$OUT/logs-n16-1b-part1.tgz" -C /tmp lf-logs-n16-1b
  stamp "four packages into $cache at once (their own process session: they go on after this call)"
  rm -rf $cache /tmp/compile-*
  # Started 45 s apart: each traces its step on the GPU first (two 3B traces at once may not fit an H100).
  setsid bash -c "
    cfg=$cfg; cache=$cache
    (while sleep 30; do echo \"[memory] \$(free -g | awk '/Mem:/ {print \$3 \" GB used, \" \$7 \" GB available\"}') \$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)\"; done) > /tmp/compile-memory.log 2>&1 & mon=\$!
    $(declare -f compile_only)
    compile_only g16d0 /dev/shm/g16d0.pt & p1=\$!; sleep 45
    compile_only g17d0 /dev/shm/g17d0.pt & p2=\$!; sleep 45
    compile_only n16-1b /dev/shm/n16-1b.pt & p3=\$!; sleep 30
    compile_only n16-1b-dmf /dev/shm/n16-1b.pt --set dmf.enable=true & p4=\$!
    wait \$p1 \$p2 \$p3 \$p4; kill \$mon" \
    < /dev/null > /tmp/compile-all.log 2>&1 &
  masked_patch_embed_gpu 120  # beside the compiles
  wait_compiles $(( LIMIT - 15 - ($(date +%s) - t0) ))
  ;;
2)
  wait_compiles $(( LIMIT - 300 )) || exit 1
  stamp "n16-1b: the defaults (package from the cache) without and with DMF"
  train n16 "lf-default lf-dmf" ${STEPS:-100} 0
  python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-n16-1b lf-default lf-dmf
  grep -h "DMF:\|padding \|cache" /tmp/lf-logs-n16-1b/lf-dmf.log | cut -c1-300
  stamp "g16d0: lf-default (the package from the cache) and ref-opt"
  train g16 "lf-default ref-opt" ${STEPS:-100} 1 120
  python3 scripts/dev/gpu/compare_losses.py /tmp/lf-logs-g16d0 lf-default ref-opt
  stamp "g17d0: lf-default, 12 steps (the driver's JIT cache filled)"
  train g17 "lf-default" 12 0 60
  grep -h "first step done" /tmp/lf-logs-g17d0/lf-default.log
  tar -czf /tmp/lf-logs.tgz -C /tmp lf-logs-n16-1b lf-logs-g16d0 lf-logs-g17d0 && cp /tmp/lf-logs.tgz "$OUT/"
  mkdir -p /tmp/c17/lf-cache && cp -r $cache/cuda-jit $cache/gr00t-n1.7*.pt2 $cache/compile_times.jsonl /tmp/c17/lf-cache/ &&
    tar -czf /tmp/lf-cache17.tgz -C /tmp/c17 lf-cache && split -b 15M -d /tmp/lf-cache17.tgz "$OUT/lf-cache17.tgz.part"
  ls -l "$OUT"
  gpu_tests_in_time_left $LIMIT
  ;;
5)
  stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
  stamp "custom operators: a bad call raises or crashes (each in its own process)"
  PYTHONPATH=scripts timeout 100 python3 scripts/dev/gpu/op_throw_probe.py
  micro_batch_auto_gpu $(cap 200)
  first_step_from_cache
  ;;
3)
  first_step_from_cache
  ;;
esac
stamp "done"
