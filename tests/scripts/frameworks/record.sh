#!/usr/bin/env bash
# Makes the tests/data/fw_*.jsonl.gz recordings on a GPU machine (from the repo root, with
# gpuwatch installed): each framework run under `gpuwatch run --record`, at the default
# 1 s interval, its own truth (a TrainerCallback, a Lightning Callback, the loop's clock)
# beside it. Usage: record.sh OUTDIR [all|'NAME NAME...']. It writes OUTDIR/fw_NAME.jsonl;
# tests/data keeps each as `gzip -9n fw_NAME.jsonl` makes it (tests/data/README.md).
set -u
out=${1:?OUTDIR}; what=${2:-all}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
rec() {  # name, seconds allowed, then the command
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  (cd "$here" && timeout "$limit" python3 -m gpuwatch run --quiet \
      --web.listen-address 127.0.0.1:0 --record "$out/fw_$name.jsonl" -- "$@" \
      --out "$out/fw_$name.truth.json") >"$out/fw_$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/fw_$name.jsonl") lines"
}
# the same without the hook: the daemon started on its own (`gpuwatch run --record`, as a
# systemd service runs it) and the job started beside it, not under it
rec_bare() {  # name, seconds allowed, then the command
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  (cd "$here" && {
    python3 -m gpuwatch run --quiet --web.listen-address 127.0.0.1:0 \
      --record "$out/fw_$name.jsonl" & d=$!
    sleep 5
    timeout "$limit" "$@" --out "$out/fw_$name.truth.json"; rc=$?
    sleep 5; kill -INT $d; wait $d; exit $rc
  }) >"$out/fw_$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/fw_$name.jsonl") lines"
}
# a daemon that outlives the job, as the systemd service does: started BEFORE seconds
# ahead (at INTERVAL, its hook socket named by a config file), the job after (under
# `gpuwatch run --`, which reports to that socket too, when HOOK is 1; else on its own),
# and the daemon stopped AFTER seconds past the job's end: the recording is the
# service's, its idle seconds before and after the job included
rec_service() {  # name, seconds allowed, before, after, interval, hook (1/0), the command
  local name=$1 limit=$2 before=$3 after=$4 interval=$5 hook=$6; shift 6
  local t0=$SECONDS sock cfg
  sock=$(mktemp -d)/hook.sock; cfg=$(mktemp --suffix .yaml)
  echo "hook_socket: $sock" > "$cfg"
  (cd "$here" && {
    python3 -m gpuwatch run --quiet --web.listen-address 127.0.0.1:0 --config.file "$cfg" \
      --interval "$interval" --record "$out/fw_$name.jsonl" & d=$!
    sleep "$before"
    if [ "$hook" = 1 ]; then
      GPUWATCH_SOCKET=$sock timeout "$limit" python3 -m gpuwatch run --quiet \
        --web.listen-address 127.0.0.1:0 -- "$@" --out "$out/fw_$name.truth.json"; rc=$?
    else
      timeout "$limit" "$@" --out "$out/fw_$name.truth.json"; rc=$?
    fi
    sleep "$after"; kill -INT $d; wait $d; exit $rc
  }) >"$out/fw_$name.log" 2>&1
  echo "$name: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/fw_$name.jsonl") lines"
}
want() { [ "$what" = all ] || [[ " $what " == *" $1 "* ]]; }
bert="--hidden 768 --layers 12 --seq 128"
# 1. the Trainer evaluating every 20 steps at per_device_eval_batch_size=8: ~70 % of the time
want hf_eval_heavy && rec hf_eval_heavy 150 python3 hf_trainer.py $bert --steps 100000 --seconds 60 \
  --batch 32 --accum 1 --eval-every 20 --eval-batch 8 --eval-samples 2048 --workers 2
# 2. TrainingArguments(tf32=True, bf16=True, torch_compile=True): the hook stays up
want hf_compile_tf32 && rec hf_compile_tf32 200 python3 hf_trainer.py $bert --steps 100000 --seconds 100 \
  --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --tf32-arg --compile \
  --workers 2
# 3. BERT-base in fp32 at batch 8, host-bound (issue: util 60 %, SM 47 %, 4 % of memory)
want hf_bert_b8 && rec hf_bert_b8 150 python3 hf_trainer.py $bert --steps 100000 --seconds 55 --batch 8 \
  --accum 1 --eval-every 100000 --eval-samples 64 --workers 2
# 3b. the Trainer's defaults: fp32, dataloader_num_workers=0, batch 8 (host-bound, no eval)
want hf_default_b8 && rec hf_default_b8 120 python3 hf_trainer.py $bert --steps 100000 --seconds 45 \
  --batch 8 --accum 1 --eval-every 100000 --eval-samples 64 --workers 0
# 3c. the same with the daemon on its own (as a systemd service runs it)
want hf_default_b8_bare && rec_bare hf_default_b8_bare 120 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 8 --accum 1 --eval-every 100000 --eval-samples 64 --workers 0
# 4. gradient checkpointing left on with memory to spare
want hf_grad_ckpt && rec hf_grad_ckpt 150 python3 hf_trainer.py $bert --steps 100000 --seconds 50 --batch 32 \
  --accum 1 --eval-every 100000 --eval-samples 64 --grad-ckpt --bf16 --workers 2
# 5. Accelerate: micro-batch 4, 16 accumulation steps
want accelerate_accum && rec accelerate_accum 150 python3 accelerate_accum.py --micro 4 \
  --accum 16 --steps 100000 --seconds 50 --width 4096
# 6. inference only: generate() at batch 1 under no_grad
want generate && rec generate 120 python3 generate.py --seconds 45 --width 768 --new-tokens 32
# 7. timm ResNet-50 in fp16 with a GradScaler on a GPU that has bf16
want timm_fp16 && rec timm_fp16 150 python3 timm_fp16.py --seconds 45
# 7b. a ViT-B/16 (timm) under Accelerate: in fp32 (TF32 off), with TF32 matmuls, and bf16
# with two workers each spending 4 ms of CPU a sample (the workers cannot keep up)
want accel_vit_fp32 && rec accel_vit_fp32 150 python3 accel_vit.py --mixed no --seconds 35
want accel_vit_tf32 && rec accel_vit_tf32 150 python3 accel_vit.py --mixed no --tf32 --seconds 35
want accel_vit_starved && rec accel_vit_starved 150 python3 accel_vit.py --mixed bf16 --batch 128 \
  --workers 2 --cpu-ms 4 --seconds 35
# 7c. Lightning with TF32 through torch.set_float32_matmul_precision("high"); the Trainer
# evaluating and saving every 40 steps (load_best_model_at_end); generate() at batch 64.
# (the first drafts of lightning_lm.py and gpt2_trainer.py made the recordings: the same
# runs, written up after, and they wrote no truth file)
want lightning_lm_tf32 && rec lightning_lm_tf32 150 python3 lightning_lm.py --precision 32-true \
  --matmul high --batch 16 --accum 1 --seconds 35
want hf_gpt2_eval_save && rec hf_gpt2_eval_save 200 python3 gpt2_trainer.py --precision bf16 \
  --batch 16 --workers 2 --eval-every 40 --output-dir /tmp/ckpt --seconds 50
want generate_b64 && rec generate_b64 120 python3 generate.py --batch 64 --width 1024 --layers 12 \
  --new-tokens 64 --seconds 40
# 7d. Lightning with Trainer(deterministic=True) (cuDNN's benchmark left off on purpose); the
# Trainer's auto_find_batch_size from a batch of 1024 (out-of-memory retries before the first
# step); a ViT whose Dataset crops and blurs each image on two workers; a compiled MLP in a
# plain loop. (First drafts of these scripts made the recordings: the same runs, tidied after)
want lightning_det && rec lightning_det 150 python3 lightning_det.py --seconds 30
want hf_autobatch && rec hf_autobatch 200 python3 gpt2_autobatch.py --seconds 35
want hf_vit_aug && rec hf_vit_aug 150 python3 hf_vit_aug.py --seconds 35
want plain_compiled && rec plain_compiled 150 python3 plain_compiled.py --seconds 30
# 7e. Lightning's Trainer.predict of a ResNet-50 in fp32, round after round (inference only),
# with the hook and without; a Lightning CNN building a new training DataLoader each epoch
# (reload_dataloaders_every_n_epochs=1, epochs of 100 steps)
want lightning_predict && rec lightning_predict 150 python3 lightning_predict.py --seconds 35
want lightning_predict_bare && rec_bare lightning_predict_bare 150 python3 lightning_predict.py \
  --seconds 35
