#!/usr/bin/python3
"""The torchrun peer of `troupe train`: a tiny GPT trained with DDP over gloo on CPU.

Started by torchrun (one process per rank). Every step is checkpointed atomically by rank 0
(temp file, fsync, os.replace, fsync of the folder) and only then counted as committed: rank 0
appends `commit step=<n> t=<time.time()> restart=<k>` to the commit log (flushed and fsynced),
where k is torchrun's restart count, so a reader can tell the first group from a restarted one.
On every (re)start the job resumes from the checkpoint, so a restart redoes no committed step.

Data is synthetic and deterministic: the batch of step n on rank r depends only on (seed, n, r),
so a resumed run sees exactly the batches an uninterrupted run would. The global batch is fixed
(--global-batch sequences, split evenly over the ranks).

--size picks troupe's GPT sizes (model/config.cc: tiny, small20m) with vocab 512, the vocabulary
of the corpus `troupe train` prepares; --ckpt-every N checkpoints (and commits) every N steps only
(a step in between is logged as `commit` too, with ckpt=0: training throughput, not recovery).

Usage (under torchrun): torchrun_job.py --steps 40 --ckpt-dir DIR --commit-log FILE
       [--size tiny|small20m] [--seq S] [--global-batch B] [--ckpt-every N]
The commit log may also come from $COMMIT_LOG.
"""
import argparse
import os
import re
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB = 512
# name -> (context, layers, heads, width), as troupe's GptConfig::Tiny / Small20M.
SIZES = {"tiny": (64, 2, 4, 64), "small20m": (256, 6, 8, 512)}


class TinyGPT(nn.Module):
    """Pre-norm causal transformer: token + position embeddings, LAYERS blocks, LM head."""

    def __init__(self, size="tiny"):
        super().__init__()
        context, layers, heads, width = SIZES[size]
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        causal = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x, src_mask=self.causal[: idx.shape[1], : idx.shape[1]])
        return self.head(self.norm(x))


def batch(seed, step, rank, rows, seq_len):
    """Arithmetic sequences mod VOCAB with a random start and stride: learnable, deterministic."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    start = torch.randint(0, VOCAB, (rows, 1), generator=g)
    stride = torch.randint(1, 9, (rows, 1), generator=g)
    seq = (start + stride * torch.arange(seq_len + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def fsync_append(path, line, sync=True):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        if sync:  # a line that a checkpoint backs is durable; one between them need not be
            os.fsync(f.fileno())


def save_atomically(path, state):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def loaded_blas():
    torch.ones(8, 8) @ torch.ones(8, 8)
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted({os.path.realpath(p) for p in paths
                   if re.search(r"blas|lapack|mkl", os.path.basename(p))})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step, all ranks")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--commit-log", default=os.environ.get("COMMIT_LOG"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--seq", type=int, default=0, help="sequence length; 0: the size's context")
    p.add_argument("--ckpt-every", type=int, default=1)
    args = p.parse_args()
    seq_len = args.seq or SIZES[args.size][0]
    if not args.commit_log:
        p.error("--commit-log or $COMMIT_LOG is required")

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE come from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    assert args.global_batch % world == 0, "global batch must split evenly over the ranks"
    rows = args.global_batch // world

    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = TinyGPT(args.size)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ckpt = os.path.join(args.ckpt_dir, "ckpt.pt")
    done = 0
    if os.path.exists(ckpt):  # every rank reads the same durable checkpoint
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        done = state["step"]
    ddp = DDP(model, broadcast_buffers=False)

    if rank == 0:
        if restart == 0 and done == 0:
            nparams = sum(t.numel() for t in model.parameters())
            print(f"torch {torch.__version__}, {world} ranks, {torch.get_num_threads()} thread(s) "
                  f"each, {nparams} params, BLAS: {', '.join(loaded_blas()) or 'none found'}",
                  flush=True)
        fsync_append(args.commit_log, f"start restart={restart} resume_step={done} t={time.time():.6f}")

    for step in range(done + 1, args.steps + 1):
        x, y = batch(args.seed, step, rank, rows, seq_len)
        loss = F.cross_entropy(ddp(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if rank == 0:
            saved = step % args.ckpt_every == 0 or step == args.steps
            if saved:
                save_atomically(ckpt, {"step": step, "model": model.state_dict(),
                                       "optim": opt.state_dict()})
            fsync_append(args.commit_log,
                         f"commit step={step} t={time.time():.6f} restart={restart} "
                         f"loss={loss.item():.4f} ckpt={int(saved)}", sync=saved)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
