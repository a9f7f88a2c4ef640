"""Causal language modelling with Accelerate, the way Hugging Face's
``run_clm_no_trainer.py`` example is laid out: a GPT-2 from its config, a token stream
cut into blocks (``group_texts``), ``get_scheduler`` with warm-up, ``accelerator.accumulate``
around each micro-batch, evaluation by perplexity with ``gather_for_metrics`` every
``--eval-every`` optimizer steps, and ``accelerator.save_state`` every
``--checkpointing-steps``. The truth (--out) is the loop's own count of optimizer steps,
evaluations and their seconds.

Random tokens stand in for a dataset (nothing downloads); run it under ``torchrun`` or
``accelerate launch`` for several GPUs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GPT-2 causal LM with Accelerate")
    parser.add_argument("--n_embd", type=int, default=768)
    parser.add_argument("--n_layer", type=int, default=12)
    parser.add_argument("--block_size", type=int, default=512)
    parser.add_argument("--vocab_size", type=int, default=50257)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--eval_every", type=int, default=0, help="optimizer steps (0: never)")
    parser.add_argument("--eval_samples", type=int, default=512)
    parser.add_argument("--eval_on_main_only", action="store_true",
                        help="rank 0 evaluates the whole set alone; the others train on")
    parser.add_argument("--checkpointing_steps", type=int, default=0)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--tf32", action="store_true")
    parser.add_argument("--fsdp", action="store_true",
                        help="FSDP (full shard, each GPT2Block wrapped), as accelerate config "
                             "writes it")
    parser.add_argument("--fsdp_offload", action="store_true",
                        help="with --fsdp: cpu_offload=True (parameters and the optimizer "
                             "step on the CPU)")
    parser.add_argument("--fsdp_version", type=int, default=1, choices=(1, 2),
                        help="with --fsdp: 1 (FullyShardedDataParallel) or 2 (fully_shard)")
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--stop_each_rank", action="store_true",
                        help="each rank stops on its own clock (--seconds), not agreeing: "
                             "ranks may stop at different steps and the others hang in "
                             "their next collective (how fw_accel_clm_fsdp_hang was made)")
    parser.add_argument("--max_train_steps", type=int, default=10**9)
    parser.add_argument("--out")
    return parser.parse_args()


class TokenBlocks(Dataset):
    """A corpus already tokenized and grouped into blocks of block_size tokens."""

    def __init__(self, n_blocks: int, block_size: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n_blocks, block_size), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    args = parse_args()
    truth = Truth(args.out)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    plugin = {}
    if args.fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        # FSDP2 has no sharding strategy (reshard_after_forward is full shard) and always
        # keeps the original parameters
        v1 = {"sharding_strategy": "FULL_SHARD", "use_orig_params": True}
        plugin["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=args.fsdp_version, auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["GPT2Block"], cpu_offload=args.fsdp_offload,
            state_dict_type="SHARDED_STATE_DICT",
            **(v1 if args.fsdp_version == 1 else {"reshard_after_forward": True}))
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision=args.mixed_precision,
                              cpu=not torch.cuda.is_available(), **plugin)
    config = GPT2Config(n_embd=args.n_embd, n_layer=args.n_layer,
                        n_head=max(1, args.n_embd // 64), n_positions=args.block_size,
                        vocab_size=args.vocab_size)
    model = GPT2LMHeadModel(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    train = TokenBlocks(20_000, args.block_size, config.vocab_size, seed=0)
    evals = TokenBlocks(args.eval_samples, args.block_size, config.vocab_size, seed=1)
    train_loader = DataLoader(train, shuffle=True, batch_size=args.per_device_train_batch_size,
                              num_workers=args.num_workers, pin_memory=True)
    eval_loader = DataLoader(evals, batch_size=args.per_device_eval_batch_size,
                             num_workers=args.num_workers)
    no_decay = ["bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters()
                    if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters()
                    if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=100,
                              num_training_steps=100_000)
    if args.eval_on_main_only:  # not sharded: the main process walks all of it
        model, optimizer, train_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, scheduler)
    else:
        model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, eval_loader, scheduler)

    out_dir = tempfile.mkdtemp(prefix="ckpt-", dir=".")  # on the disk the job runs from
    steps = saves = 0
    began = time.time()
    done = False
    while not done:
        model.train()
        for batch in train_loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                continue
            steps += 1
            if args.checkpointing_steps and steps % args.checkpointing_steps == 0:
                accelerator.save_state(os.path.join(out_dir, "checkpoint"))
                saves += 1
            main_only = args.eval_on_main_only
            if args.eval_every and steps % args.eval_every == 0 and (
                    accelerator.is_main_process or not main_only):
                truth.eval_begins()
                model.eval()
                losses = []
                for eb in eval_loader:
                    if main_only:
                        eb = {k: v.to(accelerator.device) for k, v in eb.items()}
                    with torch.no_grad():
                        out = model(**eb)
                    loss = out.loss.repeat(args.per_device_eval_batch_size)
                    losses.append(loss if main_only else accelerator.gather_for_metrics(loss))
                ppl = math.exp(torch.cat(losses).mean().item())
                accelerator.print(f"step {steps}: perplexity {ppl:.1f}")
                model.train()
                truth.eval_ends()
            late = time.time() - began > args.seconds
            if accelerator.num_processes > 1 and not args.stop_each_rank:
                # every rank stops at the same step: agree every 10 steps
                if steps % 10:
                    late = False
                else:
                    flag = torch.tensor([float(late)], device=accelerator.device)
                    late = bool(accelerator.reduce(flag, reduction="sum").item())
            if steps >= args.max_train_steps or late:
                done = True
                break
    accelerator.wait_for_everyone()
    truth.write(steps=steps, micro_batches=args.gradient_accumulation_steps,
                batch=args.per_device_train_batch_size, saves=saves)
    print("trained", steps, "optimizer steps", file=sys.stderr)


if __name__ == "__main__":
    main()