want lightning_cnn_reload && rec lightning_cnn_reload 150 python3 lightning_cnn.py --model resnet18 \
  --size 64 --batch 128 --workers 6 --samples 12800 --reload --seconds 35
# 7f. A text-classification pipeline() of BERT-base fed sentence by sentence (its default
# batch_size=1), with the hook and without, and at batch_size=64 (fp32); Lightning sizing its batch with a BatchSizeFinder
# callback (power mode, 4 trials of 3 steps from 64). (hf_autobatch above was recorded again
# the same day, its hook now reading auto_find_batch_size)
want hf_pipeline && rec hf_pipeline 120 python3 hf_pipeline.py --seconds 35
want hf_pipeline_bare && rec_bare hf_pipeline_bare 120 python3 hf_pipeline.py --seconds 35
want hf_pipeline_b64 && rec hf_pipeline_b64 120 python3 hf_pipeline.py --batch 64 --seconds 35
want lightning_cnn_find && rec lightning_cnn_find 150 python3 lightning_cnn.py --model resnet18 \
  --size 64 --batch 64 --workers 8 --samples 100000 --find-batch 4 --seconds 35
# 7g. Inference that no DataLoader feeds: a BERT-base encoder in bf16 fed slices of 8
# sequences of 64 tokens by its own loop, and sentence-transformers' encode() of a
# 6-layer, 384-wide BERT (MiniLM's shape) at its default batch_size=32; each with the hook
# and without
want infer_loop && rec infer_loop 120 python3 infer_loop.py --batch 8 --seq 64 --bf16 --seconds 35
want infer_loop_bare && rec_bare infer_loop_bare 120 python3 infer_loop.py --batch 8 --seq 64 \
  --bf16 --seconds 35
want st_encode && rec st_encode 120 python3 st_encode.py --seconds 35
want st_encode_bare && rec_bare st_encode_bare 120 python3 st_encode.py --seconds 35
# 7h. Scripts in other people's styles (2026-12-02, fifth session): Accelerate's
# cv_example shape (torchvision ResNet-50, fp16, 2 accumulation steps, a ColorJitter
# augmentation on 4 workers), with the hook and without; a Trainer at micro-batch 4 with 8
# accumulation steps (a 6-layer GPT-2, bf16); a loop on GPU-resident tensors synchronizing
# every step, with the hook and without; Lightning in 16-mixed validating and saving every
# 40 steps (each save 2-3 s); a ViT-B/16 inference loop in fp32, with the hook and without
want accel_resnet_fp16 && rec accel_resnet_fp16 150 python3 accel_resnet.py --seconds 45
want accel_resnet_fp16_bare && rec_bare accel_resnet_fp16_bare 150 python3 accel_resnet.py \
  --seconds 45
want hf_gpt_accum && rec hf_gpt_accum 150 python3 hf_gpt_accum.py --seconds 50
want plain_sync && rec plain_sync 120 python3 plain_sync.py --seconds 35
want plain_sync_bare && rec_bare plain_sync_bare 120 python3 plain_sync.py --seconds 35
# a recommendation model's loop: an EmbeddingBag table of 110M x 128 floats (56 GB, two
# thirds of an H100; sparse gradients, SGD) under a small MLP at batch 256, ids drawn on
# the GPU (no DataLoader, so no batch size): memory held by the table, not the batch's
# activations; many small kernels a step (twenty-third session)
want plain_recsys && rec plain_recsys 150 python3 plain_recsys.py --seconds 35
want plain_recsys_bare && rec_bare plain_recsys_bare 150 python3 plain_recsys.py --seconds 35
# a loop laid out as nanoGPT's train.py: get_batch() from a memmap (no DataLoader), bf16,
# fused AdamW, 5 micro-steps a step, estimate_loss() every 50 steps (twenty-third session)
want nanogpt_like && rec nanogpt_like 180 python3 nanogpt_like.py --seconds 60
want nanogpt_like_bare && rec_bare nanogpt_like_bare 180 python3 nanogpt_like.py --seconds 60
want lightning_fp16_ckpt && rec lightning_fp16_ckpt 150 python3 lightning_fp16_ckpt.py --seconds 45
want infer_vit && rec infer_vit 120 python3 infer_vit.py --seconds 35
want infer_vit_bare && rec_bare infer_vit_bare 120 python3 infer_vit.py --seconds 35
# 7i. What comes after or before the training (same session): Lightning's fit() then
# test(); the Trainer's train() then evaluate() and predict() at eval batch 8; a loop that
# moves its model to the GPU and then preprocesses on the CPU for ~30 s (with the hook and
# without)
want lightning_fit_test && rec lightning_fit_test 150 python3 lightning_test_after_fit.py --seconds 25
want hf_train_predict && rec hf_train_predict 150 python3 hf_train_predict.py --seconds 25
want plain_preprocess && rec plain_preprocess 150 python3 plain_preprocess.py
want plain_preprocess_bare && rec_bare plain_preprocess_bare 150 python3 plain_preprocess.py
# 7j. A loop that trains 20 s, computes a metric in pure Python for 70 s, trains 20 s more
want plain_cpu_pause && rec plain_cpu_pause 200 python3 plain_cpu_pause.py
# 7k. Host work every N steps in a framework's own callback (2026-12-02, sixth session):
#     Lightning's on_train_batch_end computing a metric in pure Python every 50 batches
#     (~1.5 s), with the hook and without it; a TrainerCallback formatting text samples
#     every 40 steps (~1.2 s); and item 65 (epochs restarting 8 workers) without the hook
want lightning_batch_end_metric && rec lightning_batch_end_metric 150 \
  python3 lightning_batch_end_metric.py --seconds 45
want lightning_batch_end_metric_bare && rec_bare lightning_batch_end_metric_bare 150 \
  python3 lightning_batch_end_metric.py --seconds 45
want hf_step_end_samples && rec hf_step_end_samples 150 python3 hf_step_end_samples.py --seconds 45
want lightning_cnn_epochs_bare && rec_bare lightning_cnn_epochs_bare 120 python3 lightning_cnn.py \
  --batch 128 --workers 8 --samples 3840 --precision bf16-mixed --no-persistent --seconds 45
# 7l. Debugging modes left on while training (2026-12-03, seventh session), each beside the
#     same run without it: Lightning's Trainer(detect_anomaly=True) on ResNet-18 (bf16-mixed,
#     batch 256, 12 workers); the Trainer's debug="underflow_overflow" on BERT-base (bf16,
#     batch 32); Accelerate's GPT-2 (bf16, batch 32) with CUDA_LAUNCH_BLOCKING=1
want lightning_cnn_anomaly && rec lightning_cnn_anomaly 150 python3 lightning_cnn.py --batch 256 \
  --workers 12 --precision bf16-mixed --detect-anomaly --seconds 40
want lightning_cnn_bf16 && rec lightning_cnn_bf16 150 python3 lightning_cnn.py --batch 256 \
  --workers 12 --precision bf16-mixed --seconds 40
want hf_debug_overflow && rec hf_debug_overflow 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 40 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2 \
  --debug-overflow
want hf_bert_bf16 && rec hf_bert_bf16 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 40 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2
want accel_clm_launch_blocking && rec accel_clm_launch_blocking 150 env CUDA_LAUNCH_BLOCKING=1 \
  python3 accel_clm.py --per_device_train_batch_size 32 --mixed_precision bf16 --tf32 \
  --num_workers 2 --seconds 40
want accel_clm_bf16_again && rec accel_clm_bf16_again 150 python3 accel_clm.py \
  --per_device_train_batch_size 32 --mixed_precision bf16 --tf32 --num_workers 2 --seconds 40
