#!/usr/bin/env bash
# corescale tune recipe: onnxruntime int8 2×1c graph_optimization_level=basic execution_mode=parallel bs=1 allocator=tcmalloc
# recommended: onnxruntime int8 2×1c graph_optimization_level=basic execution_mode=parallel bs=1 allocator=tcmalloc — throughput 2365.45 samples/s (95 % CI -6146.93 – 10877.82 over 2 repeats)
# statistical tie (p = 0.25, Welch's t over repeats) between onnxruntime int8 2×1c graph_optimization_level=basic execution_mode=parallel bs=1 allocator=tcmalloc and onnxruntime int8 2×1c graph_optimization_level=disable bs=4 allocator=jemalloc and pytorch int8 2×1c bs=4: the faster first (means more than 5% apart are not the same in practice)
# 819.24× the out-of-box throughput (95 % CI 406.01 – 1898.65×; out-of-box PyTorch 2.89 samples/s)
# measured on Intel(R) Xeon(R) Processor, 2 physical cores
#
# usage: recipe.sh                  runs the corescale line that reproduces the measurement
#        recipe.sh -- CMD [ARG ...]  starts 2 copies of CMD, each pinned and configured as one
#                                    measured instance; CORESCALE_INSTANCE_INDEX (0..1) and
#                                    CORESCALE_INSTANCES tell each copy which it is
set -euo pipefail
if [ "$#" -eq 0 ]; then
  exec /work/wt/h-report/.venv/bin/python -m corescale.cli run model=bert-tiny sequence_length=32 duration=1 backend=onnxruntime precision=int8 backend.graph_optimization_level=basic backend.execution_mode=parallel backend.fusion=false instances=2 cores_per_instance=1 batch_size=1 allocator=tcmalloc reference=pytorch openmp=default
fi
if [ "$1" = "--" ]; then shift; fi
if [ "$#" -eq 0 ]; then echo "recipe.sh: give the command to start after --" >&2; exit 2; fi
bind() {  # CPUS NODES -> numactl where it may bind memory here, else taskset (CPUs only)
  if [ -n "$2" ] && command -v numactl >/dev/null 2>&1 && numactl --membind="$2" true 2>/dev/null; then
    echo numactl --physcpubind="$1" --membind="$2"
  else
    echo taskset -c "$1"
  fi
}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
# instance 0: CPUs 0, memory on NUMA node(s) 0, 1 thread(s), batch 1
env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 CORESCALE_INSTANCE_CPUS=0 OMP_PROC_BIND=close OMP_PLACES='{0}' LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 CORESCALE_INSTANCE_INDEX=0 CORESCALE_INSTANCES=2 $(bind 0 0) "$@" &
pids+=($!)
# instance 1: CPUs 1, memory on NUMA node(s) 0, 1 thread(s), batch 1
env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 CORESCALE_INSTANCE_CPUS=1 OMP_PROC_BIND=close OMP_PLACES='{1}' LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 CORESCALE_INSTANCE_INDEX=1 CORESCALE_INSTANCES=2 $(bind 1 0) "$@" &
pids+=($!)
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
