"""oneDNN's prepacked int8 product against torch._int_mm (the plan's
``int8-dynamic``), on random weights of the 0.5B's decoder shapes: 24 layers
of the seven products (more bytes than the caches hold), then one layer
repeated (cache-hot, as the kernel plan's table times it). Checks first that
the two give the same bits: activations quantized per row to int8, offset by
128 for oneDNN's unsigned input (zero point 128), x_scale 1.0, the weights'
per-row scales, float32 output.

    python scripts/onednn_int8.py

docs/kernels.md, "Design decisions": the blocked copy (kept as the
second copy; as the one copy: "Tried and not kept").
"""
import torch, time
torch.set_num_threads(2)
shapes = [(896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896), (896, 4864)]
L = 24
W = [[torch.randint(-127, 127, (n, k), dtype=torch.int8) for n, k in shapes] for _ in range(L)]
S = [[torch.rand(n) * 0.01 + 0.001 for n, k in shapes] for _ in range(L)]
op = torch.ops.onednn
P = [[op.qlinear_prepack(w, None) for w in layer] for layer in W]
Z = [[torch.zeros(n, dtype=torch.int64) for n, k in shapes] for _ in range(L)]
def ql(xu8, pw, s, z):
    return op.qlinear_pointwise(xu8, 1.0, 128, pw, s, z, None, 1.0, 0, torch.float32, "none", [], "")
# correctness vs _int_mm
x = torch.randint(-127, 127, (9, 896), dtype=torch.int8)
xu = (x.to(torch.int16) + 128).to(torch.uint8)
ref = torch.mul(torch._int_mm(x, W[0][4].t()), S[0][4])
got = ql(xu, P[0][4], S[0][4], Z[0][4])
print("max diff", (ref - got).abs().max().item(), "equal", torch.equal(ref, got), got.dtype, got.shape)
def run(M, how):
    X = [torch.randint(-127, 127, (M, k), dtype=torch.int8) for n, k in shapes]
    XU = [(x.to(torch.int16) + 128).to(torch.uint8) for x in X]
    def f():
        for li in range(L):
            for j in range(7):
                if how == "int_mm":
                    torch.mul(torch._int_mm(X[j], W[li][j].t()), S[li][j])
                else:
                    ql(XU[j], P[li][j], S[li][j], Z[li][j])
    for _ in range(2): f()
    ts = []
    for _ in range(7):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return sorted(ts)[3] * 1e3
for M in (1, 2, 5, 9, 17, 64):
    print(M, " ".join(f"{how} {run(M, how):.1f} ms" for how in ("int_mm", "qlinear")), flush=True)
print("again, alternating")
for rep in range(3):
    for M in (1, 9, 512):
        print(M, " ".join(f"{how} {run(M, how):.1f} ms" for how in ("int_mm", "qlinear")), flush=True)
# cache-hot, one layer (as measure_table times it)
def hot(M, how, n=50):
    X = [torch.randint(-127, 127, (M, k), dtype=torch.int8) for n_, k in shapes]
    XU = [(x.to(torch.int16) + 128).to(torch.uint8) for x in X]
    def f():
        for j in range(7):
            if how == "int_mm":
                torch.mul(torch._int_mm(X[j], W[0][j].t()), S[0][j])
            else:
                ql(XU[j], P[0][j], S[0][j], Z[0][j])
    for _ in range(5): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e3
for M in (1, 2, 9, 17, 64, 512):
    print("hot one layer", M, " ".join(f"{how} {hot(M, how, 10 if M == 512 else 50):.3f} ms" for how in ("int_mm", "qlinear")), flush=True)