# 7n. Debugging switches in the environment seen without the hook (2026-12-03, eighth
#     session): 7l's CUDA_LAUNCH_BLOCKING=1 run with the daemon on its own (its trees name
#     the switch), and the same Accelerate GPT-2 with PYTORCH_NO_CUDA_MEMORY_CACHING=1, with
#     and without the hook
want accel_clm_launch_blocking_bare && rec_bare accel_clm_launch_blocking_bare 150 \
  env CUDA_LAUNCH_BLOCKING=1 python3 accel_clm.py --per_device_train_batch_size 32 \
  --mixed_precision bf16 --tf32 --num_workers 2 --seconds 40
want accel_clm_no_alloc_cache && rec accel_clm_no_alloc_cache 150 \
  env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 accel_clm.py --per_device_train_batch_size 32 \
  --mixed_precision bf16 --tf32 --num_workers 2 --seconds 40
want accel_clm_no_alloc_cache_bare && rec_bare accel_clm_no_alloc_cache_bare 150 \
  env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 accel_clm.py --per_device_train_batch_size 32 \
  --mixed_precision bf16 --tf32 --num_workers 2 --seconds 40
# 7o. Memory "freed" as it trains (2026-12-03, eighth session): the Trainer's BERT-base in
#     bf16 at batch 32 (7l's hf_bert_bf16, 933 steps in 40 s on an H200) with a
#     TrainerCallback calling gc.collect() at every step and every 50th, and with
#     TrainingArguments(torch_empty_cache_steps=1) and =10
for v in "gc_every1 --gc-every 1" "gc_every50 --gc-every 50" "empty_cache1 --empty-cache-steps 1" \
         "empty_cache10 --empty-cache-steps 10"; do
  set -- $v; name=hf_bert_$1; shift
  want $name && rec $name 150 python3 hf_trainer.py $bert --steps 100000 --seconds 40 \
    --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2 "$@"
done
# 7p. A run that diverges (2026-12-03, ninth session): 7l's hf_bert_bf16 at
#     learning_rate=1e30 without clipping (max_grad_norm=0): its loss NaN within a few steps
want hf_bert_nan && rec hf_bert_nan 150 python3 hf_trainer.py $bert --steps 100000 --seconds 40 \
  --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2 --lr 1e30 \
  --max-grad-norm 0
# ... and Accelerate's GPT-2 in fp16 (its GradScaler) at learning_rate=1e30
want accel_clm_nan_fp16 && rec accel_clm_nan_fp16 150 python3 accel_clm.py \
  --per_device_train_batch_size 32 --mixed_precision fp16 --num_workers 2 --seconds 40 \
  --learning_rate 1e30
# 7q. (2026-12-03, tenth session) 7's hf_vit_aug with the Trainer's default
#     dataloader_num_workers=0: its images cropped and blurred in the main process, which
#     the steps wait on. With and without the hook: without it, a pegged main process with no
#     workers is all there is to see (the same as a launch-bound loop's)
want hf_vit_aug_w0 && rec hf_vit_aug_w0 150 python3 hf_vit_aug.py --seconds 35 --workers 0
want hf_vit_aug_w0_bare && rec_bare hf_vit_aug_w0_bare 150 python3 hf_vit_aug.py --seconds 35 \
  --workers 0
# 7m. The Trainer under torchrun with one process on one GPU: BERT-base in bf16 at batch 32,
#     with ddp_find_unused_parameters left to its default and set False. (2026-12-03 on an
#     H200: accelerate does not wrap one process's model in DDP there, so the hook saw no
#     DDP and neither run was kept; with several GPUs, run it with --nproc_per_node N)
want hf_ddp1_find_unused && rec hf_ddp1_find_unused 150 torchrun --standalone --nproc_per_node 1 \
  hf_trainer.py $bert --steps 100000 --seconds 40 --batch 32 --accum 1 --eval-every 100000 \
  --eval-samples 64 --bf16 --workers 2
want hf_ddp1_no_find_unused && rec hf_ddp1_no_find_unused 150 torchrun --standalone \
  --nproc_per_node 1 hf_trainer.py $bert --steps 100000 --seconds 40 --batch 32 --accum 1 \
  --eval-every 100000 --eval-samples 64 --bf16 --workers 2 --no-find-unused
# 8. Lightning DDP on every GPU, workers prefetching for a while before the first step
if want lightning_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_ddp 200 python3 lightning_val.py --devices "$n" --steps 100000 --seconds 60 --batch 256 \
    --val-every 250 --val-batch 64 --val-samples 16384 --width 2048 --workers 6 \
    --warm-seconds 20 --precision bf16-mixed
fi
# 8b. Lightning's defaults on one GPU: 32-true, num_workers=0, a small MLP at batch 32
want lightning_default && rec lightning_default 120 python3 lightning_val.py --devices 1 \
  --steps 100000 --seconds 45 --batch 32 --val-every 100000 --val-samples 256 --width 256 --workers 0
want lightning_default_bare && rec_bare lightning_default_bare 120 python3 lightning_val.py --devices 1 \
  --steps 100000 --seconds 45 --batch 32 --val-every 100000 --val-samples 256 --width 256 --workers 0
# 8c. GPU-bound: BERT-large at sequence 512, batch 32, bf16; a wide MLP at batch 2048, bf16-mixed
want hf_large_bf16 && rec hf_large_bf16 150 python3 hf_trainer.py --hidden 1024 --layers 24 --seq 512 \
  --steps 100000 --seconds 50 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 \
  --tf32-arg --workers 4
want lightning_wide_bf16 && rec lightning_wide_bf16 150 python3 lightning_val.py --devices 1 --steps 2500 \
  --seconds 50 --batch 2048 --val-every 100000 --val-samples 2048 --width 16384 --workers 4 \
  --precision bf16-mixed
# 8d. Lightning DDP on every GPU with its defaults: num_workers=0, 32-true, an MLP at batch 32
if want lightning_ddp_default; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_ddp_default 150 python3 lightning_val.py --devices "$n" --steps 100000 --seconds 45 \
    --batch 32 --val-every 100000 --val-samples 256 --width 256 --workers 0
fi
# 8e. Accelerate DDP under torchrun on every GPU: micro-batch 64, no accumulation, no workers
#     (a step count ends it: 60000 over 4 ranks' shards is 15000 steps each)
if want accelerate_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec accelerate_ddp 150 torchrun --standalone --nproc_per_node "$n" accelerate_accum.py --micro 64 \
    --accum 1 --steps 60000 --width 4096
fi
# 9. the Trainer under torchrun on every GPU (DDP): BERT-base at batch 8 per rank in fp32,
#    evaluating every 300 steps; a step count, not a clock, ends it (every rank the same)
if want hf_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_ddp 300 torchrun --standalone --nproc_per_node "$n" hf_trainer.py $bert --steps 1200 \
    --batch 8 --accum 1 --eval-every 300 --eval-batch 8 --eval-samples 2048 --workers 2
fi
# 10-17: scripts in other people's styles (hf_textcls.py: a Dataset that tokenizes per item;
#        lightning_cnn.py: a timm ResNet on images decoded and augmented per item)
# 10. TrainingArguments(fp16=True) on a GPU that has bf16: BERT-base classifier, 4 workers
want hf_fp16 && rec hf_fp16 120 python3 hf_textcls.py --batch 32 --workers 4 --fp16 --seconds 40
# 11. one loader worker tokenizing 64 sentences a batch four times over: the GPU waits
want hf_text_starved && rec hf_text_starved 120 python3 hf_textcls.py --batch 64 --workers 1 \
  --clean-passes 4 --bf16 --seconds 40
# 12. micro-batch 4 with 16 accumulation steps in the Trainer, bf16
want hf_accum && rec hf_accum 120 python3 hf_textcls.py --batch 4 --accum 16 --workers 2 --bf16 \
  --seconds 40
# 13. inference through the Trainer: Trainer.predict at per_device_eval_batch_size=16, fp32
want hf_predict && rec hf_predict 120 python3 hf_textcls.py --batch 16 --workers 2 --predict \
  --seconds 40
