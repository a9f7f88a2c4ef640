"""Which framework drives the training loop, and its settings.

Found once, at the first iteration's end: the stack then runs through the framework's own
loop (Hugging Face ``Trainer._inner_training_loop``, a Lightning loop, Accelerate's
``AcceleratedOptimizer.step``), so one walk up the frames finds its object, with no import
of the framework and no wrapper around it. Settings are read from that object by the
reporting thread, each under its own guard (:func:`facts.read`), as framework-neutral config
keys (``fw_*``: docs/hook.md) beside ``framework`` and ``framework_version``: the advisor
turns them back into each framework's knobs.
"""

# ruff: noqa: BLE001

from __future__ import annotations

import sys
import weakref
from typing import Any

from gpuwatch.job.hook.facts import Problems, read, read_known

TRANSFORMERS = "transformers"
# a Hugging Face pipeline() serving a model (transformers' own inference loop)
PIPELINE = "transformers.pipeline"
# sentence-transformers' encode() (SentenceTransformer, CrossEncoder, SparseEncoder): its
# own loop over slices of the inputs, no DataLoader
SENTENCE_TRANSFORMERS = "sentence_transformers"
_ST_CLASSES = ("SentenceTransformer", "CrossEncoder", "SparseEncoder")
LIGHTNING = "lightning"
ACCELERATE = "accelerate"
FABRIC = "fabric"  # Lightning Fabric: the user's own loop, Fabric's strategy and precision
MAX_FRAMES = 80  # how far up the stack to look


def _any_frame(frame: Any, hit: Any) -> bool:
    """Whether ``hit(code)`` holds for the code of ``frame`` or of a frame above it (at
    most MAX_FRAMES up)."""
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        depth += 1
        if hit(frame.f_code):
            return True
        frame = frame.f_back
    return False


def under_batch_finder(frame: Any) -> bool:
    """Whether the loop runs inside accelerate's ``find_executable_batch_size`` (its
    ``decorator`` frame above this one): the batch is sized to what fits in memory and
    tried again smaller on every out-of-memory, in a plain loop or under the Trainer
    (``auto_find_batch_size`` runs through it)."""
    return _any_frame(frame, lambda code: code.co_name == "decorator"
                      and code.co_filename.replace("\\", "/").endswith(
                          "accelerate/utils/memory.py"))


_TUNERS = ("lightning/pytorch/tuner/", "pytorch_lightning/tuner/")


def in_lightning_tuner(frame: Any) -> bool:
    """Whether Lightning's tuner (its BatchSizeFinder's trials, the learning-rate finder)
    runs the code at ``frame``: a DataLoader it makes for a trial is no epoch's start."""
    return _any_frame(frame, lambda code: any(
        t in code.co_filename.replace("\\", "/") for t in _TUNERS))


def _is(obj: Any, module_prefixes: tuple[str, ...], class_name: str) -> bool:
    for cls in type(obj).__mro__:
        if cls.__name__ == class_name and cls.__module__.startswith(module_prefixes):
            return True
    return False


def _lightning_trainer(obj: Any) -> Any:
    if _is(obj, ("lightning.pytorch", "pytorch_lightning"), "Trainer"):
        return obj
    trainer = getattr(obj, "trainer", None) if type(obj).__module__.startswith(
        ("lightning.pytorch", "pytorch_lightning")) else None
    if trainer is not None and _is(trainer, ("lightning.pytorch", "pytorch_lightning"),
                                   "Trainer"):
        return trainer
    return None


# Fabric inside the lightning package, and the standalone lightning-fabric package
_FABRIC_MODULES = ("lightning.fabric", "lightning_fabric")


def _fabric_strategy(obj: Any) -> Any:
    """Fabric's strategy from one of its objects on the optimizer step's stack (the strategy
    itself, or the optimizer wrapper that holds it); None for any other."""
    if _is(obj, _FABRIC_MODULES, "Strategy"):
        return obj
    strategy = getattr(obj, "_strategy", None)
    if strategy is not None and _is(strategy, _FABRIC_MODULES, "Strategy"):
        return strategy
    return None


