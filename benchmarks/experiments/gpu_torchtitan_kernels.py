"""torchtitan 0.3.0's Triton kernels (fused_mla, fused_swiglu) on a GPU vs the CPU reference kernels
that tests/test_torchtitan_ops.py registers for its DTensor-rule proofs (#20.5).

The rules of the CUDA-only torchtitan ops are proven on CPU against reference kernels written from
the Triton kernels' math; this script closes the loop on a GPU: each kernel, launched as torchtitan
defines it, equals the reference (fp32 1e-5, bf16 1.6e-2) on MoE-like shapes, offsets that stop
early and at 0 rows, and DeepSeek-V3's MLA head dims (nope 128, rope 64). Needs CUDA + Triton only:
the kernels and their custom ops are read from torchtitan's two files without importing torchtitan
(whose other imports need a newer torch than a GPU image may have).

    mkdir -p /tmp/tt && cp $(python -c "import torchtitan, os; print(os.path.dirname(torchtitan.__file__))")/overrides/fused_{mla,swiglu}.py /tmp/tt/
    cp tests/test_torchtitan_ops.py /tmp/tt/refs_src.py && cp benchmarks/experiments/gpu_torchtitan_kernels.py /tmp/tt/
    python /tmp/tt/gpu_torchtitan_kernels.py    # on the GPU machine; writes $OUT/gpu_titan_kernels.json

Result of 2026-11-27 (H100, torch 2.11.0+cu130, Triton 3.6): 84/84 ok; benchmarks/results/gpu_titan_kernels.json.
Rows past ``offsets[-1]`` are left unwritten by the kernels (``torch.empty``), so they are compared
as unspecified; the rules' Partial rows keep the specified rows exact and leave those unspecified.
"""
import ast, json, os, sys, torch
import torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))

def kernel_module(path, stop):
    lines = open(path).read().splitlines()
    keep = []
    for ln in lines[: stop - 1]:
        # blank, not dropped: Triton reads each kernel's source back by line number from ``path``
        keep.append("" if ln.startswith(("import spmd_types", "from torchtitan")) else ln)
    if not hasattr(torch.Tag, "inplace"):  # torch < 2.12 on the GPU image: the tag only marks the op in place
        keep = [ln.replace("tags=torch.Tag.inplace,", "") for ln in keep]
    ns = {"__name__": "tt_" + os.path.basename(path)[:-3]}
    exec(compile("\n".join(keep), path, "exec"), ns)
    return ns

def stop_line(path, marker):
    return next(i for i, ln in enumerate(open(path).read().splitlines(), 1) if ln.startswith(marker))