# 14. Lightning precision="16-mixed" on a GPU that has bf16: ResNet-18 at batch 256, 12 workers
want lightning_cnn_fp16 && rec lightning_cnn_fp16 120 python3 lightning_cnn.py --batch 256 \
  --workers 12 --precision 16-mixed --seconds 40
# 15. two loader workers, two blur passes an image: the GPU waits (32-true)
want lightning_cnn_starved && rec lightning_cnn_starved 120 python3 lightning_cnn.py --batch 256 \
  --workers 2 --blur 2 --seconds 40
# 16. every other step's input batch kept on the GPU (for an image grid later): memory grows
want lightning_cnn_leak && rec lightning_cnn_leak 120 python3 lightning_cnn.py --batch 128 \
  --workers 8 --precision bf16-mixed --leak 2 --seconds 40
# 17. micro-batch 16 with accumulate_grad_batches=16, bf16-mixed
want lightning_cnn_accum && rec lightning_cnn_accum 120 python3 lightning_cnn.py --batch 16 \
  --accum 16 --workers 4 --precision bf16-mixed --seconds 40
# 18. Lightning DDP on every GPU whose last rank has half the loader workers and twice the
#     augmentation: it holds the others back (bf16-mixed, ResNet-18 at batch 128 per rank)
if want lightning_cnn_slow_rank; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_cnn_slow_rank 150 python3 lightning_cnn.py --devices "$n" --batch 128 --workers 6 \
    --precision bf16-mixed --slow-rank $((n - 1)) --seconds 45
fi
# 19. the Trainer under torchrun on every GPU with fp16=True (a GPU that has bf16)
if want hf_fp16_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_fp16_ddp 150 torchrun --standalone --nproc_per_node "$n" hf_textcls.py --batch 32 \
    --workers 4 --fp16 --seconds 45
fi
# 20-22: checkpoints saved too often (the hook counts each save and times it as the
#        checkpoint phase)
# 20. the Trainer saving its whole state (BERT-base, AdamW) every 50 steps, bf16
want hf_save && rec hf_save 120 python3 hf_textcls.py --batch 32 --workers 4 --bf16 \
  --save-every 50 --seconds 40
# 21. Lightning's ModelCheckpoint(every_n_train_steps=10) on a timm ResNet-50, bf16-mixed
want lightning_cnn_ckpt && rec lightning_cnn_ckpt 120 python3 lightning_cnn.py --model resnet50 \
  --batch 256 --workers 12 --precision bf16-mixed --ckpt-every 10 --seconds 40
# 22. Accelerate: accelerator.save_state() every 200 optimizer steps (an MLP, AdamW)
want accelerate_save && rec accelerate_save 120 python3 accelerate_accum.py --micro 64 --accum 1 \
  --width 4096 --steps 100000 --seconds 40 --save-every 200
# 23-27: accel_clm.py, laid out as Hugging Face's run_clm_no_trainer.py (Accelerate, a
#        GPT-2 from its config at blocks of 512 tokens, AdamW with a linear schedule)
# 23. mixed_precision="no" (fp32) at per_device_train_batch_size=8
want accel_clm_fp32 && rec accel_clm_fp32 120 python3 accel_clm.py \
  --per_device_train_batch_size 8 --mixed_precision no --num_workers 2 --seconds 40
# 24. bf16, evaluating perplexity every 25 steps over 2048 blocks at eval batch 4
want accel_clm_eval && rec accel_clm_eval 150 python3 accel_clm.py \
  --per_device_train_batch_size 16 --per_device_eval_batch_size 4 --mixed_precision bf16 \
  --eval_every 25 --eval_samples 2048 --num_workers 2 --seconds 45
# 25. bf16 at batch 32 with TF32 on: GPU-bound, little to change
want accel_clm_bf16 && rec accel_clm_bf16 120 python3 accel_clm.py \
  --per_device_train_batch_size 32 --mixed_precision bf16 --tf32 --num_workers 2 --seconds 40
# 26. gradient checkpointing on at batch 8 in bf16, the GPU's memory mostly free
want accel_clm_grad_ckpt && rec accel_clm_grad_ckpt 120 python3 accel_clm.py \
  --per_device_train_batch_size 8 --mixed_precision bf16 --gradient_checkpointing \
  --num_workers 2 --seconds 40
# 27. on every GPU under torchrun: bf16 at batch 16 per rank (a step count ends it)
if want accel_clm_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec accel_clm_ddp 200 torchrun --standalone --nproc_per_node "$n" accel_clm.py \
    --per_device_train_batch_size 16 --mixed_precision bf16 --num_workers 2 \
    --max_train_steps 500 --seconds 100000
fi
# 28. the Trainer under torchrun on every GPU saving its whole state every 50 steps
if want hf_save_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_save_ddp 150 torchrun --standalone --nproc_per_node "$n" hf_textcls.py --batch 32 \
    --workers 4 --bf16 --save-every 50 --seconds 45
fi
# 29. Lightning DDP on every GPU with ModelCheckpoint(every_n_train_steps=10): rank 0
#     writes, the others wait for it (ResNet-50, bf16-mixed)
if want lightning_cnn_ckpt_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_cnn_ckpt_ddp 150 python3 lightning_cnn.py --devices "$n" --model resnet50 \
    --batch 256 --workers 6 --precision bf16-mixed --ckpt-every 10 --seconds 40
fi
# 30. accel_clm.py under torchrun on every GPU, rank 0 alone evaluating perplexity over
#     1024 blocks every 50 steps (if accelerator.is_main_process): the others wait for it
if want accel_clm_eval_main_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec accel_clm_eval_main_ddp 200 torchrun --standalone --nproc_per_node "$n" accel_clm.py \
    --per_device_train_batch_size 16 --per_device_eval_batch_size 8 --mixed_precision bf16 \
    --eval_every 50 --eval_samples 1024 --eval_on_main_only --num_workers 2 \
    --max_train_steps 400 --seconds 100000
fi
# 31. the Trainer started with python (no torchrun) on a host of several GPUs: it wraps the
#     model in torch.nn.DataParallel over all of them (one process, n_gpu > 1)
want hf_dp && rec hf_dp 150 python3 hf_textcls.py --batch 32 --workers 4 --bf16 --seconds 45
# 32. a hand-written loop with torch.nn.DataParallel over every GPU (ResNet-50, bf16, 128
#     images per GPU); 33. the same loop as one torchrun rank per GPU (DDP), for comparison
want dp_loop && rec dp_loop 150 python3 dp_loop.py --batch 128 --workers 8 --seconds 45
if want dp_loop_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec dp_loop_ddp 150 torchrun --standalone --nproc_per_node "$n" dp_loop.py --ddp --batch 128 \
    --workers 8 --seconds 45
fi
# 34. accel_clm.py under torchrun on every GPU with FSDP (full shard, GPT2Block wrapped,
#     bf16), as accelerate config writes it; 35. the same with cpu_offload=True; 36. FSDP
#     with each rank stopping on its own clock: one stops, the others wait in their next
#     all-gather until the 200 s limit kills the job (a hang)
for v in fsdp fsdp_offload fsdp_hang; do
  if want accel_clm_$v; then
    n=$(python3 -c "import torch; print(torch.cuda.device_count())")
    extra="--fsdp"; [ $v = fsdp_offload ] && extra="--fsdp --fsdp_offload"
    [ $v = fsdp_hang ] && extra="--fsdp --stop_each_rank"
    rec accel_clm_$v 200 torchrun --standalone --nproc_per_node "$n" accel_clm.py $extra \
      --per_device_train_batch_size 16 --mixed_precision bf16 --num_workers 2 \
      --max_train_steps 100000 --seconds 45
  fi
done
# 37. accel_clm.py under torchrun on every GPU with FSDP2 (fully_shard, fsdp_version=2); 38. the
#     same with cpu_offload=True (CPUOffloadPolicy: the shards and the optimizer on the CPU)
for v in fsdp2 fsdp2_offload; do
  if want accel_clm_$v; then
    n=$(python3 -c "import torch; print(torch.cuda.device_count())")
    extra="--fsdp --fsdp_version 2"; [ $v = fsdp2_offload ] && extra="$extra --fsdp_offload"
    rec accel_clm_$v 200 torchrun --standalone --nproc_per_node "$n" accel_clm.py $extra \
      --per_device_train_batch_size 16 --mixed_precision bf16 --num_workers 2 \
      --max_train_steps 100000 --seconds 45
  fi
