"""Each setting advice may change, in the words of the framework that drives the job.

A rule's action names a knob (``knob("num_workers", nw, suggested)`` in its ``values``);
this table writes it as the user would type it: ``TrainingArguments(dataloader_num_workers=0
→ 3)`` for the Hugging Face Trainer, ``Trainer(accumulate_grad_batches=16 → 4)`` for
Lightning, ``Accelerator(gradient_accumulation_steps=…)`` for Accelerate, ``Fabric(precision=…)`` for
Lightning Fabric (whose loop is the user's own: most of its knobs are torch's), with the plain
torch form beside it; for a plain loop, the torch form alone. The framework is the hook's
(``framework`` config key: docs/hook.md).
"""

from __future__ import annotations

import re
from typing import Any

TORCH = "torch"
PIPELINE = "transformers.pipeline"  # a Hugging Face pipeline() serving a model
SENTENCE_TRANSFORMERS = "sentence_transformers"  # its encode() loop
FRAMEWORKS = ("transformers", "lightning", "accelerate", "fabric", PIPELINE,
              SENTENCE_TRANSFORMERS)

# knob -> framework -> template ({old}, {new}: the values, "old → new" where both are known)
KNOBS: dict[str, dict[str, str]] = {
    "batch_size": {
        TORCH: "DataLoader(batch_size={change})",
        "transformers": "TrainingArguments(per_device_train_batch_size={change})",
        "lightning": "the training DataLoader(batch_size={change})",
    },
    "grad_accum": {
        TORCH: "gradient accumulation over {change} micro-batches per optimizer.step()",
        "transformers": "TrainingArguments(gradient_accumulation_steps={change})",
        "lightning": "Trainer(accumulate_grad_batches={change})",
        "accelerate": "Accelerator(gradient_accumulation_steps={change})",
        "fabric": "{change} micro-batches per optimizer.step(), each backward but the last "
                  "under fabric.no_backward_sync(model)",
    },
    # an inference process's batch: the DataLoader it iterates, the pipeline's own
    "infer_batch_size": {
        TORCH: "DataLoader(batch_size={change})",
        "transformers": "TrainingArguments(per_device_eval_batch_size={change}) for "
                        "Trainer.predict and evaluate",
        "lightning": "the predict DataLoader(batch_size={change})",
        PIPELINE: "pipeline(..., batch_size={change}), or per call pipe(inputs, "
                  "batch_size={new})",
    },
    # the same where no DataLoader makes the batches: the loop slices them itself
    # (model(x[i:i + n])), or sentence-transformers' encode() does
    "infer_loop_batch": {
        TORCH: "{change} samples per forward pass, in the slices the loop hands the model",
        SENTENCE_TRANSFORMERS: "model.encode(..., batch_size={change})",
        # a pipeline called one input at a time runs no DataLoader
        PIPELINE: "a list (or a generator) of inputs per pipe(...) call, with "
                  "batch_size={new}, instead of one input per call",
    },
    "num_workers": {
        TORCH: "DataLoader(num_workers={change})",
        "transformers": "TrainingArguments(dataloader_num_workers={change})",
        PIPELINE: "pipeline(..., num_workers={change})",
    },
    # (a pipeline builds its DataLoader with these at their defaults: no form of its own)
    "pin_memory": {
        TORCH: "DataLoader(pin_memory={change})",
        "transformers": "TrainingArguments(dataloader_pin_memory={change})",
        PIPELINE: "",
    },
    "persistent_workers": {
        TORCH: "DataLoader(persistent_workers={change})",
        "transformers": "TrainingArguments(dataloader_persistent_workers={change})",
        PIPELINE: "",
    },
    "prefetch_factor": {
        TORCH: "DataLoader(prefetch_factor={change})",
        "transformers": "TrainingArguments(dataloader_prefetch_factor={change})",
        PIPELINE: "",
    },
    "eval_batch_size": {
        TORCH: "the evaluation DataLoader(batch_size={change})",
        "transformers": "TrainingArguments(per_device_eval_batch_size={change})",
        "lightning": "the validation DataLoader(batch_size={change})",
    },
    "eval_every": {
        TORCH: "evaluate every {change} steps",
        "transformers": "TrainingArguments(eval_steps={change})",
        "lightning": "Trainer(val_check_interval={change})",
    },
    # Lightning's validation by a share of an epoch (a float val_check_interval), and by
    # epochs
    "eval_fraction": {
        TORCH: "evaluate every {new} of an epoch",
        "lightning": "Trainer(val_check_interval={change})",
    },
    "eval_epochs": {
        TORCH: "evaluate every {change} epochs",
        "lightning": "Trainer(check_val_every_n_epoch={change}, val_check_interval=1.0)",
    },
    "eval_batches": {
        TORCH: "evaluate on {new} of the evaluation set",
        "transformers": "a part of the eval_dataset "
                        "(eval_dataset.select(range(int(len(eval_dataset) * {new}))))",
        "lightning": "Trainer(limit_val_batches={new})",
    },
    "eval_generate": {
        TORCH: "the loss alone in the evaluations during training",
        "transformers": "Seq2SeqTrainingArguments(predict_with_generate={change})",
    },
    "eval_accum": {
        TORCH: "move predictions to the CPU every {new} evaluation batches",
        "transformers": "TrainingArguments(eval_accumulation_steps={new})",
    },
    "bf16": {
        TORCH: 'torch.autocast("cuda", dtype=torch.bfloat16) around forward and loss, '
               "no GradScaler",
        "transformers": "TrainingArguments(bf16=True, fp16=False)",
        "lightning": 'Trainer(precision="bf16-mixed")',
        "accelerate": 'Accelerator(mixed_precision="bf16")',
        "fabric": 'Fabric(precision="bf16-mixed")',
    },
    "tf32": {
        TORCH: 'torch.backends.cuda.matmul.fp32_precision = "tf32" (torch 2.9+; '
               "older: torch.backends.cuda.matmul.allow_tf32 = True)",
        "transformers": "TrainingArguments(tf32=True)",
        "lightning": 'torch.set_float32_matmul_precision("high") before Trainer.fit',
    },
    # Lightning sets torch's flag from Trainer(benchmark=...) when the Trainer is built
    "cudnn_benchmark": {
        TORCH: "torch.backends.cudnn.benchmark = {new}",
        "lightning": "Trainer(benchmark={new})",
    },
    # a DataLoader built once and iterated each epoch (persistent workers live only as
    # long as their DataLoader object)
    "loader_once": {
        TORCH: "build the DataLoader once, before the epoch loop, and iterate that one "
               "each epoch",
        "lightning": "Trainer(reload_dataloaders_every_n_epochs={change})",
    },
    "fused_optimizer": {
        TORCH: "torch.optim.{new}(..., fused=True)",
        "transformers": 'TrainingArguments(optim="adamw_torch_fused")',
    },
    "grad_ckpt_off": {
        TORCH: "drop torch.utils.checkpoint around the blocks "
               "(model.gradient_checkpointing_disable() for a Hugging Face model)",
        "transformers": "TrainingArguments(gradient_checkpointing=False)",
    },
    "grad_ckpt_on": {
        TORCH: "torch.utils.checkpoint.checkpoint around the model's blocks "
               "(model.gradient_checkpointing_enable() for a Hugging Face model)",
        "transformers": "TrainingArguments(gradient_checkpointing=True)",
    },
    "fsdp_offload": {
        TORCH: "FullyShardedDataParallel(..., cpu_offload=CPUOffload(offload_params={new}))",
        "accelerate": "FullyShardedDataParallelPlugin(cpu_offload={new}) (accelerate config: "
                      "fsdp_offload_params: false)",
        "transformers": 'TrainingArguments(fsdp=...) without "offload" (or fsdp_config\'s '
                        "offload_params={new})",
        "lightning": "FSDPStrategy(cpu_offload={new})",
        "fabric": "FSDPStrategy(cpu_offload={new})",
    },
    # FSDP2: fully_shard's offload_policy (OffloadPolicy() keeps the parameters on the GPU);
    # Accelerate and the Trainer take the same setting as for FSDP1 (fsdp_version: 2)
    "fsdp2_offload": {
        TORCH: "fully_shard(module, ...) without offload_policy=CPUOffloadPolicy() (the "
               "default OffloadPolicy() keeps them on the GPU)",
        "accelerate": "FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload={new}) "
                      "(accelerate config: fsdp_offload_params: false)",
        "transformers": 'TrainingArguments(fsdp=...) without "offload" (fsdp_config '
                        "fsdp_version 2)",
        "lightning": "fully_shard(...) in configure_model without "
                     "offload_policy=CPUOffloadPolicy() (ModelParallelStrategy)",
    },
    "compile": {
        TORCH: "model = torch.compile(model)",
        "transformers": "TrainingArguments(torch_compile=True)",
    },
    # inference: the weights themselves in bf16 (no optimizer, no master weights to keep)
    "bf16_inference": {
        TORCH: "model.to(torch.bfloat16), or torch.autocast(\"cuda\", "
               "dtype=torch.bfloat16) around the forward pass",
        "transformers": "TrainingArguments(bf16_full_eval=True) for Trainer.predict and "
                        "evaluate, or from_pretrained(..., dtype=torch.bfloat16)",
        "lightning": 'Trainer(precision="bf16-true") for trainer.predict',
        "accelerate": 'Accelerator(mixed_precision="bf16")',
        PIPELINE: "pipeline(..., dtype=torch.bfloat16)",
    },
    "save_every": {
        TORCH: "save a checkpoint every {change} steps",
        "transformers": "TrainingArguments(save_steps={change})",
        "lightning": "ModelCheckpoint(every_n_train_steps={change})",
        "accelerate": "accelerator.save_state() every {change} steps",
        "fabric": "fabric.save(path, state) every {change} steps",
    },
    "save_only_model": {
        TORCH: "save the model's state_dict alone, not the optimizer's",
        "transformers": "TrainingArguments(save_only_model={change})",
        "lightning": "ModelCheckpoint(save_weights_only={change})",
        "accelerate": "accelerator.save_model(model, …) instead of save_state()",
        "fabric": 'fabric.save(path, {{"model": model}}), without the optimizer',
    },
    # a diverged loss (loss-not-finite): the learning rate, and clipping of the gradients'
    # norm; the hook reads neither, so no values
    "lr_lower": {
        TORCH: "a lower learning rate (e.g. a tenth) and a warm-up (a scheduler that "
               "ramps it up over the first few hundred steps)",
        "transformers": "a lower TrainingArguments(learning_rate=…) (e.g. a tenth) with "
                        "TrainingArguments(warmup_steps=…) or warmup_ratio",
        "lightning": "a lower learning rate in configure_optimizers() (e.g. a tenth) with a "
                     "warm-up scheduler",
    },
    "grad_clip": {
        TORCH: "torch.nn.utils.clip_grad_norm_(model.parameters(), {new}) before "
               "optimizer.step() (after scaler.unscale_(optimizer) with a GradScaler)",
        "transformers": "TrainingArguments(max_grad_norm={new}) (the Trainer's default; 0 or "
                        "None turns clipping off)",
        "lightning": "Trainer(gradient_clip_val={new})",
        "accelerate": "accelerator.clip_grad_norm_(model.parameters(), {new}) between "
                      "accelerator.backward(loss) and optimizer.step()",
        "fabric": "fabric.clip_gradients(model, optimizer, max_norm={new}) before "
                  "optimizer.step()",
    },
    # debugging modes left on: Lightning turns torch's anomaly detection on around fit()'s
    # loop for Trainer(detect_anomaly=True), and off around it otherwise
    "anomaly_off": {
        TORCH: "take torch.autograd.set_detect_anomaly(True) (or the "
               "torch.autograd.detect_anomaly() block) out of the training run",
        "lightning": "Trainer(detect_anomaly=False) (its default)",
    },
    # DDP's search for unused parameters: the Trainer's default (True) for a model without
    # gradient checkpointing; Lightning's and Accelerate's is False
    "find_unused_off": {
        TORCH: "DistributedDataParallel(model, ..., find_unused_parameters=False)",
        "transformers": "TrainingArguments(ddp_find_unused_parameters=False)",
        "lightning": 'Trainer(strategy="ddp") (not "ddp_find_unused_parameters_true"), or '
                     "DDPStrategy(find_unused_parameters=False)",
        "accelerate": "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                      "find_unused_parameters=False)])",
        "fabric": 'Fabric(strategy="ddp") (not "ddp_find_unused_parameters_true")',
    },
    "launch_blocking_off": {
        TORCH: "unset CUDA_LAUNCH_BLOCKING in the job's environment (or set it to 0)",
    },
    "alloc_cache_on": {
        TORCH: "unset PYTORCH_NO_CUDA_MEMORY_CACHING in the job's environment (or set it "
               "to 0)",
    },
    "dist_debug_off": {
        TORCH: "unset TORCH_DISTRIBUTED_DEBUG in the job's environment (or set it to OFF; "
               "INFO keeps DDP's usage logs without the per-collective checks)",
    },
    # memory freed by hand inside the training loop: the call to take out (the Trainer
    # makes the cache one itself, torch_empty_cache_steps)
    "gc_in_loop_off": {
        TORCH: "take gc.collect() out of the training step (if it is ever needed, run it "
               "between epochs or after an evaluation)",
        "transformers": "take gc.collect() out of the TrainerCallback that runs it at each "
                        "step (on_step_end)",
        "lightning": "take gc.collect() out of the hook that runs it at each batch "
                     "(on_train_batch_end)",
    },
    "empty_cache_in_loop_off": {
        TORCH: "take torch.cuda.empty_cache() out of the training step (torch reuses the "
               "blocks it caches; emptying the cache frees nothing the job still holds)",
        "transformers": "TrainingArguments(torch_empty_cache_steps=None) (its default), or "
                        "take torch.cuda.empty_cache() out of your callback",
        "accelerate": "take accelerator.free_memory() / clear_device_cache() out of the "
                      "training step",
        "lightning": "take torch.cuda.empty_cache() out of the hook that runs it at each "
                     "batch",
    },
    "debug_overflow_off": {
        TORCH: "drop DebugUnderflowOverflow(model)",
        "transformers": 'TrainingArguments(debug="") (without "underflow_overflow")',
    },
    # the rollouts of an RL fine-tuning loop generated by vLLM instead of generate(): TRL's
    # online trainers' own switch (their configs subclass TrainingArguments, whose name
    # the job's class replaces: GRPOConfig(use_vllm=True)); asked of TRL's configs only
    "use_vllm": {
        TORCH: "generate the rollouts with vLLM (an inference engine beside the model, its "
               "weights synced after each optimizer step) instead of model.generate()",
        "transformers": 'TrainingArguments(use_vllm=True, vllm_mode="colocate")',
    },
    # "": the framework has no such form (the torch one would not fit its loop)
    "async_save": {
        TORCH: "torch.distributed.checkpoint.async_save(state_dict, checkpoint_id=…), "
               "which copies to host memory and writes in the background",
        "transformers": "",
        "lightning": "Trainer(plugins=[AsyncCheckpointIO()]) (from "
                     "lightning.pytorch.plugins.io import AsyncCheckpointIO)",
        "accelerate": "",
    },
}


