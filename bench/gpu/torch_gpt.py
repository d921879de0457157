#!/usr/bin/env python3
"""PyTorch's side of bench/compare-gpu: troupe's GPT (model/, kernels/cuda) written in PyTorch.

The architecture is troupe's, tensor for tensor (checked against `troupe_bench_gpu --layout`):
GPT-2 style, learned positions, pre-LayerNorm blocks (eps 1e-5) with biases everywhere, causal
self-attention, an MLP of width 4C with GELU (tanh approximation), a final LayerNorm and the LM
head tied to the token embedding (wte). Names and shapes follow Hugging Face GPT-2 with
nn.Linear's [out, in] layout, as troupe's ParamLayout does.

  torch_gpt.py bench --troupe-bin PATH [--size gpt2] [--b 8] [--t 1024] [--warmup 10]
                     [--steps 50] [--rounds 3] [--device 0] [--peak-tflops X]
                     [--compile-mode default]
      On a GPU: checks the parameter layout against troupe's, then alternates rounds of troupe
      (troupe_bench_gpu, a subprocess) and PyTorch (torch.compile, bf16 autocast over fp32
      weights, fused AdamW, clip at 1) on the same GPU, config, B and T; times a bf16 GEMM
      (8192³) there as the practical limit; prints a table and, last,
      `summary: troupe_tokens_per_s=… torch_tokens_per_s=… ratio=… mfu_pct=…`.
      --no-compile: eager PyTorch (not the headline). --dry-run-on-cpu: this mode's own logic
      without a GPU (PyTorch on the CPU, --troupe-bin a stand-in): measures nothing, prints no
      summary line.
  torch_gpt.py cpu-smoke [--troupe-bin PATH] [--model-bench PATH] [--size tiny] [--compile]
      On the CPU, fp32: counts the parameters (and checks every tensor's name and shape against
      troupe's when --troupe-bin is given), runs one training step and checks it (loss ≈ ln V at
      initialisation, finite, every parameter tensor moved). With --model-bench (troupe's
      tools/troupe_model_bench), also the function itself: troupe's CPU model's weights and batch
      loaded in, its loss and every parameter's gradient within 1e-5 (relative, norm-wise) of
      PyTorch's, as bench/compare-torch-cpu checks its own copy of the model. Works with Debian's
      python3-torch 1.13 (no torch.compile, no scaled_dot_product_attention: the plain attention).
Exit status: 0 measured (or checked); 1 a check failed or an error; 2 bad usage.
"""
import argparse
import math
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# troupe's GptConfig::Gpt2Small(), Small20M(4096), Tiny(512): vocab, context, layers, heads, width.
SIZES = {
    "gpt2": dict(vocab=50257, context=1024, layers=12, heads=12, width=768),
    "20m": dict(vocab=4096, context=256, layers=6, heads=8, width=512),
    "tiny": dict(vocab=512, context=64, layers=2, heads=4, width=64),
}


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.heads, C // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # flash attention where it applies
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.vocab = vocab
        # Registration order is troupe's ParamLayout order: wte, wpe, h.0.*, …, ln_f.*.
        self.wte = nn.Parameter(torch.empty(vocab, width))
        self.wpe = nn.Parameter(torch.empty(context, width))
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        # GPT-2's initialisation (the timing does not depend on it; the smoke test's loss does).
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if re.search(r"ln_\w+\.weight$", name) else nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte)  # the LM head is wte
        return F.cross_entropy(logits.view(-1, self.vocab).float(), targets.view(-1))


def layout(model):
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def troupe_layout(troupe_bin, size):
    out = subprocess.run([troupe_bin, "--layout", "--size", size], check=True, capture_output=True,
                         text=True).stdout
    tensors = []
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "tensor":
            tensors.append((parts[1], tuple(int(d) for d in parts[2:])))
    total = int(re.search(r"^params=(\d+)$", out, re.M).group(1))
    return tensors, total


def check_layout(model, troupe_bin, size):
    """Prints both parameter counts; False (after printing the first difference) if the tensors'
    names, shapes or order differ from troupe's."""
    ours = layout(model)
    count = sum(math.prod(s) for _, s in ours)
    theirs, troupe_count = troupe_layout(troupe_bin, size)
    print(f"parameters: troupe {troupe_count} (ParamLayout, {len(theirs)} tensors), "
          f"PyTorch {count} ({len(ours)} tensors)")
    if ours == theirs and count == troupe_count:
        print("parameter layout: the same tensors (name, shape, order) on both sides")
        return True
    for i, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            print(f"parameter layout DIFFERS at tensor {i}: troupe {a}, PyTorch {b}")
            break
    else:
        print(f"parameter layout DIFFERS: troupe has {len(theirs)} tensors, PyTorch {len(ours)}")
    return False