mla_path, swi_path = os.path.join(HERE, "fused_mla.py"), os.path.join(HERE, "fused_swiglu.py")
mla = kernel_module(mla_path, stop_line(mla_path, "@spmd.register_autograd_function"))
kernel_module(swi_path, stop_line(swi_path, "def silu_and_mul_autograd_backward"))
src = open(os.path.join(HERE, "refs_src.py")).read()
tree = ast.parse(src)
want = {"_rows_before", "_silu_and_mul_cpu", "_silu_and_mul_backward_cpu", "_rotate", "_fused_mla_k_rope_cpu", "_fused_mla_kv_backward_cpu"}
refs = {"torch": torch, "F": F}
exec(compile(ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in want], []), "refs", "exec"), refs)
tt = torch.ops.torchtitan
g = torch.Generator().manual_seed(0)
def r(*s, dtype): return torch.randn(*s, generator=g).to(dtype)
def rope_inputs(B, L, rope, max_pos=64):
    angles = torch.rand(max_pos, rope // 2, generator=g) * 6.28
    return torch.stack([angles.cos(), angles.sin()], -1), torch.randint(0, max_pos, (B, L), generator=g)
def q_rope_ref(q, cache, pos, nope, inverse):
    return torch.cat([q[..., :nope], refs["_rotate"](q[..., nope:], cache, pos, inverse).to(q.dtype)], -1)
results = []
def check(name, dtype, got, want, rows=None):
    """rows: compare the first ``rows`` rows only (the kernels leave rows past offsets[-1] unwritten:
    torch.empty, so their values are unspecified; the record says whether they happened to be 0)."""
    got = [got] if isinstance(got, torch.Tensor) else list(got); want = [want] if isinstance(want, torch.Tensor) else list(want)
    for i, (a, b) in enumerate(zip(got, want)):
        a = a.cpu().float(); b = b.float()
        if rows is not None:
            results.append(dict(op=name + " rows past offsets[-1] (unspecified)", dtype=str(dtype), out=i, ok=True,
                                happen_to_be_zero=bool((a[rows:] == 0).all())))
            a, b = a[:rows], b[:rows]
        err = (a - b).abs().max().item() if a.numel() else 0.0
        tol = 1e-5 if dtype == torch.float32 else 1.6e-2
        ok = a.shape == b.shape and torch.allclose(a, b, atol=tol, rtol=tol)
        results.append(dict(op=name, dtype=str(dtype), out=i, shape=list(a.shape), max_abs_err=err, ok=bool(ok)))
cuda = torch.device("cuda")
for dtype in (torch.float32, torch.bfloat16):
    for (T, H, offs) in [(64, 96, None), (37, 128, torch.tensor([10, 25, 30])), (16, 64, torch.tensor([0, 0, 16])), (8, 32, torch.tensor([0]))]:
        gate, up, grad = r(T, H, dtype=dtype), r(T, H, dtype=dtype), r(T, H, dtype=dtype)
        o = None if offs is None else offs.to(torch.int32)
        dev = lambda t: None if t is None else t.to(cuda)
        rows = None if offs is None else int(offs[-1])
        check(f"silu_and_mul T={T} offs={None if offs is None else offs.tolist()}", dtype, tt.silu_and_mul(gate.to(cuda), up.to(cuda), dev(o)), refs["_silu_and_mul_cpu"](gate, up, o), rows)
        check(f"silu_and_mul_backward T={T} offs={None if offs is None else offs.tolist()}", dtype,
              tt.silu_and_mul_backward(grad.to(cuda), gate.to(cuda), up.to(cuda), dev(o)), refs["_silu_and_mul_backward_cpu"](grad, gate, up, o), rows)
    for (B, L, Hh, nope, rope, V) in [(2, 5, 3, 8, 4, 6), (1, 7, 16, 128, 64, 128), (2, 3, 1, 16, 8, 16)]:
        cache, pos = rope_inputs(B, L, rope)
        kv, kpe = r(B, L, Hh, nope + V, dtype=dtype), r(B, L, rope, dtype=dtype)
        check(f"fused_mla_k_rope B={B} L={L} H={Hh} nope={nope} rope={rope}", dtype,
              tt.fused_mla_k_rope(kv.to(cuda), kpe.to(cuda), cache.to(cuda), pos.to(cuda), nope), refs["_fused_mla_k_rope_cpu"](kv, kpe, cache, pos, nope))
        gk, gv = r(B, L, Hh, nope + rope, dtype=dtype), r(B, L, Hh, V, dtype=dtype)
        check(f"fused_mla_kv_backward B={B} L={L} H={Hh}", dtype, tt.fused_mla_kv_backward(gk.to(cuda), gv.to(cuda), cache.to(cuda), pos.to(cuda), nope, rope),
              refs["_fused_mla_kv_backward_cpu"](gk, gv, cache, pos, nope, rope))
        for inverse in (False, True):
            q = r(B, L, Hh, nope + rope, dtype=dtype)
            qd = q.to(cuda)
            # torch < 2.12 refuses a custom op returning its input: run the op's own Python body (the launch)
            q_rope = tt.fused_mla_q_rope_ if hasattr(torch.Tag, "inplace") else mla["_fused_mla_q_rope_op"]._init_fn
            ret = q_rope(qd, cache.to(cuda), pos.to(cuda), nope, inverse)
            check(f"fused_mla_q_rope_ inverse={inverse} B={B} L={L} H={Hh} (in place: returns q)", dtype, qd, q_rope_ref(q, cache, pos, nope, inverse))
            results.append(dict(op="fused_mla_q_rope_ returns its input", dtype=str(dtype), ok=bool(ret.data_ptr() == qd.data_ptr())))
out = os.environ.get("OUT", "/tmp")
json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), results=results), open(os.path.join(out, "gpu_titan_kernels.json"), "w"), indent=1)
bad = [x for x in results if not x["ok"]]
for x in results: print(("OK  " if x["ok"] else "BAD ") + json.dumps(x))
print(f"{len(results) - len(bad)}/{len(results)} ok on {torch.cuda.get_device_name()} torch {torch.__version__}")
sys.exit(1 if bad else 0)
