"""Why did gpt-125m's training under the triton backend's blockwise recipe go NaN at its first step? Each of
gpt-125m's linears (4096 tokens) through BlockwiseLinearFn with FP32 and BF16 weights: are Y, dX and dW finite,
and their SQNR against the exact (FP64) products; first, is the weight cast's transposed copy Y's transpose,
bit for bit, from either input dtype; last, two layers of the decoder trained three steps, naming the
parameters whose gradients are not finite.

Usage on the GPU box: python3 research/weight_cast_probe.py
"""

from __future__ import annotations

import dataclasses

import torch
from fp8bench_kernels.quantize_blockwise import quantize_blockwise, quantize_blockwise_both

from fp8bench.backends import get_backend
from fp8bench.backends.triton import BlockwiseLinearFn
from fp8bench.config.compose import expand
from fp8bench.core.numerics import sqnr_db
from fp8bench.models.decoder import LlamaDecoder, lm_loss
from fp8bench.run.plan import plan

LINEARS = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]  # gpt-125m's qkv, o, up, down: (out, in)
TOKENS = 4096


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def main() -> None:
    [point], _ = expand(["workload=train", "model=gpt-125m", "backend=triton", "format=e4m3", "scaling=blockwise"])
    [case] = plan([point])
    recipe, pow2 = case.recipe, case.recipe.scaling_cfg.pow2_scales
    for n, k in [(2304, 768), (768, 3072), (4096, 4096)]:
        for dtype in (torch.float32, torch.bfloat16):
            w = torch.randn(n, k, device="cuda").to(dtype) * 0.02
            y, s, yt, _ = quantize_blockwise_both(w, weight=True, pow2_scales=pow2)
            y0, s0 = quantize_blockwise(w, (128, 128), pow2)
            print("weight cast", n, k, dtype, "y==", torch.equal(bits(y), bits(y0)), "yt==y.t",
                  torch.equal(bits(yt), bits(y0.t().contiguous())), "s==", torch.equal(s, s0), flush=True)
    for n, k in LINEARS:
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(TOKENS, k, device="cuda", generator=g).bfloat16().requires_grad_(True)
            w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype).requires_grad_(True)
            dy = torch.randn(TOKENS, n, device="cuda", generator=g).bfloat16() * 1e-3
            y = BlockwiseLinearFn.apply(x, w, recipe)
            y.backward(dy)
            exact = (x.double() @ w.double().t(), dy.double() @ w.double(), dy.double().t() @ x.double())
            got = (y, x.grad, w.grad)
            sqnr = [f"{sqnr_db(e, t.double()):.1f}" for e, t in zip(exact, got, strict=True)]
            print(n, k, dtype, "finite", [bool(torch.isfinite(t).all()) for t in got], "sqnr y, dx, dw", sqnr,
                  flush=True)
    torch.manual_seed(0)
    model = get_backend("triton").prepare_training(
        LlamaDecoder(dataclasses.replace(point.model, layers=2), 256, device="cuda"), recipe).model
    tokens = torch.randint(0, 256, (8, 513), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=4e-5)
    for step in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = lm_loss(logits.float(), tokens[:, 1:])
        loss.backward()
        bad = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        print(step, loss.item(), "nonfinite grads:", bad, flush=True)
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
