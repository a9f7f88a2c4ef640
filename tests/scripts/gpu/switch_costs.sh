#!/usr/bin/env bash
# The step-time costs docs/advice.md quotes for disable-debug-modes and
# stop-freeing-memory-every-step on loops too short to keep as recordings (2026-12-03, 1x
# H200): tests/scripts/train_cpu.py on the GPU under `gpuwatch run`, each run's median step
# from its own clock (--out, steps 200 on). Run from the repo root, gpuwatch installed.
# Also: what torch's allocator keeps after a free, with PYTORCH_NO_CUDA_MEMORY_CACHING.
set -u
out=${1:-/tmp/switch_costs}; mkdir -p "$out"
cd "$(dirname "$0")/.."
median() {
  python3 - "$1" <<'PY'
import json, statistics, sys
ts = [json.loads(line)["t"] for line in open(sys.argv[1])]
print(f"median step {statistics.median(b - a for a, b in zip(ts[200:], ts[201:])) * 1e3:.2f} ms")
PY
}
run() {  # name, then the command (its train_cpu.py arguments last)
  local name=$1; shift
  timeout 150 python3 -m gpuwatch run --quiet --web.listen-address 127.0.0.1:0 \
    --record "$out/$name.jsonl" -- "$@" --device cuda --workers 0 \
    --out "$out/$name.steps" > "$out/$name.log" 2>&1
  echo "$name: rc=$? $(median "$(ls "$out/$name.steps"* | head -1)")"
}
# empty_cache at every step of a short loop (3.6 -> 5.0 ms on one H200; 5.07 -> 5.01 ms on
# another, 2026-12-03, its steps 70 % waiting on the data the main process loads)
run loop_plain python3 train_cpu.py --steps 1000 --batch 256
run loop_empty_cache python3 train_cpu.py --steps 1000 --batch 256 --empty-cache-every 1
# TORCH_DISTRIBUTED_DEBUG=DETAIL on one NCCL rank (1.56 -> 1.89 ms; 1.69 -> 2.30 ms on
# another H200)
run ddp1_plain torchrun --standalone --nproc_per_node 1 train_cpu.py --dist --steps 3000
run ddp1_detail env TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node 1 \
  train_cpu.py --dist --steps 3000
for v in 1 0; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=$v python3 -c "import torch; x = torch.empty(1 << 20, \
device='cuda'); del x; print('PYTORCH_NO_CUDA_MEMORY_CACHING=$v: reserved after a free', \
torch.cuda.memory_reserved())"
done