done
# 39. the Trainer under torchrun on every GPU fine-tuning LoRA adapters (peft, rank 8 on the
#     attention's query and value; BERT-base frozen), bf16, batch 32 per rank
if want hf_lora_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_lora_ddp 150 torchrun --standalone --nproc_per_node "$n" hf_textcls.py --batch 32 \
    --workers 4 --bf16 --lora 8 --seconds 45
fi
# 40. Trainer.predict under torchrun on every GPU (distributed inference), fp32, batch 16,
#     the ranks agreeing when to stop; 40b. each rank stopping on its own clock: one starts
#     a round fewer, the others wait in its gather until the 150 s limit kills the job
for v in hf_predict_ddp hf_predict_ddp_hang; do
  if want $v; then
    n=$(python3 -c "import torch; print(torch.cuda.device_count())")
    extra=""; [ $v = hf_predict_ddp_hang ] && extra="--stop-each-rank"
    rec $v 150 torchrun --standalone --nproc_per_node "$n" hf_textcls.py --batch 16 \
      --workers 2 --predict --seconds 40 $extra
  fi
done
# 41. the Trainer under torchrun on every GPU at micro-batch 4 with 16 accumulation steps, bf16
if want hf_accum_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_accum_ddp 150 torchrun --standalone --nproc_per_node "$n" hf_textcls.py --batch 4 \
    --accum 16 --workers 2 --bf16 --seconds 40
fi
# 42. two single-GPU jobs on one host under one daemon, each given a GPU by
#     CUDA_VISIBLE_DEVICES (the second GPU and the last; the others idle): the Trainer in fp16
#     (BERT-base, 4 workers) and Lightning's ResNet-18 starved by two workers blurring twice
if want two_jobs; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  if [ "$n" -ge 2 ]; then
    t0=$SECONDS
    (cd "$here" && timeout 150 python3 -m gpuwatch run --quiet \
        --web.listen-address 127.0.0.1:0 --record "$out/fw_two_jobs.jsonl" -- bash -c "
        CUDA_VISIBLE_DEVICES=1 python3 hf_textcls.py --batch 32 --workers 4 --fp16 \
          --seconds 45 --out $out/fw_two_jobs.truth_fp16.json &
        CUDA_VISIBLE_DEVICES=$((n - 1)) python3 lightning_cnn.py --batch 256 --workers 2 \
          --blur 2 --seconds 45 --out $out/fw_two_jobs.truth_starved.json
        wait") >"$out/fw_two_jobs.log" 2>&1
    echo "two_jobs: rc=$? $((SECONDS - t0)) s, $(wc -l <"$out/fw_two_jobs.jsonl") lines"
  fi
fi
# 43. Lightning's own BoringModel demo with the Trainer's defaults (a Linear(32, 2) at the
#     DataLoader's default batch of 1, epochs of 64 samples, validation and a checkpoint every
#     epoch), for 40 s: on one GPU; 44. on every GPU (DDP)
want lightning_boring && rec lightning_boring 120 python3 lightning_boring.py --devices 1 \
  --seconds 40
if want lightning_boring_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_boring_ddp 150 python3 lightning_boring.py --devices "$n" --seconds 40
fi
# 45. item 44 without the hook (rec_bare: the daemon on its own, the job beside it)
if want lightning_boring_ddp_bare; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec_bare lightning_boring_ddp_bare 150 python3 lightning_boring.py --devices "$n" --seconds 40
fi
# 46. item 40b without the hook: Trainer.predict's ranks hanging in a gather, seen by a
#     daemon that never heard from the job
if want hf_predict_ddp_hang_bare; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec_bare hf_predict_ddp_hang_bare 150 torchrun --standalone --nproc_per_node "$n" \
    hf_textcls.py --batch 16 --workers 2 --predict --seconds 40 --stop-each-rank
fi
# 47. the Trainer fine-tuning LoRA adapters (peft, rank 8) with gradient_checkpointing=True
#     on one GPU, bf16, batch 32: the frozen BERT-base recomputed for adapters that need
#     little memory
want hf_lora_gc && rec hf_lora_gc 120 python3 hf_textcls.py --batch 32 --workers 4 --bf16 \
  --lora 8 --grad-ckpt --seconds 40
# 48. the Trainer evaluating every epoch (eval_strategy="epoch"; eval_steps=50 left in the
#     arguments, unused): epochs of 100 steps of 32, each followed by 2048 samples at eval
#     batch 8, bf16
want hf_eval_epoch && rec hf_eval_epoch 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 32 --accum 1 --eval-epoch --eval-every 50 --train-samples 3200 \
  --eval-batch 8 --eval-samples 2048 --bf16 --workers 2
# 49. Lightning's own Transformer demo (LightningTransformer: DataLoader(dataset), batch 1,
#     fp32, SGD) with the Trainer's defaults on one GPU; 50. Lightning's own LSTM demo
#     (LightningLSTM: batches of 20 made by its SequenceSampler, a batch_sampler); 51. the
#     README's Fabric loop around the same Transformer at batch 64 in 32-true
want lightning_transformer && rec lightning_transformer 120 python3 lightning_demos.py \
  --model transformer --devices 1 --seconds 40
want lightning_lstm && rec lightning_lstm 120 python3 lightning_demos.py --model lstm \
  --devices 1 --seconds 40
want fabric_fp32 && rec fabric_fp32 120 python3 lightning_demos.py --model fabric --devices 1 \
  --batch 64 --precision 32-true --seconds 40
# 52. the Fabric loop on every GPU (DDP), bf16-mixed, micro-batch 8 with 8 micro-batches per
#     step under fabric.no_backward_sync; 53. Lightning's Transformer demo on every GPU; 54.
#     the same without the hook (rec_bare). (The LSTM demo does not run under DDP: Lightning
#     cannot put a distributed sampler into a batch sampler that is no BatchSampler.)
if want fabric_accum_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec fabric_accum_ddp 150 python3 lightning_demos.py --model fabric --devices "$n" --batch 8 \
    --accum 8 --precision bf16-mixed --seconds 40
fi
if want lightning_transformer_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_transformer_ddp 150 python3 lightning_demos.py --model transformer \
    --devices "$n" --seconds 40
fi
if want lightning_transformer_ddp_bare; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec_bare lightning_transformer_ddp_bare 150 python3 lightning_demos.py --model transformer \
    --devices "$n" --seconds 40
fi
# 55. accel_clm.py started by `accelerate launch --multi_gpu` on every GPU (not torchrun: the
#     launcher's own process tree), with its defaults: fp32 (mixed_precision="no"), batch 8,
#     GPT-2 small at 512 tokens; 56. the same without the hook (rec_bare)
for v in accel_clm_launch accel_clm_launch_bare; do
  if want $v; then
    n=$(python3 -c "import torch; print(torch.cuda.device_count())")
    r=rec; [ $v = accel_clm_launch_bare ] && r=rec_bare
    $r $v 200 accelerate launch --multi_gpu --num_processes "$n" --num_machines 1 \
      --mixed_precision no --dynamo_backend no accel_clm.py --per_device_train_batch_size 8 \
      --num_workers 2 --max_train_steps 100000 --seconds 45
  fi
done
# 57. the Fabric loop in 16-mixed (fp16 autocast and Fabric's GradScaler) at batch 64 on one
#     GPU that has bf16; 58. the Trainer's defaults on a GPU-bound model: BERT-large at
#     sequence 512, batch 16, fp32 (no bf16, no tf32)
want fabric_fp16 && rec fabric_fp16 120 python3 lightning_demos.py --model fabric --devices 1 \
  --batch 64 --precision 16-mixed --seconds 40
want hf_large_fp32 && rec hf_large_fp32 150 python3 hf_trainer.py --hidden 1024 --layers 24 \
  --seq 512 --steps 100000 --seconds 50 --batch 16 --accum 1 --eval-every 100000 \
  --eval-samples 64 --workers 4
# 59. generate() at batch 1 from a GPT-2 of 24 layers at width 1024 (~1.3 GB in fp32) loaded
#     with from_pretrained(device_map="auto") and 500 MiB allowed per GPU: its layers spread
#     over every GPU, one process using them in turn; 60. the same without the hook
for v in generate_device_map generate_device_map_bare; do
  if want $v; then
    r=rec; [ $v = generate_device_map_bare ] && r=rec_bare
    $r $v 150 python3 generate.py --seconds 45 --width 1024 --layers 24 --new-tokens 32 \
      --device-map auto --gpu-mib 500
  fi
done
# 61. Lightning's FSDPStrategy(cpu_offload=True) on every GPU: an MLP of width 2048 at batch
#     256 per rank, bf16-mixed, 2 workers (the parameters and optimizer state on the CPU)
if want lightning_fsdp_offload; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_fsdp_offload 150 python3 lightning_val.py --devices "$n" --strategy fsdp_offload \
    --steps 100000 --seconds 40 --batch 256 --val-every 100000 --val-samples 512 --width 2048 \
    --workers 2 --precision bf16-mixed
fi
# 62. item 8c (BERT-large at sequence 512, batch 32, bf16) with gradient_checkpointing=True:
#     how much memory checkpointing saves there, against 8c's own peak without it
want hf_large_gc && rec hf_large_gc 150 python3 hf_trainer.py --hidden 1024 --layers 24 --seq 512 \
  --steps 100000 --seconds 50 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 \
  --tf32-arg --workers 4 --grad-ckpt
# 63. the Trainer under torchrun on every GPU with torch_compile=True, bf16, BERT-base at batch
#     32 per rank, 1000 steps (a step count: every rank stops at the same one): each rank
#     compiles before its first steps
if want hf_compile_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec hf_compile_ddp 240 torchrun --standalone --nproc_per_node "$n" hf_trainer.py $bert \
    --steps 1000 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
    --bf16 --tf32-arg --compile --workers 2
fi
# 64. Lightning with the model compiled in the module (torch.compile(timm ResNet-50)),
#     bf16-mixed, batch 256, 12 workers: the first steps wait for the compile
want lightning_cnn_compile && rec lightning_cnn_compile 200 python3 lightning_cnn.py \
  --model resnet50 --batch 256 --workers 12 --precision bf16-mixed --compile --seconds 100
# 65. Lightning with short epochs (30 steps of 128) and the DataLoader's default
#     persistent_workers=False: 8 workers started anew every epoch, bf16-mixed
want lightning_cnn_epochs && rec lightning_cnn_epochs 120 python3 lightning_cnn.py \
  --batch 128 --workers 8 --samples 3840 --precision bf16-mixed --no-persistent --seconds 45
# 66. 40 loader workers on a host of fewer cores, three blur passes an item, bf16-mixed at
#     batch 256: the host's CPU is the limit
want lightning_cnn_oversubscribed && rec lightning_cnn_oversubscribed 120 python3 \
  lightning_cnn.py --batch 256 --workers 40 --blur 3 --precision bf16-mixed --seconds 45
# 67. the Trainer at a batch that does not fit: BERT-large at sequence 512, batch 184, bf16
#     with TF32 (item 8c at batch 32 peaked at 15.8 GiB; meant to fill most of the memory, it
#     died of CUDA out-of-memory on its second step); on the first GPU only (on a host of
#     several, the others idle beside it)
want hf_large_oom && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} rec hf_large_oom 200 \
  python3 hf_trainer.py --hidden 1024 --layers 24 --seq 512 --steps 100000 --seconds 60 \
  --batch 184 --accum 1 --train-samples 18400 --eval-every 100000 --eval-samples 64 --bf16 \
  --tf32-arg --workers 4