def make_optimizer(model, fused):
    # troupe's AdamW: β 0.9 / 0.95, eps 1e-8, weight decay 0.1 on 2-D tensors (matrices and
    # embeddings), none on biases and LayerNorm weights.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    kw = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (TypeError, RuntimeError):
            pass
    try:
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    except TypeError:
        return torch.optim.AdamW(groups, **kw), "for-loop"


def train_step(forward, model, opt, x, y, autocast):
    opt.zero_grad(set_to_none=True)
    if autocast:
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            loss = forward(x, y)
    else:
        loss = forward(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, norm


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


def check_against_troupe_cpu(model, model_bench, size, c, B, T):
    """troupe's CPU model (troupe_model_bench dump) and this one from the same weights and batch:
    False unless the loss and every gradient agree within 1e-5, relative."""
    import json
    import tempfile

    def read(path, dtype):
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=dtype)

    with tempfile.TemporaryDirectory(prefix="torch_gpt_smoke.") as d:
        flags = ["--vocab", c["vocab"], "--context", c["context"], "--layers", c["layers"],
                 "--heads", c["heads"], "--width", c["width"], "--batch", B, "--seq", T,
                 "--seed", 1, "--threads", 1]
        subprocess.run([model_bench, "dump", "--out", d] + [str(f) for f in flags], check=True,
                       stdout=subprocess.DEVNULL)
        meta = json.load(open(f"{d}/meta.json"))
        params = read(f"{d}/params.f32", torch.float32)
        grads = read(f"{d}/grads.f32", torch.float32)
        idx = read(f"{d}/tokens.i32", torch.int32).long().view(B, T)
        tgt = read(f"{d}/targets.i32", torch.int32).long().view(B, T)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for t in meta["tensors"]:
            n = math.prod(t["shape"])
            named[t["name"]].copy_(params[t["offset"]:t["offset"] + n].view(*t["shape"]))
    model.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    errs = {"loss": abs(loss.item() - meta["loss"]) / abs(meta["loss"])}
    for t in meta["tensors"]:
        n = math.prod(t["shape"])
        errs["grad " + t["name"]] = rel_err(grads[t["offset"]:t["offset"] + n].view(*t["shape"]),
                                            named[t["name"]].grad)
    worst = max(errs, key=errs.get)
    ok = all(v <= 1e-5 for v in errs.values())  # also False for NaN
    print(f"against troupe's CPU model ({size}, B={B} T={T}, same weights and batch): loss troupe "
          f"{meta['loss']:.7f} PyTorch {loss.item():.7f}; worst of {len(errs)} (loss, gradients) "
          f"{errs[worst]:.2e} ({worst}), limit 1e-5: {'ok' if ok else 'OVER'}")
    model.zero_grad(set_to_none=True)
    return ok