def _pipeline(obj: Any) -> Any:
    """The Hugging Face ``Pipeline`` from one of its objects on an inference batch's stack:
    the pipeline itself (``__call__`` over a list), or the iterator it hands out (a
    generator or Dataset fed to it), whose ``infer`` is the pipeline's bound method."""
    if _is(obj, ("transformers",), "Pipeline"):
        return obj
    owner = getattr(getattr(obj, "infer", None), "__self__", None)
    if owner is not None and _is(owner, ("transformers",), "Pipeline"):
        return owner
    return None


def detect(frame: Any) -> tuple[str, Any] | None:
    """(framework, its object) from the frames above ``frame``; None for a plain loop.

    A Hugging Face Trainer also runs Accelerate underneath, so it wins over it; a Lightning
    Trainer wins over Fabric's objects (none are on its stack today, but its classes share
    Fabric's utilities)."""
    found: tuple[str, Any] | None = None
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        depth += 1
        code_file = frame.f_code.co_filename
        if ("transformers" in code_file or "lightning" in code_file
                or "accelerate" in code_file):
            obj = frame.f_locals.get("self")
            if obj is not None:
                mod = type(obj).__module__
                if mod.startswith("sentence_transformers") and found is None \
                        and frame.f_code.co_name in ("encode", "predict", "rank") \
                        and any(_is(obj, ("sentence_transformers",), c) for c in _ST_CLASSES):
                    found = (SENTENCE_TRANSFORMERS, obj)
                # the Trainer's own loop runs the training of its subclasses too: TRL's
                # (SFTTrainer, DPOTrainer, GRPOTrainer) and the scripts' own (a
                # compute_loss of theirs), whose modules are not transformers'
                if "transformers" in code_file and _is(obj, ("transformers",), "Trainer"):
                    return TRANSFORMERS, obj
                if mod.startswith("transformers.pipelines") and found is None:
                    pipe = _pipeline(obj)
                    if pipe is not None:
                        found = (PIPELINE, pipe)
                if mod.startswith(("lightning", "pytorch_lightning")):
                    trainer = _lightning_trainer(obj)
                    if trainer is not None:
                        return LIGHTNING, trainer
                    if mod.startswith(_FABRIC_MODULES) and (
                            found is None or found[0] != FABRIC):
                        strategy = _fabric_strategy(obj)
                        if strategy is not None:
                            found = (FABRIC, strategy)
                if mod.startswith("accelerate") and found is None:
                    found = (ACCELERATE, None)
        frame = frame.f_back
    return found


def _enum_value(v: Any) -> Any:
    v = getattr(v, "value", v)
    return v if isinstance(v, (bool, int, float, str)) or v is None else str(v)


def _version(*modules: str) -> Any:
    """The version of the first of ``modules`` the job has loaded (read when called)."""
    def version() -> Any:
        loaded = next((sys.modules[m] for m in modules if m in sys.modules), None)
        return getattr(loaded, "__version__", None)
    return version


