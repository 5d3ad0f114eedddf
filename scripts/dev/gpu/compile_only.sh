#!/usr/bin/env bash
# One device call that does nothing but compile a model's micro-step into an AOTInductor
# package (no build, no export of weights, nothing beside it), for models whose compile
# needs most of a call (n16-3b):
#   MODEL (default n16-3b), EXPORT_SET (default "tune_visual=true tune_llm=true"), TAG
#   (default n16-3b-full), MB (micro-batch, default 64), HORIZON (the data's actions per sample,
#   default 16: data.action_horizon of the bench config), LIMIT (seconds for the compile,
#   default 560), COMPILE_ENV (variables for it, default
#   AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0: the host wrapper is replayed as a CUDA graph,
#   so its own speed hardly matters and its C++ compile is long at this size).
# scripts/model/export.py --records-only writes the model file's records (seconds);
# scripts/compile_step.py compiles from them, with Inductor's phase times and the main
# thread's stack every 30 s in $OUT/compile_only.log. The package comes back as
# $OUT/TAG-step.pt2 or, over 15 MiB, in parts $OUT/TAG-step.pt2.partNN: `cat` them in
# order into .gpu-carry/TAG-step.pt2, which issue11_step.sh then uses (same TAG and MB,
# same scripts/model code: the trainer refuses a package that does not match).
# CPP_ONLY=1: compile_step.py --cpp-only (the sources and kernels, no host compile), returned
# gzip-compressed as $OUT/TAG-step-cpp.pt2.gz(.partNN): build it on the CPU machine with
# scripts/dev/build_aoti_package.py.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" compile_only
model=${MODEL:-n16-3b}; tag=${TAG:-n16-3b-full}; mb=${MB:-64}
sets=(); for kv in ${EXPORT_SET-tune_visual=true tune_llm=true}; do sets+=(--set "$kv"); done
stamp "records of $model ${sets[*]}"
PYTHONPATH=scripts python3 scripts/model/export.py --config $model "${sets[@]}" --records-only \
  --out /dev/shm/$tag.records.zip || exit 1
stamp "compile $tag, micro-batch $mb"
pkg=/dev/shm/$tag-step.pt2
env ${COMPILE_ENV-AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0} PYTHONUNBUFFERED=1 PYTHONPATH=scripts \
  timeout ${LIMIT:-560} python3 scripts/compile_step.py /dev/shm/$tag.records.zip --batch-size $mb \
  --action-horizon ${HORIZON:-16} \
  --device cuda --precision bf16 --out $pkg --stacks-every 30 ${CPP_ONLY:+--cpp-only}
stamp "compile_step: exit $?"
if [ -f $pkg ] && [ -n "${CPP_ONLY:-}" ]; then
  ls -l $pkg; sha256sum $pkg
  python3 -c 'import sys, zipfile; n = zipfile.ZipFile(sys.argv[1]).namelist(); print(len(n), "files,", sum(x.endswith(".cubin") for x in n), "cubins")' $pkg
  gzip -6 -c $pkg > /dev/shm/cpp.gz; ls -l /dev/shm/cpp.gz
  if [ $(stat -c %s /dev/shm/cpp.gz) -le $((15 << 20)) ]; then cp /dev/shm/cpp.gz "$OUT/$tag-step-cpp.pt2.gz"
  else split -b 15M -d /dev/shm/cpp.gz "$OUT/$tag-step-cpp.pt2.gz.part"; fi
elif [ -f $pkg ]; then
  ls -l $pkg; sha256sum $pkg
  if [ $(stat -c %s $pkg) -le $((15 << 20)) ]; then cp $pkg "$OUT/$tag-step.pt2"
  else split -b 15M -d $pkg "$OUT/$tag-step.pt2.part"; fi
fi