def cpu_smoke(args):
    c = SIZES[args.size]
    torch.manual_seed(1)
    model = Gpt(c["vocab"], c["context"], c["layers"], c["heads"], c["width"])
    ok = True
    if args.troupe_bin:
        ok = check_layout(model, args.troupe_bin, args.size)
    else:
        print(f"parameters: PyTorch {sum(p.numel() for p in model.parameters())} "
              "(no --troupe-bin: not compared)")
    B, T = 2, min(32, c["context"])
    if args.model_bench:
        ok = check_against_troupe_cpu(model, args.model_bench, args.size, c, B, T) and ok
        torch.manual_seed(1)
        model = Gpt(c["vocab"], c["context"], c["layers"], c["heads"], c["width"])
    x = torch.randint(0, c["vocab"], (B, T))
    y = torch.randint(0, c["vocab"], (B, T))
    forward = model
    if args.compile:
        if not hasattr(torch, "compile"):
            print(f"cpu-smoke: torch {torch.__version__} has no torch.compile")
            return 1
        forward = torch.compile(model)
    opt, kind = make_optimizer(model, fused=False)
    before = [p.detach().clone() for p in model.parameters()]
    start = time.perf_counter()
    loss, norm = train_step(forward, model, opt, x, y, autocast=False)
    seconds = time.perf_counter() - start
    moved = sum(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    finite = all(torch.isfinite(p).all() for p in model.parameters())
    ln_v = math.log(c["vocab"])
    loss_ok = math.isfinite(loss.item()) and abs(loss.item() - ln_v) < 0.5
    print(f"cpu-smoke ({args.size}, fp32, B={B} T={T}, torch {torch.__version__}"
          f"{', torch.compile' if args.compile else ''}, AdamW {kind}): loss {loss.item():.4f} "
          f"(ln V = {ln_v:.4f}), gradient norm {norm.item():.4f}, {moved} of {len(before)} "
          f"tensors moved, {seconds:.2f} s")
    ok = ok and loss_ok and finite and moved == len(before) and math.isfinite(norm.item())
    print(f"cpu-smoke: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def run_troupe(args):
    cmd = [args.troupe_bin, "--size", args.size, "--b", str(args.b), "--t", str(args.t),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--device", str(args.device)]
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    for line in (p.stdout + p.stderr).splitlines():
        if not line.startswith("result:"):
            print("  troupe | " + line)
    m = re.search(r"^result: (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        print(f"troupe_bench_gpu exited with {p.returncode}" + ("" if m else ", no result line"))
        return None
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def run_torch(state, warmup, steps):
    """One round of PyTorch: `warmup` untimed steps, then `steps` timed ones, each synchronised
    (as troupe's: its Step waits for the device). Returns the per-step seconds."""
    model, forward, opt, batches, dev = state
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + steps):
        x_host, y_host = batches[i % len(batches)]
        sync()
        start = time.perf_counter()
        # Host tokens uploaded each step, as troupe's Forward does.
        x = x_host.to(dev, non_blocking=True)
        y = y_host.to(dev, non_blocking=True)
        loss, norm = train_step(forward, model, opt, x, y, autocast=True)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if not (math.isfinite(loss.item()) and math.isfinite(norm.item())):
        raise RuntimeError(f"PyTorch: loss {loss.item()}, gradient norm {norm.item()}: not finite")
    return times


def gemm_tflops(n=8192, reps=20):
    """The bf16 GEMM throughput this device reaches (torch.matmul, n×n×n, median of reps), the
    practical limit beside the data sheet's peak."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / statistics.median(times) / 1e12


def bench(args):
    # --dry-run-on-cpu: this function's own logic (layout check, alternation, table, summary) on a
    # machine without a GPU, PyTorch on the CPU and --troupe-bin a stand-in; measures nothing.
    dev = "cpu" if args.dry_run_on_cpu else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__}: no CUDA device usable (torch.version.cuda = "
              f"{torch.version.cuda}): install the PyPI wheel (pip install torch), which carries "
              "CUDA")
        return 1
    c = SIZES[args.size]
    if not 0 < args.t <= c["context"] or args.b <= 0 or args.steps <= 0 or args.rounds <= 0:
        print(f"expected --b > 0, 0 < --t <= {c['context']}, --steps > 0, --rounds > 0")
        return 2
    if dev == "cuda":
        torch.cuda.set_device(args.device)
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = True  # only fp32 matmuls outside autocast, if any
    torch.backends.cudnn.allow_tf32 = True
    model = Gpt(c["vocab"], c["context"], c["layers"], c["heads"], c["width"])
    if not check_layout(model, args.troupe_bin, args.size):
        return 1
    model = model.to(dev)
    opt, kind = make_optimizer(model, fused=dev == "cuda")
    forward = model
    compiled = hasattr(torch, "compile") and not args.no_compile
    if compiled:
        forward = torch.compile(model,
                                mode=None if args.compile_mode == "default" else args.compile_mode)
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        seq = torch.randint(0, c["vocab"], (args.b, args.t + 1), generator=gen)
        x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        batches.append((x.pin_memory(), y.pin_memory()) if dev == "cuda" else (x, y))
    state = (model, forward, opt, batches, dev)
    tokens = args.b * args.t
    name = torch.cuda.get_device_name(args.device) if dev == "cuda" else "the CPU (dry run)"
    how = f"torch.compile mode {args.compile_mode}" if compiled else "eager (no torch.compile)"
    sdpa = hasattr(F, "scaled_dot_product_attention")
    print(f"device: {name}; torch {torch.__version__} (CUDA {torch.version.cuda}), {how}, bf16 "
          f"autocast over fp32 weights, AdamW {kind}, clip at 1, "
          f"{'scaled_dot_product_attention' if sdpa else 'plain attention'}")
    print(f"config {args.size}: V={c['vocab']} ctx={c['context']} L={c['layers']} H={c['heads']} "
          f"C={c['width']}; B={args.b} T={args.t} ({tokens} tokens/step); {args.rounds} rounds, "
          f"alternating: troupe {args.warmup} warm-up + {args.steps} timed steps (a process each), "
          f"PyTorch 3 warm-up + {args.steps} timed (after {args.warmup} warm-up steps once: "
          "compilation); every step synchronised")

    troupe_ms, torch_ms, result = [], [], None
    for r in range(args.rounds):
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the activations' memory back to the device for troupe
        result = run_troupe(args)
        if result is None:
            return 1
        if result["params"] != sum(p.numel() for p in model.parameters()):
            print(f"troupe ran {int(result['params'])} parameters: not the same model")
            return 1
        troupe_ms.append(result["step_ms"])
        if r == 0:  # after troupe's first round, so that a failing troupe fails fast
            start = time.perf_counter()
            run_torch(state, warmup=max(args.warmup - 1, 0), steps=1)  # compiles
            print(f"PyTorch warm-up (compilation included): {time.perf_counter() - start:.1f} s")
        times = run_torch(state, warmup=3, steps=args.steps)
        torch_ms.append(1e3 * statistics.median(times))
        print(f"round {r + 1}: troupe {troupe_ms[-1]:.3f} ms/step, PyTorch {torch_ms[-1]:.3f} "
              f"ms/step (medians over {args.steps} steps)")

    flops_per_token, peak = result["flops_per_token"], result["peak_tflops"]
    gemm = gemm_tflops() if dev == "cuda" else float("nan")
    t_ms, p_ms = statistics.median(troupe_ms), statistics.median(torch_ms)
    t_tps, p_tps = tokens / (t_ms / 1e3), tokens / (p_ms / 1e3)
    t_mfu = 100 * flops_per_token * t_tps / (peak * 1e12)
    p_mfu = 100 * flops_per_token * p_tps / (peak * 1e12)
    print(f"\nGPT {args.size}, B={args.b} T={args.t}, bf16, on {name}; medians over {args.rounds} "
          f"rounds (min-max); model FLOPs/token 6·N + 12·L·C·T = {flops_per_token:.4g}, peak "
          f"{peak:.0f} TFLOP/s dense bf16")
    print(f"{'metric':14s} {'troupe':>26s} {'PyTorch':>26s} {'ratio':>7s}")
    print(f"{'step ms':14s} {f'{t_ms:.3f} ({min(troupe_ms):.3f}-{max(troupe_ms):.3f})':>26s} "
          f"{f'{p_ms:.3f} ({min(torch_ms):.3f}-{max(torch_ms):.3f})':>26s} {p_ms / t_ms:7.3f}")
    print(f"{'tokens/s':14s} {t_tps:26.0f} {p_tps:26.0f} {t_tps / p_tps:7.3f}")
    print(f"{'TFLOP/s':14s} {flops_per_token * t_tps / 1e12:26.1f} "
          f"{flops_per_token * p_tps / 1e12:26.1f} {'':7s}")
    print(f"{'MFU %':14s} {t_mfu:26.2f} {p_mfu:26.2f} {'':7s}  (limit: 100 = {peak:.0f} TFLOP/s)")
    print(f"{'% of GEMM':14s} {100 * flops_per_token * t_tps / 1e12 / gemm:26.2f} "
          f"{100 * flops_per_token * p_tps / 1e12 / gemm:26.2f} {'':7s}  (bf16 GEMM 8192³ here: "
          f"{gemm:.0f} TFLOP/s)")
    line = (f"troupe_tokens_per_s={t_tps:.1f} torch_tokens_per_s={p_tps:.1f} "
            f"ratio={t_tps / p_tps:.4f} mfu_pct={t_mfu:.2f}")
    print(f"dry run on the CPU, nothing measured: {line}" if dev == "cpu" else f"summary: {line}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bench", help="troupe vs PyTorch on a GPU")
    b.add_argument("--troupe-bin", required=True)
    b.add_argument("--size", choices=SIZES, default="gpt2")
    b.add_argument("--b", type=int, default=8)
    b.add_argument("--t", type=int, default=1024)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--steps", type=int, default=50)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--device", type=int, default=0)
    b.add_argument("--peak-tflops", type=float, default=0)
    b.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune"])
    b.add_argument("--no-compile", action="store_true", help="eager PyTorch (not the headline)")
    b.add_argument("--dry-run-on-cpu", action="store_true",
                   help="check this script without a GPU: PyTorch on the CPU, --troupe-bin a "
                        "stand-in; measures nothing")
    s = sub.add_parser("cpu-smoke", help="the model on the CPU: layout and one fp32 step")
    s.add_argument("--troupe-bin", default="")
    s.add_argument("--model-bench", default="")
    s.add_argument("--size", choices=SIZES, default="tiny")
    s.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    return bench(args) if args.mode == "bench" else cpu_smoke(args)


if __name__ == "__main__":
    sys.exit(main())