# 68. item 64 on every GPU (DDP): each rank compiles; 6 workers a rank
if want lightning_cnn_compile_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_cnn_compile_ddp 200 python3 lightning_cnn.py --devices "$n" --model resnet50 \
    --batch 256 --workers 6 --precision bf16-mixed --compile --seconds 100
fi
# 69. item 65 on every GPU (DDP): 30 steps of 128 per rank an epoch, 6 workers a rank
#     started anew every epoch
if want lightning_cnn_epochs_ddp; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  rec lightning_cnn_epochs_ddp 150 python3 lightning_cnn.py --devices "$n" --batch 128 \
    --workers 6 --samples $((3840 * n)) --precision bf16-mixed --no-persistent --seconds 45
fi
# 70. item 67 at a batch that fits: BERT-large at sequence 512, batch 152 (about 86 % of
#     the memory at its peak), bf16 with TF32: GPU-bound, the memory mostly taken
want hf_large_fits && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} rec hf_large_fits 200 \
  python3 hf_trainer.py --hidden 1024 --layers 24 --seq 512 --steps 100000 --seconds 60 \
  --batch 152 --accum 1 --train-samples 15200 --eval-every 100000 --eval-samples 64 --bf16 \
  --tf32-arg --workers 4
# 71. the Trainer evaluating at a batch that does not fit: BERT-large at sequence 512,
#     training batch 16, per_device_eval_batch_size=16384 every 10 steps, bf16
want hf_eval_oom && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} rec hf_eval_oom 200 \
  python3 hf_trainer.py --hidden 1024 --layers 24 --seq 512 --steps 100000 --seconds 60 \
  --batch 16 --accum 1 --train-samples 1600 --eval-every 10 --eval-batch 16384 \
  --eval-samples 16384 --bf16 --tf32-arg --workers 4
# 72. Lightning at a batch that does not fit: timm ResNet-50 at batch 32768 (about 4 MiB of
#     activations a sample in bf16-mixed), 8 workers, no blur
want lightning_cnn_oom && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} rec lightning_cnn_oom \
  150 python3 lightning_cnn.py --model resnet50 --batch 32768 --workers 8 --blur 0 \
  --precision bf16-mixed --seconds 40
# 73. a GPT-2 (768 wide, 6 layers, vocabulary 50257) under the Trainer with dynamic
#     padding: samples of 64 to 512 tokens padded to each batch's longest, batch 16, bf16,
#     2 workers; with the hook and without it (the daemon beside the job)
clm="--hidden 768 --layers 6 --heads 12 --vocab 50257 --seq 512"
want hf_clm_dynamic && rec hf_clm_dynamic 150 python3 hf_clm.py $clm --dynamic --min-len 64 \
  --steps 100000 --seconds 60 --batch 16 --bf16 --workers 2
want hf_clm_dynamic_bare && rec_bare hf_clm_dynamic_bare 150 python3 hf_clm.py $clm --dynamic \
  --min-len 64 --steps 100000 --seconds 60 --batch 16 --bf16 --workers 2
# 74. the model put on the GPU, then 30 s of one-process tokenization before the Trainer
#     trains (fixed length 512, batch 16, bf16, 40 s); with the hook and without it
want hf_clm_preprocess && rec hf_clm_preprocess 150 python3 hf_clm.py $clm \
  --preprocess-seconds 30 --steps 100000 --seconds 70 --batch 16 --bf16 --workers 2
want hf_clm_preprocess_bare && rec_bare hf_clm_preprocess_bare 150 python3 hf_clm.py $clm \
  --preprocess-seconds 30 --steps 100000 --seconds 70 --batch 16 --bf16 --workers 2
# 75. compute_metrics without preprocess_logits_for_metrics: every evaluation keeps its
#     batches' logits (512 x 50257 a sample) on the GPU until it ends; 256 samples at eval
#     batch 16 every 200 steps
want hf_clm_eval_logits && rec hf_clm_eval_logits 150 python3 hf_clm.py $clm --steps 100000 \
  --seconds 60 --batch 16 --bf16 --workers 2 --eval-every 200 --eval-samples 256 \
  --eval-batch 16 --metrics