# batch samplers a framework builds around the DataLoader's own batch size
_FRAMEWORK_SAMPLERS = frozenset({"BatchSamplerShard", "SkipBatchSampler",
                                 "_IndexBatchSamplerWrapper"})


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _fill(template: str, old: Any, new: Any) -> str:
    if old is None or old == new:
        change = _text(new)
    else:
        change = f"{_text(old)} → {_text(new)}"
    return template.format(change=change, old=_text(old), new=_text(new))


# the Trainer's arguments class in its knobs' forms, whole word (not inside
# Seq2SeqTrainingArguments)
_ARGS = re.compile(r"(?<![A-Za-z0-9_])TrainingArguments\(")


def in_args_class(text: str, args_class: str | None) -> str:
    """``text`` with ``TrainingArguments(`` written as the job's own arguments class
    (``SFTConfig(``...) where it has one; the text as it is otherwise."""
    if not args_class or args_class == "TrainingArguments" or not args_class.isidentifier():
        return text
    return _ARGS.sub(f"{args_class}(", text)


def knob(name: str, framework: str | None, old: Any, new: Any,
         batch_sampler: str | None = None, args_class: str | None = None) -> str | None:
    """The change of ``name`` from ``old`` to ``new``, as the user of ``framework`` writes it;
    None for a knob this table does not know (a rule file's typo is caught at load).

    ``batch_sampler``: the class of the training DataLoader's batch sampler where it makes
    the batches (the DataLoader's own batch_size is None): the batch size is that sampler's
    to change. Not under the Hugging Face Trainer, which builds its loaders from
    ``per_device_train_batch_size``, nor for a framework's own wrapper (Accelerate's
    ``BatchSamplerShard``, which an older hook reported) around the loader's batch size.

    ``args_class``: the class of the Hugging Face Trainer's arguments, where the job's is a
    subclass of ``TrainingArguments`` (TRL's ``SFTConfig``, ``GRPOConfig``...): the
    Trainer's forms name it instead."""
    forms = KNOBS.get(name)
    if forms is None or new is None:
        return None
    if name == "batch_size" and batch_sampler and framework != "transformers" \
            and batch_sampler not in _FRAMEWORK_SAMPLERS:
        return _fill(f"the batch size of the DataLoader's batch_sampler "
                     f"({batch_sampler}(..., batch_size={{change}}), or however it is built)",
                     old, new)
    if name == "fused_optimizer" and new != "AdamW":
        # the Trainer's optim="adamw_torch_fused" would swap another optimizer for AdamW
        forms = {TORCH: forms[TORCH]}
    if name == "grad_accum" and new == 1:  # accumulation gone: say so in plain words
        forms = dict(forms, **{TORCH: "no gradient accumulation (one backward() per "
                                      "optimizer.step())"})
        if framework == "fabric":  # the user's own loop: torch's words, Fabric's calls
            return _fill("no gradient accumulation (micro-batches per optimizer.step(): "
                         "{change}; one fabric.backward() each, without "
                         "fabric.no_backward_sync)", old, new)
    torch_form = _fill(forms[TORCH], old, new)
    own = forms.get(framework) if framework in FRAMEWORKS else None
    if own == "":
        return None
    if own is not None and framework == "transformers":
        own = in_args_class(own, args_class)
    if own is None:
        return torch_form
    return f"{_fill(own, old, new)} (in torch: {_fill(forms[TORCH], None, new)})"
