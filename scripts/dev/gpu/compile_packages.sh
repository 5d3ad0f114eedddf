#!/usr/bin/env bash
# One device call that compiles several models' micro-steps into C++-only AOTInductor packages
# (scripts/dev/gpu/compile_only.sh with CPP_ONLY=1 each), one after another's trace: each compile
# starts once the one before it has traced and exported its step (the traces run the step on the
# GPU, two at once could run out of device memory), so the long code generations overlap.
#   PACKAGES="TAG:MODEL:MB[:k=v,k=v] ..." (default: n16-3b-full at micro-batch 128 with full
#   fine-tuning, then n16-1b at 32 with the export defaults), LIMIT (seconds for each compile,
#   default 540).
# Each package's log and sources come back under $OUT/TAG/ (compile_only.sh's layout: the gzip
# of the --cpp-only package, in 15 MiB parts when larger); on the CPU machine
#   cat OUT/TAG/TAG-step-cpp.pt2.gz* | gunzip > TAG-cpp.pt2
#   python3 scripts/dev/build_aoti_package.py TAG-cpp.pt2 .gpu-carry/TAG-step.pt2 --opt-level O0
# gives the package scripts/dev/gpu/issue11_step.sh takes (same TAG and MB, same scripts/model code).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" compile_packages
specs=${PACKAGES:-"n16-3b-full:n16-3b:128:tune_visual=true,tune_llm=true n16-1b:n16-1b:32"}
pids=()
for spec in $specs; do
  IFS=: read -r tag model mb sets <<< "$spec"
  mkdir -p "$OUT/$tag"
  stamp "compile $tag ($model, micro-batch $mb${sets:+, $sets})"
  CPP_ONLY=1 MODEL=$model TAG=$tag MB=$mb EXPORT_SET="${sets//,/ }" LIMIT=${LIMIT:-540} OUT="$OUT/$tag" \
    bash scripts/dev/gpu/compile_only.sh > /dev/null 2>&1 & pids+=($!)
  # the next trace waits for this one's (its log says "exported in" once the trace's memory is given back)
  for _ in $(seq 300); do
    grep -q "^exported in" "$OUT/$tag/compile_only.log" 2>/dev/null && break
    kill -0 ${pids[-1]} 2>/dev/null || break
    sleep 2
  done
  grep -E "^(traced|exported)" "$OUT/$tag/compile_only.log"
done
rc=0
for p in "${pids[@]}"; do wait $p || rc=1; done
for spec in $specs; do
  tag=${spec%%:*}
  stamp "$tag"; grep -E "^== |^compiled" "$OUT/$tag/compile_only.log" | tail -6; ls -l "$OUT/$tag"
done
exit $rc