# 76. item 73 under torchrun on every GPU (DDP): each rank's batches of their own lengths,
#     so a different rank is the slowest at each step; with the hook and without it
if want hf_clm_dynamic_ddp || want hf_clm_dynamic_ddp_bare; then
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  want hf_clm_dynamic_ddp && rec hf_clm_dynamic_ddp 200 torchrun --standalone \
    --nproc_per_node "$n" hf_clm.py $clm --dynamic --min-len 64 --steps 100000 --seconds 60 \
    --batch 16 --bf16 --workers 2
  want hf_clm_dynamic_ddp_bare && rec_bare hf_clm_dynamic_ddp_bare 200 torchrun --standalone \
    --nproc_per_node "$n" hf_clm.py $clm --dynamic --min-len 64 --steps 100000 --seconds 60 \
    --batch 16 --bf16 --workers 2
fi
# 77. an evaluation before training: trainer.evaluate() before trainer.train() (BERT-base,
#     2,048 batches of 8, then 45 s of training at batch 32), with the hook and without it;
#     Lightning's trainer.validate() before trainer.fit()
want hf_eval_first && rec hf_eval_first 200 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-batch 8 --eval-samples 16384 \
  --evaluate-first --workers 2
want hf_eval_first_bare && rec_bare hf_eval_first_bare 200 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-batch 8 \
  --eval-samples 16384 --evaluate-first --workers 2
want lightning_val_first && rec lightning_val_first 200 python3 lightning_val.py --devices 1 \
  --steps 100000 --seconds 45 --batch 256 --val-every 100000 --val-batch 8 --val-samples 65536 \
  --val-ms 1 --width 2048 --workers 2 --validate-first
# 78. Seq2SeqTrainer(predict_with_generate=True): a T5 of 6 layers whose evaluations
#     generate up to 64 tokens for 256 sequences at batch 16; evaluated before training by
#     trainer.evaluate(), or by eval_on_start=True (the optimizer built first)
s2s="--width 512 --layers 6 --seq 128 --batch 32 --eval-batch 16 --eval-samples 256 --gen-len 64 \
  --eval-every 400 --steps 100000 --seconds 60 --bf16 --workers 2"
want hf_s2s_eval_first && rec hf_s2s_eval_first 200 python3 hf_seq2seq.py $s2s --evaluate-first
want hf_s2s_on_start && rec hf_s2s_on_start 200 python3 hf_seq2seq.py $s2s --eval-on-start
# 7r. (2026-12-03, twelfth session) the bare twins of three runs whose NVML util misses
#     their work (its median 0 over most 15 s windows while GPM has the SMs at work): a
#     TrainerCallback's text samples every 40 steps, Lightning's fp16 with a checkpoint
#     every 40 steps, the Trainer's ViT with its augmentation on 4 workers
want hf_step_end_samples_bare && rec_bare hf_step_end_samples_bare 150 \
  python3 hf_step_end_samples.py --seconds 45
want lightning_fp16_ckpt_bare && rec_bare lightning_fp16_ckpt_bare 150 \
  python3 lightning_fp16_ckpt.py --seconds 45
want hf_vit_aug_bare && rec_bare hf_vit_aug_bare 150 python3 hf_vit_aug.py --seconds 35
# and the Trainer evaluating every 20 steps at eval batch 8 (1.), without the hook
want hf_eval_heavy_bare && rec_bare hf_eval_heavy_bare 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 60 --batch 32 --accum 1 --eval-every 20 --eval-batch 8 --eval-samples 2048 --workers 2
# 7s. (2026-12-04, thirteenth session) three and a half minutes rather than one, so the windows of a
#     minute and more fill and what a run drifts into over time shows: GPT-2 with dynamic
#     padding (73.) evaluating 512 samples every 600 steps, with the hook and without it;
#     Lightning's short epochs without persistent workers (65.), with and without it; the
#     Trainer's BERT-base (bf16, batch 32, 4 workers) saving every 600 steps
want hf_clm_dynamic_long && rec hf_clm_dynamic_long 330 python3 hf_clm.py $clm --dynamic \
  --min-len 64 --steps 100000 --seconds 210 --batch 16 --bf16 --workers 2 --eval-every 600 \
  --eval-samples 512 --eval-batch 16
want hf_clm_dynamic_long_bare && rec_bare hf_clm_dynamic_long_bare 330 python3 hf_clm.py $clm \
  --dynamic --min-len 64 --steps 100000 --seconds 210 --batch 16 --bf16 --workers 2 \
  --eval-every 600 --eval-samples 512 --eval-batch 16
want lightning_cnn_epochs_long && rec lightning_cnn_epochs_long 330 python3 lightning_cnn.py \
  --batch 128 --workers 8 --samples 3840 --precision bf16-mixed --no-persistent --seconds 210
want lightning_cnn_epochs_long_bare && rec_bare lightning_cnn_epochs_long_bare 330 python3 \
  lightning_cnn.py --batch 128 --workers 8 --samples 3840 --precision bf16-mixed --no-persistent \
  --seconds 210
want hf_save_long && rec hf_save_long 330 python3 hf_textcls.py --batch 32 --workers 4 --bf16 \
  --save-every 600 --seconds 210
# 7t. (2026-12-04, fourteenth session) training that evaluates 35-65 % of the time since
#     its first step (in fp32, in bf16): the Trainer's BERT-base evaluating every 40
#     steps at eval batch 16 (with the hook and without it, and the same in bf16), and
#     Lightning's MLP in 32-true validating every 50 steps
mid="$bert --steps 100000 --seconds 60 --batch 32 --accum 1 --eval-every 40 --eval-batch 16 \
  --eval-samples 2048 --workers 2"
want hf_eval_mid_fp32 && rec hf_eval_mid_fp32 150 python3 hf_trainer.py $mid
want hf_eval_mid_fp32_bare && rec_bare hf_eval_mid_fp32_bare 150 python3 hf_trainer.py $mid
want hf_eval_mid_bf16 && rec hf_eval_mid_bf16 150 python3 hf_trainer.py $mid --bf16
want lightning_val_fp32 && rec lightning_val_fp32 150 python3 lightning_val.py --devices 1 \
  --steps 100000 --seconds 50 --batch 256 --val-every 50 --val-batch 32 --val-samples 4096 \
  --width 2048 --workers 2
# 7u. (2026-12-04, fifteenth session) settings that hold however much the job evaluates:
#     7t's BERT-base Trainer in bf16 evaluating every 40 steps at eval batch 16 (a third
#     of the time), and 1.'s every 20 steps at eval batch 8 (two thirds), with gradient
#     checkpointing left on (memory to spare) or a TrainerCallback calling gc.collect()
#     at every step
heavy="$bert --steps 100000 --seconds 60 --batch 32 --accum 1 --eval-every 20 --eval-batch 8 \
  --eval-samples 2048 --workers 2"
want hf_eval_mid_grad_ckpt && rec hf_eval_mid_grad_ckpt 150 python3 hf_trainer.py $mid --bf16 \
  --grad-ckpt
want hf_eval_mid_gc_every1 && rec hf_eval_mid_gc_every1 150 python3 hf_trainer.py $mid --bf16 \
  --gc-every 1
want hf_eval_heavy_grad_ckpt && rec hf_eval_heavy_grad_ckpt 150 python3 hf_trainer.py $heavy \
  --bf16 --grad-ckpt
want hf_eval_heavy_gc_every1 && rec hf_eval_heavy_gc_every1 150 python3 hf_trainer.py $heavy \
  --bf16 --gc-every 1
# 7v. (2026-12-04, fifteenth session) what the steps say, however much the job validates:
#     7e's lightning_cnn_reload (the training DataLoader built anew each epoch, persistent
#     workers) validating 3,200 images at batch 16 at each epoch's end, and
#     lightning_batch_end_metric (a 1.5 s metric in Python every 50 batches) validating
#     8,192 samples at batch 8 every 100 batches
want lightning_cnn_reload_val && rec lightning_cnn_reload_val 150 python3 lightning_cnn.py \
  --model resnet18 --size 64 --batch 128 --workers 6 --samples 12800 --reload \
  --val-samples 3200 --val-batch 16 --seconds 35
