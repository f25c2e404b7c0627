"""Buggy variants of stages 1-3. Each must make at least one graded test fail."""
from . import Mutant

MUTANTS = [
    # ---- a01: the transfer counter, the profiler report, the answers
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "direction swapped",
           [("            if src.device.type == \"cpu\":\n                self.htod += 1",
             "            if src.device.type == \"cpu\":\n                self.dtoh += 1")]),
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "copy_ not counted",
           [("elif func is torch.ops.aten.copy_.default:", "elif False:")]),
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "same-device copies counted",
           [("src.device.type != dst.device.type:", "True:")]),
    # Classified by the destination alone: every copy into a GPU counts as host-to-device (device-to-device
    # and peer copies too).
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "device-to-device copies counted as host-to-device",
           [("and src.device.type != dst.device.type:",
             "and (src.device.type != dst.device.type or dst.device.type == \"cuda\"):"),
            ("            if src.device.type == \"cpu\":\n                self.htod += 1",
             "            if dst.device.type == \"cuda\":\n                self.htod += 1")],
           expect=("counted htod=1",), grader=("HostTransferCounter on", "expected [[0, 0]]")),
    # transfer_report taking a Memcpy DtoD (and PtoP) for a host-to-device copy: only a GPU run shows it.
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "transfer_report counts Memcpy DtoD as HtoD",
           [("        if \"memcpy\" in name and \"htod\" in name:",
             "        if \"memcpy\" in name and \"dtoh\" not in name:")],
           gpu=True, expect=("transfer_report on a device-to-device copy",),
           grader=("transfer_report on a device-to-device copy",)),
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "result of the op dropped",
           [("        return out\n        # END TODO(a01)\n\n\n@dataclass", "        return None\n        # END TODO(a01)\n\n\n@dataclass")]),
    Mutant("a01_roundtrip_linear", "answers.toml", "wrong answer", [("transfers_with_bias = 4", "transfers_with_bias = 5")]),
    Mutant("a01_roundtrip_linear", "roundtrip_linear.py", "report not per call (GPU)",
           [("return TransferReport(htod / calls, dtoh / calls,", "return TransferReport(htod, dtoh,")], gpu=True),
    # ---- a02: pre-transposed weights
    Mutant("a02_pretransposed_linear", "pretransposed_linear.py", "transpose per call",
           [("nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)",
             "nn.Parameter(weight.detach().contiguous(), requires_grad=False)"),
            ("        y = x @ self.weight_t\n", "        y = x @ self.weight_t.t().contiguous()\n")]),
    # W^T rebuilt on every call from rows of W: no op that names a copy (clone, contiguous, t) shows it.
    Mutant("a02_pretransposed_linear", "pretransposed_linear.py", "W^T rebuilt per call by stack(unbind)",
           [("nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)",
             "nn.Parameter(weight.detach().contiguous(), requires_grad=False)"),
            ("        in_features = self.weight_t.shape[0]\n", "        in_features = self.weight_t.shape[1]\n"),
            ("        y = x @ self.weight_t\n", "        y = x @ torch.stack(self.weight_t.unbind(0), 1)\n")],
           expect=("weight_t",), grader=("not W^T",)),
    Mutant("a02_pretransposed_linear", "pretransposed_linear.py", "W^T kept as a strided view",
           [("weight.detach().t().contiguous()", "weight.detach().t()")]),
    Mutant("a02_pretransposed_linear", "pretransposed_linear.py", "bias dropped",
           [("return (y.to(\"cpu\") + self.bias_host).to(x.device)", "return y")]),
    Mutant("a02_pretransposed_linear", "pretransposed_linear.py", "bias added on the device from a device copy",
           [("return (y.to(\"cpu\") + self.bias_host).to(x.device)", "return y + self.bias_host.to(x.device)")]),
    # ---- a03: bias kernel and fused Linear
    Mutant("a03_fused_linear", "add_bias.py", "off-by-one row mask",
           [("mask = (rows[:, None] < M) & col_ok[None, :]", "mask = (rows[:, None] < M - 1) & col_ok[None, :]")]),
    Mutant("a03_fused_linear", "add_bias.py", "column mask off by one",      # reads b[N] and y[.., N]: past the end
           [("col_ok = cols < N", "col_ok = cols <= N")], expect=("add_bias_kernel", "out of bounds")),
    Mutant("a03_fused_linear", "add_bias.py", "row stride ignored",
           [("tl.load(y_ptr + rows[:, None] * stride_ym", "tl.load(y_ptr + rows[:, None] * N")]),
    Mutant("a03_fused_linear", "add_bias.py", "bias broadcast along the wrong axis",
           [("b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)", "b = tl.load(b_ptr + cols * 0, mask=col_ok, other=0.0)")]),
    Mutant("a03_fused_linear", "add_bias.py", "torch add instead of the kernel",
           [("    out = torch.empty_like(y) if y.is_contiguous() else torch.empty_like(y, memory_format=torch.contiguous_format)\n    if out.numel():\n        # [rows, N] views; a 2-D y already is one (a view object costs host time: lecture 3, \"Host overhead\")\n        y2, out2 = (y, out) if y.dim() == 2 else (y.reshape(-1, N), out.view(-1, N))\n        _launch(y2, b.contiguous(), out2)\n    return out",
             "    return y + b")]),
    Mutant("a03_fused_linear", "add_bias.py", "strided bias passed to the kernel as is",
           [("_launch(y2, b.contiguous(), out2)", "_launch(y2, b, out2)")]),
    Mutant("a03_fused_linear", "add_bias.py", "no shape check",
           [("    if b.shape[0] != y.shape[-1]:", "    if False:")]),
    Mutant("a03_fused_linear", "fused_linear.py", "W^T rebuilt per call by stack(unbind)",
           [("        w = weight.t()                       # W^T, a view\n",
             "        w = torch.stack(weight.unbind(0), 1)\n")],
           expect=("weight copy",), grader=("copied an input on every call",)),
    Mutant("a03_fused_linear", "fused_linear.py", "bias dropped from the GEMM",
           [("y = torch.addmm(bias, x2, w)", "y = x2 @ w")]),
    Mutant("a03_fused_linear", "fused_linear.py", "bias added outside the GEMM",
           [("y = torch.addmm(bias, x2, w)", "y = x2 @ w + bias")]),
    Mutant("a03_fused_linear", "fused_linear.py", "F.linear as the addmm backend",   # the baseline itself
           [("y = torch.addmm(bias, x2, w)", "y = torch.nn.functional.linear(x2, self.weight, bias)")],
           expect=("F.linear",)),
    Mutant("a03_fused_linear", "fused_linear.py", "F.linear as the triton backend",
           [("_launch(y, bias.contiguous(), y)", "y = torch.nn.functional.linear(x2, weight, bias)")]),
    Mutant("a03_fused_linear", "fused_linear.py", "no device/dtype check",
           [("x.dtype != weight.dtype or ", ""),
            ("or x.get_device() != weight.get_device() or not (x.is_cuda or x.device == weight.device):", ":")]),
    # add_bias_ by reshape instead of view: where y's leading dims cannot be viewed as [rows, N], reshape
    # copies y, the bias goes into the copy and y comes back unchanged, with no error.
    Mutant("a03_fused_linear", "add_bias.py", "add_bias_ adds into a reshaped copy of y",
           [("y2 = y if y.dim() == 2 else y.view(-1, N)", "y2 = y if y.dim() == 2 else y.reshape(-1, N)")],
           expect=("add_bias_ left y unchanged",), grader=("not viewable as [rows, N]",)),
    # y's strides taken to be (N, 1): right for a contiguous y only.
    Mutant("a03_fused_linear", "add_bias.py", "y's strides assumed (N, 1)",
           [("y2, b, out2, M, N, y2.stride(0), y2.stride(1), out2", "y2, b, out2, M, N, N, 1, out2")],
           grader=("with strides",)),
    # The grid rounded down: the last partial block of rows and columns is never written. The grader
    # says so: "N of M outputs never written ... check the grid and the mask" where some blocks ran, or
    # "the output was never written" where the shape drawn is smaller than one block (no program at all).
    Mutant("a03_fused_linear", "add_bias.py", "grid rounded down (the last partial blocks never written)",
           [("grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))", "grid = (M // BLOCK_M, N // BLOCK_N)")],
           grader=("never written (still NaN)",)),
    # Rows alone rounded down, kept at one program at least: right wherever M fits one block of rows, so
    # the tests need M above BLOCK_M and not a multiple of it (201 and 1029 rows).
    Mutant("a03_fused_linear", "add_bias.py", "grid of max(1, M // BLOCK_M) row blocks",
           [("grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))", "grid = (max(1, M // BLOCK_M), cdiv(N, BLOCK_N))")]),
]
