#!/usr/bin/env bash
# Makes the tests/data/gpu_*.jsonl recordings on a GPU machine (run from the repo root, with
# gpuwatch installed): each script under `gpuwatch run --record`, at the default 1 s
# interval, with its own ground truth beside it. Usage: record.sh OUTDIR [all|single|ddp|'NAME NAME...']
set -u
out=${1:?OUTDIR}; what=${2:-all}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
rec() {  # name, then the command
  local name=$1; shift
  local t0=$SECONDS
  (cd "$here" && timeout 200 python3 -m gpuwatch run --quiet --web.listen-address 127.0.0.1:0 \
      --record "$out/gpu_$name.jsonl" -- "$@" --truth "$out/gpu_$name.truth{rank}.json") \
      >"$out/gpu_$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/gpu_$name.jsonl") lines"
}
# the same without the hook: the daemon started on its own (as a systemd service runs it)
# and the job started beside it, not under it
rec_bare() {  # name, then the command
  local name=$1; shift
  local t0=$SECONDS
  (cd "$here" || exit
   python3 -m gpuwatch run --quiet --web.listen-address 127.0.0.1:0 \
      --record "$out/gpu_$name.jsonl" >"$out/gpu_$name.log" 2>&1 &
   d=$!; sleep 5
   timeout 200 "$@" --truth "$out/gpu_$name.truth.json" >>"$out/gpu_$name.job.log" 2>&1
   rc=$?; sleep 5; kill -INT $d; wait $d; exit $rc)
  echo "$name: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/gpu_$name.jsonl") lines"
}
want() { [ "$what" = all ] || [[ " $what " == *" $1 "* ]]; }  # "all", or a list of names
single="fp16_overflow gan starved_cnn fp32_conv manual_lstm leak_oom"
[ "$what" = single ] && what=$single
[ "$what" = ddp ] && what="ddp_slow_rank ddp_balanced ddp_slow_rank_nohook"
want fp16_overflow && rec fp16_overflow python3 fp16_overflow.py --seconds 35
want gan && rec gan python3 gan.py --seconds 45
want starved_cnn && rec starved_cnn python3 starved_cnn.py --seconds 45
# the same CNN with no DataLoader workers: the main process does the numpy augmentation on
# one core (the loading the daemon alone cannot tell from a too-small batch's host cost but
# by the size of the kernels), with the hook and with the daemon on its own
want starved_cnn_w0 && rec starved_cnn_w0 python3 starved_cnn.py --seconds 45 --workers 0
want starved_cnn_w0_bare && rec_bare starved_cnn_w0_bare python3 starved_cnn.py --seconds 45 \
  --workers 0
# the GAN without the hook: its steps' bursts fall between NVML util's samples (util's
# median 0 while GPM has its SMs at work), which GPM's SM activity reads
want gan_bare && rec_bare gan_bare python3 gan.py --seconds 45
want fp32_conv && rec fp32_conv python3 fp32_conv.py --seconds 45
want manual_lstm && rec manual_lstm python3 manual_lstm.py --seconds 45
want leak_oom && rec leak_oom python3 leak_oom.py --fill-seconds 45
want ddp_slow_rank && rec ddp_slow_rank torchrun --standalone --nproc_per_node 2 ddp.py --seconds 45 --slow-rank 1
want ddp_balanced && rec ddp_balanced torchrun --standalone --nproc_per_node 2 ddp.py --seconds 45
if want ddp_slow_rank_nohook; then
  # the same straggler without the hook: the daemon records beside a job it did not start
  (cd "$here" || exit
   python3 -m gpuwatch record "$out/gpu_ddp_slow_rank_nohook.jsonl" --duration 70 \
      >"$out/gpu_ddp_slow_rank_nohook.log" 2>&1 &
   sleep 3; timeout 120 torchrun --standalone --nproc_per_node 2 ddp.py --seconds 45 \
      --slow-rank 1 --truth "$out/gpu_ddp_slow_rank_nohook.truth{rank}.json" \
      >"$out/gpu_ddp_slow_rank_nohook.job.log" 2>&1
   echo "ddp_slow_rank_nohook job: rc=$?"
   wait)
  echo "ddp_slow_rank_nohook: $(wc -l <"$out/gpu_ddp_slow_rank_nohook.jsonl") lines"
fi