want lightning_batch_end_metric_val && rec lightning_batch_end_metric_val 150 \
  python3 lightning_batch_end_metric.py --seconds 45 --val-every 100 --val-samples 8192 \
  --val-batch 8
# 7w. (2026-12-04, seventeenth session) evaluating on the training data: the tutorials' CNN
#     loop measuring its training accuracy after each epoch (model.eval(), the training
#     loader again under torch.no_grad(), then the test set), and Lightning validating on
#     the loader it trains on; each with the loop's own clock around the evaluations
want plain_train_acc && rec plain_train_acc 150 python3 shared_loaders.py --loop plain --seconds 35
want lightning_val_on_train && rec lightning_val_on_train 150 python3 shared_loaders.py \
  --loop lightning --seconds 35
#     Lightning training on two loaders read side by side (a dict from train_dataloader():
#     its CombinedLoader), validating on a third each epoch
want lightning_combined && rec lightning_combined 150 python3 shared_loaders.py --loop combined \
  --seconds 35
# 7x. (2026-12-05, eighteenth session) Lightning's manual optimization as its GAN example
#     writes it (the generator's backward() and step, then the discriminator's, each
#     batch), streamed from an IterableDataset, validated each epoch: iterations, no
#     micro-batches, and so no accumulation advice; with the hook and without it
want lightning_gan && rec lightning_gan 150 python3 lightning_gan.py --val --iterable \
  --batch 256 --samples 51200 --workers 4 --seconds 45
want lightning_gan_bare && rec_bare lightning_gan_bare 150 python3 lightning_gan.py --val \
  --iterable --batch 256 --samples 51200 --workers 4 --seconds 45
#     two BERT-base models trained one after the other, each by a Trainer of its own, the
#     first kept (a sweep keeping its results): both Trainers' steps counted
want hf_two_trainers && rec hf_two_trainers 150 python3 hf_trainer.py $bert --runs 2 \
  --steps 300 --batch 32 --accum 2 --eval-every 100000 --eval-samples 64 --bf16 --workers 2
#     the same, the first in fp16 (the Trainer's GradScaler), the second in bf16 (none):
#     the second run's steps counted once no scaler clocks them
want hf_fp16_then_bf16 && rec hf_fp16_then_bf16 150 python3 hf_trainer.py $bert --runs 2 \
  --fp16-first --bf16 --steps 300 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --workers 2
#     two Lightning fits one after the other, each by a Trainer of its own, the first kept
want lightning_two_fits && rec lightning_two_fits 150 python3 lightning_two_fits.py \
  --batch 256 --samples 512000 --epochs 2
# 7y. (2026-12-05, nineteenth session) TRL's trainers (Trainer subclasses; trl and datasets
#     travel as wheels where the image lacks them): SFTTrainer on a GPT-2 (12 layers, 768
#     wide, from its config) at micro-batch 8 with 2 accumulation steps in bf16, with
#     SFTConfig's own defaults (gradient checkpointing on), evaluating every 100 steps;
#     GRPOTrainer generating 8 completions of 64 tokens per prompt at each step
want trl_sft && rec trl_sft 150 python3 trl_sft.py --trainer sft --hidden 768 --layers 12 \
  --seq 512 --batch 8 --accum 2 --bf16 --eval-every 100 --eval-samples 512 --eval-batch 8 \
  --steps 400 --seconds 40
want trl_grpo && rec trl_grpo 150 python3 trl_sft.py --trainer grpo --hidden 768 --layers 12 \
  --batch 16 --generations 8 --new-tokens 64 --bf16 --steps 400 --seconds 40
# 7z. (2026-12-05, twenty-first session) training that evaluates or saves every few steps,
#     keeping every 15 s under 60 % training, in shapes not recorded before: a ResNet-18
#     under Lightning saving every 20 steps at batch 128; BERT-base in bf16 at batch 16
#     evaluating every 30 steps at eval batch 32; and BERT-large at sequence 512 in bf16
#     evaluating every 10 steps at eval batch 8 (its steps' SMs 65-72 % active, the
#     evaluation's 20-35 %): what the steps' GPU does, read apart from the evaluation's
want lightning_r18_ckpt20 && rec lightning_r18_ckpt20 120 python3 lightning_cnn.py \
  --model resnet18 --batch 128 --workers 8 --precision bf16-mixed --ckpt-every 20 --seconds 40
want hf_eval30_b16 && rec hf_eval30_b16 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 50 --batch 16 --accum 1 --eval-every 30 --eval-batch 32 --eval-samples 2048 \
  --bf16 --workers 2
want hf_large_eval10 && rec hf_large_eval10 150 python3 hf_trainer.py --hidden 1024 \
  --layers 24 --seq 512 --steps 100000 --seconds 50 --batch 32 --accum 1 --eval-every 10 \
  --eval-batch 8 --eval-samples 512 --bf16 --workers 2
# (fw_hf_large_eval10_h100: the same on one H100, 2026-12-05, twenty-second session,
#  renamed from fw_hf_large_eval10: its steps' SMs 68 % active in the seconds of steps)
# 7ab. (2026-12-05, twenty-fourth session) samples read from remote storage: each sample's
#     __getitem__ waits --read-ms (a network filesystem or an object store) with its CPU
#     idle. The Trainer's BERT-base in bf16 at batch 32 with 2 loader workers, and with the
#     Trainer's default of none (the main process waits itself), each also without the
#     hook; Lightning's ResNet-18 at batch 256 with 4 workers
want hf_remote_w2 && rec hf_remote_w2 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2 \
  --read-ms 3
want hf_remote_w2_bare && rec_bare hf_remote_w2_bare 150 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 2 --read-ms 3
want hf_remote_w0 && rec hf_remote_w0 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 0 \
  --read-ms 3
want hf_remote_w0_bare && rec_bare hf_remote_w0_bare 150 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 0 --read-ms 3
want lightning_remote && rec lightning_remote 120 python3 lightning_cnn.py --batch 256 \
  --workers 4 --precision bf16-mixed --read-ms 1 --seconds 40
#     and, to check the reading where the reads are cheaper or fully hidden: the Trainer
#     with 4 workers at 1.5 ms a sample, and with 8 at 0.5 ms (the loaders keep up), both
#     without the hook; Lightning's again without the hook (recorded in the twenty-sixth
#     session)
want hf_remote_w4_bare && rec_bare hf_remote_w4_bare 150 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 4 --read-ms 1.5
want hf_remote_w8_bare && rec_bare hf_remote_w8_bare 150 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 8 --read-ms 0.5
want lightning_remote_bare && rec_bare lightning_remote_bare 120 python3 lightning_cnn.py \
  --batch 256 --workers 4 --precision bf16-mixed --read-ms 1 --seconds 40
#     and reads that also cost CPU (page cache, decompression): 2 workers each waiting 2 ms
#     and computing 2 ms a sample (half busy, between the idle and the pegged pool), with and
#     without the hook (recorded in the twenty-sixth session)
want hf_remote_cpu && rec hf_remote_cpu 150 python3 hf_trainer.py $bert --steps 100000 \
  --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 --bf16 --workers 2 \
  --read-ms 2 --decode-ms 2
want hf_remote_cpu_bare && rec_bare hf_remote_cpu_bare 150 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 2 --read-ms 2 --decode-ms 2
# 7ac. (2026-12-06, twenty-sixth session) the service's view: the daemon running 20 s
#     before the job and 60 s after it, the Trainer's host-bound BERT (batch 32, 2
#     workers) with the hook reporting to it, and the same job without the hook under a
#     daemon at --interval 2 (nothing is told of the idle after the job; a 2-s daemon is
#     judged in 2-s buckets)
want hf_service && rec_service hf_service 150 20 60 1 1 python3 hf_trainer.py $bert \
  --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 --eval-samples 64 \
  --bf16 --workers 2
want hf_service_2s_bare && rec_service hf_service_2s_bare 150 20 60 2 0 python3 hf_trainer.py \
  $bert --steps 100000 --seconds 45 --batch 32 --accum 1 --eval-every 100000 \
  --eval-samples 64 --bf16 --workers 2