def _transformers(cfg: dict[str, Any], trainer: Any, problems: Problems) -> None:
    args = trainer.args
    read(cfg, "framework_version", _version("transformers"), problems)
    # the arguments' class, which the knobs are written with: TrainingArguments, or a
    # subclass of it (TRL's SFTConfig, Seq2SeqTrainingArguments)
    read(cfg, "fw_args", lambda: type(args).__name__, problems)
    read(cfg, "fw_batch_size", lambda: args.per_device_train_batch_size, problems)
    read(cfg, "fw_grad_accum", lambda: args.gradient_accumulation_steps, problems)
    read(cfg, "fw_precision", lambda: "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
         problems)
    read(cfg, "fw_tf32", lambda: args.tf32, problems)
    read(cfg, "fw_optim", lambda: _enum_value(args.optim), problems)
    read(cfg, "fw_num_workers", lambda: args.dataloader_num_workers, problems)
    read(cfg, "fw_pin_memory", lambda: args.dataloader_pin_memory, problems)
    read(cfg, "fw_persistent_workers", lambda: args.dataloader_persistent_workers, problems)
    read(cfg, "fw_grad_ckpt", lambda: bool(args.gradient_checkpointing), problems)
    read(cfg, "fw_eval_batch_size", lambda: args.per_device_eval_batch_size, problems)
    read(cfg, "fw_eval_strategy", lambda: _enum_value(args.eval_strategy), problems)
    read(cfg, "fw_eval_every", lambda: args.eval_steps, problems)
    read(cfg, "fw_eval_accum", lambda: args.eval_accumulation_steps, problems)
    # Seq2SeqTrainingArguments alone: evaluations that generate, and how much
    read_known(cfg, "fw_eval_generate", lambda: getattr(args, "predict_with_generate", None),
               problems)
    read_known(cfg, "fw_eval_gen_len", lambda: getattr(args, "generation_max_length", None),
               problems)
    read_known(cfg, "fw_eval_gen_beams", lambda: getattr(args, "generation_num_beams", None),
               problems)
    # the metric that picks the best checkpoint (load_best_model_at_end, early stopping)
    read_known(cfg, "fw_best_metric", lambda: args.metric_for_best_model, problems)
    read(cfg, "fw_compile", lambda: bool(args.torch_compile), problems)
    # TrainingArguments(debug="underflow_overflow"): DebugUnderflowOverflow's forward hooks
    # on every module, each checking its tensors for inf and nan with .item()
    read(cfg, "fw_debug_overflow", lambda: any(
        _enum_value(d) == "underflow_overflow" for d in (args.debug or ())), problems)
    read(cfg, "fw_save_strategy", lambda: _enum_value(args.save_strategy), problems)
    read(cfg, "fw_save_every", lambda: args.save_steps, problems)
    # save_only_model is newer than the rest (transformers 4.36): absent is no problem
    read(cfg, "fw_save_only_model", lambda: getattr(args, "save_only_model", None), problems)
    read(cfg, "fw_world_size", lambda: args.world_size, problems)
    # the batch size finder: on every CUDA out-of-memory the Trainer starts its loop again
    # at 90 % of the batch (accelerate's find_executable_batch_size), for the whole run
    read(cfg, "fw_auto_batch", lambda: bool(getattr(args, "auto_find_batch_size", False)),
         problems)


def _pipeline_settings(cfg: dict[str, Any], pipe: Any, problems: Problems) -> None:
    read(cfg, "framework_version", _version("transformers"), problems)
    read(cfg, "fw_task", lambda: pipe.task, problems)


def _sentence_transformers_settings(cfg: dict[str, Any], model: Any,
                                    problems: Problems) -> None:
    read(cfg, "framework_version", _version("sentence_transformers"), problems)
    read(cfg, "fw_task", lambda: type(model).__name__, problems)


