"""The script's own clock, written beside what gpuwatch recorded: the ground truth the
framework tests compare the hook's phases and steps with."""

from __future__ import annotations

import json
import os
import time


class Truth:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.t0 = time.time()
        self.data: dict = {"eval_seconds": 0.0, "evals": 0, "steps": 0, "micro_batches": 0}
        self._eval_t0: float | None = None

    def eval_begins(self) -> None:
        self._eval_t0 = time.perf_counter()

    def eval_ends(self) -> None:
        if self._eval_t0 is not None:
            self.data["eval_seconds"] += time.perf_counter() - self._eval_t0
            self.data["evals"] += 1
            self._eval_t0 = None

    def write(self, **extra: object) -> None:
        if os.environ.get("RANK", "0") != "0":
            return  # torchrun's ranks: rank 0 writes the truth for all
        self.data.update(extra)
        self.data["wall_seconds"] = time.time() - self.t0
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.data, f)


def trainer_clock(truth: Truth, seconds: float | None = None,
                  first_eval: bool = False) -> type:
    """A Hugging Face ``TrainerCallback`` class that counts ``truth``'s steps, stops the
    training after ``seconds`` (at a step's end) and times the evaluations that follow a
    step; ``first_eval``: also the one ``eval_on_start`` runs before the first step, as
    ``first_eval_seconds``."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            truth.data["steps"] = state.global_step
            if seconds is not None and time.time() - truth.t0 > seconds:
                control.should_training_stop = True
            truth.eval_begins()  # an evaluation, if one comes, starts right after a step

        def on_evaluate(self, args, state, control, **kw):  # noqa: ANN001
            if first_eval and state.global_step == 0:
                truth.data["first_eval_seconds"] = time.perf_counter() - self.began
            truth.eval_ends()

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            truth._eval_t0 = None  # no evaluation came after the last step

    return Clock


def lightning_clock(truth: Truth) -> type:
    """A Lightning ``Callback`` class that counts ``truth``'s steps and times its
    validations (the sanity check before training left out)."""
    import lightning.pytorch as pl

    class Clock(pl.Callback):
        def on_validation_start(self, trainer, module):  # noqa: ANN001
            if not trainer.sanity_checking:
                truth.eval_begins()

        def on_validation_end(self, trainer, module):  # noqa: ANN001
            if not trainer.sanity_checking:
                truth.eval_ends()

        def on_train_batch_end(self, trainer, module, outputs, batch, i):  # noqa: ANN001
            truth.data["steps"] = trainer.global_step

    return Clock