def _first_loader(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        return loaders[0] if loaders else None
    if isinstance(loaders, dict):
        return next(iter(loaders.values()), None)
    return loaders


def _lightning(cfg: dict[str, Any], trainer: Any, problems: Problems) -> None:
    read(cfg, "framework_version", _version("lightning", "pytorch_lightning"), problems)
    read(cfg, "fw_precision", lambda: str(trainer.precision), problems)
    read(cfg, "fw_grad_accum", lambda: trainer.accumulate_grad_batches, problems)
    read(cfg, "fw_eval_every", lambda: trainer.val_check_interval, problems)
    read(cfg, "fw_eval_epochs", lambda: trainer.check_val_every_n_epoch, problems)
    read(cfg, "fw_max_epochs", lambda: trainer.max_epochs, problems)
    # (Lightning 1.4 on: absent before, which is no problem)
    read(cfg, "fw_reload_loaders",
         lambda: getattr(trainer, "reload_dataloaders_every_n_epochs", None), problems)
    read(cfg, "fw_eval_batches", lambda: trainer.limit_val_batches, problems)
    read(cfg, "fw_world_size", lambda: trainer.world_size, problems)
    read(cfg, "fw_batch_size", lambda: getattr(
        _first_loader(trainer.train_dataloader), "batch_size", None), problems)
    read(cfg, "fw_eval_batch_size", lambda: getattr(
        _first_loader(trainer.val_dataloaders), "batch_size", None), problems)
    # the first ModelCheckpoint callback: every_n_train_steps (0: not by steps), and
    # save_weights_only
    read(cfg, "fw_save_every", lambda: _model_checkpoint(trainer, "_every_n_train_steps"),
         problems)
    read(cfg, "fw_save_only_model", lambda: _model_checkpoint(trainer, "save_weights_only"),
         problems)
    # a BatchSizeFinder callback (Trainer(callbacks=[BatchSizeFinder()]): the batch is
    # sized to what fits on purpose; Lightning sets the callbacks aside during its trials)
    read(cfg, "fw_auto_batch", lambda: any(
        type(c).__name__ == "BatchSizeFinder" for c in trainer.callbacks), problems)


def _model_checkpoint(trainer: Any, name: str) -> Any:
    callback = trainer.checkpoint_callback
    if callback is None:
        return None
    value = getattr(callback, name)
    return value if isinstance(value, (bool, int, float)) else None


def _accelerate(cfg: dict[str, Any], problems: Problems) -> None:
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    read(cfg, "framework_version", _version("accelerate"), problems)
    read(cfg, "fw_grad_accum", lambda: state.GradientState._shared_state.get(
        "plugin_kwargs", {}).get("num_steps"), problems)
    read(cfg, "fw_precision", lambda: _enum_value(
        state.AcceleratorState._shared_state.get("_mixed_precision")), problems)


def _fabric(cfg: dict[str, Any], strategy: Any, problems: Problems) -> None:
    read(cfg, "framework_version", _version("lightning", "lightning_fabric"), problems)
    # the precision plugin's setting as Fabric(precision=...) takes it: "32-true",
    # "bf16-mixed", "16-mixed", "bf16-true"
    read(cfg, "fw_precision", lambda: str(strategy.precision.precision), problems)
    read(cfg, "fw_world_size", lambda: strategy.world_size, problems)


class Framework:
    """The framework found (or not) for this process, and a weak reference to its object."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.looked = False
        self._ref: Any = None
        self.batch_finder = False  # inside accelerate's find_executable_batch_size

    def find(self, frame: Any, problems: Problems) -> None:
        """Once: look up the stack from ``frame`` (the training thread, at an iteration's
        end)."""
        if self.looked:
            return
        self.looked = True
        try:
            self.batch_finder = under_batch_finder(frame)
            got = detect(frame)
        except Exception as err:
            problems.add("framework", err)
            return
        if got is None:
            return
        self.name, obj = got
        if obj is not None:
            try:
                self._ref = weakref.ref(obj)
            except TypeError:
                self._ref = lambda: obj

    def obj(self) -> Any:
        return self._ref() if self._ref is not None else None

    def settings(self, cfg: dict[str, Any], problems: Problems) -> None:
        """The framework's settings into ``cfg`` (the reporting thread)."""
        if self.batch_finder:
            cfg["fw_auto_batch"] = True  # a framework's own reading below may say more
        if self.name is None:
            return
        cfg["framework"] = self.name
        obj = self.obj()
        if self.name == TRANSFORMERS and obj is not None:
            _transformers(cfg, obj, problems)
        elif self.name == LIGHTNING and obj is not None:
            _lightning(cfg, obj, problems)
        elif self.name == PIPELINE and obj is not None:
            _pipeline_settings(cfg, obj, problems)
        elif self.name == SENTENCE_TRANSFORMERS and obj is not None:
            _sentence_transformers_settings(cfg, obj, problems)
        elif self.name == ACCELERATE:
            _accelerate(cfg, problems)
        elif self.name == FABRIC and obj is not None:
            _fabric(cfg, obj, problems)
