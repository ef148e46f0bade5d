"""If, Loop and Scan as modules that run converted bodies (fx GraphModules) in Python.

Bodies read outer values as extra inputs (``captured``), so gradients flow through the control flow to the outer
parameters. Each body returns a tuple with one entry per ONNX body output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .common import Module


class If(Module):
    def __init__(self, then_branch: nn.Module, else_branch: nn.Module, then_inputs: Sequence[int],
                 else_inputs: Sequence[int], num_outputs: int):
        super().__init__()
        self.then_branch, self.else_branch = then_branch, else_branch
        # positions, in the captured values passed to forward, of each branch's captured inputs
        self.then_inputs, self.else_inputs = list(then_inputs), list(else_inputs)
        self.num_outputs = num_outputs

    def forward(self, cond: torch.Tensor, *captured: torch.Tensor):
        if bool(cond.reshape(())):
            outputs = self.then_branch(*(captured[i] for i in self.then_inputs))
        else:
            outputs = self.else_branch(*(captured[i] for i in self.else_inputs))
        return outputs[0] if self.num_outputs == 1 else tuple(outputs)


class Loop(Module):
    """ONNX Loop: ``for i in range(M) while cond`` over a body(i, cond, *carried, *captured)."""

    def __init__(self, body: nn.Module, num_carried: int, num_scan_outputs: int, num_outputs: int,
                 empty_scan_outputs: Sequence[tuple[tuple[int, ...], torch.dtype | None]] = ()):
        super().__init__()
        self.body = body
        self.num_carried, self.num_scan_outputs, self.num_outputs = num_carried, num_scan_outputs, num_outputs
        # (shape, dtype) of each scan output when the loop runs zero times (dtype None: unknown)
        self.empty_scan_outputs = list(empty_scan_outputs)

    def forward(self, trip_count: torch.Tensor | None, cond: torch.Tensor | None, *values: torch.Tensor):
        carried, captured = list(values[: self.num_carried]), values[self.num_carried :]
        trips = None if trip_count is None else int(trip_count.reshape(()))
        keep_going = True if cond is None else bool(cond.reshape(()))
        cond_value = torch.tensor(True) if cond is None else cond
        scans: list[list[torch.Tensor]] = [[] for _ in range(self.num_scan_outputs)]
        i = 0
        while keep_going and (trips is None or i < trips):
            outputs = self.body(torch.tensor(i, dtype=torch.int64), cond_value, *carried, *captured)
            cond_value = outputs[0]
            carried = list(outputs[1 : 1 + self.num_carried])
            for scan, value in zip(scans, outputs[1 + self.num_carried :], strict=True):
                scan.append(value)
            if cond is not None:  # without a cond input the body's cond output is ignored
                keep_going = bool(cond_value.reshape(()))
            i += 1
        if i == 0 and scans:
            if len(self.empty_scan_outputs) != len(scans) or any(d is None for _, d in self.empty_scan_outputs):
                raise NotImplementedError("Loop ran zero iterations: the type of its scan outputs is unknown")
            device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
            stacked = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in self.empty_scan_outputs]
        else:
            stacked = [torch.stack(scan) for scan in scans]
        outputs = (*carried, *stacked)
        return outputs[0] if self.num_outputs == 1 else outputs


class Scan(Module):
    """ONNX Scan (opset 9+): iterate the body over slices of the scan inputs, carrying state."""

    def __init__(self, body: nn.Module, num_state: int, num_scan_inputs: int, input_axes: Sequence[int],
                 input_directions: Sequence[int], output_axes: Sequence[int], output_directions: Sequence[int],
                 num_outputs: int):
        super().__init__()
        self.body = body
        self.num_state, self.num_scan_inputs = num_state, num_scan_inputs
        self.input_axes, self.input_directions = list(input_axes), list(input_directions)
        self.output_axes, self.output_directions = list(output_axes), list(output_directions)
        self.num_outputs = num_outputs

    def extra_repr(self) -> str:
        return (f"num_scan_inputs={self.num_scan_inputs}, scan_input_axes={self.input_axes}, "
                f"scan_input_directions={self.input_directions}, scan_output_axes={self.output_axes}, "
                f"scan_output_directions={self.output_directions}")

    def forward(self, *values: torch.Tensor):
        n, m = self.num_state, self.num_scan_inputs
        state, scan_inputs, captured = list(values[:n]), values[n : n + m], values[n + m :]
        axes = [a % x.dim() for a, x in zip(self.input_axes, scan_inputs, strict=True)]
        slices = [x.unbind(a) for a, x in zip(axes, scan_inputs, strict=True)]
        slices = [s[::-1] if d else s for s, d in zip(slices, self.input_directions, strict=True)]
        steps = len(slices[0])
        if steps == 0:
            raise NotImplementedError("Scan over zero steps: the shape of its scan outputs is unknown")
        scans: list[list[torch.Tensor]] = [[] for _ in self.output_axes]
        for t in range(steps):
            outputs = self.body(*state, *(s[t] for s in slices), *captured)
            state = list(outputs[:n])
            for scan, value in zip(scans, outputs[n:], strict=True):
                scan.append(value)
        stacked = []
        for scan, axis, direction in zip(scans, self.output_axes, self.output_directions, strict=True):
            scan = scan[::-1] if direction else scan
            stacked.append(torch.stack(scan, axis % (scan[0].dim() + 1)))
        outputs = (*state, *stacked)
        return outputs[0] if self.num_outputs == 1 else outputs


class Scan8(Module):
    """ONNX Scan-8: a batch axis 0 on every input and output, an optional sequence_lens per batch row.

    Scan outputs of rows shorter than the longest are zero past their length."""

    def __init__(self, scan: Scan):
        super().__init__()
        self.scan = scan

    def forward(self, sequence_lens: torch.Tensor | None, *values: torch.Tensor):
        n, m = self.scan.num_state, self.scan.num_scan_inputs
        rows = []
        for b in range(values[0].shape[0]):
            row = [v[b] for v in values[: n + m]]
            if sequence_lens is not None:
                length = int(sequence_lens[b])
                row[n:] = [x[:length] for x in row[n:]]
            rows.append(self.scan(*row, *values[n + m :]))
        rows = [r if isinstance(r, tuple) else (r,) for r in rows]
        outputs = []
        for k, per_row in enumerate(zip(*rows, strict=True)):
            if k >= n:  # scan output: pad every row to the longest along the sequence axis
                longest = max(r.shape[0] for r in per_row)
                per_row = [torch.cat([r, r.new_zeros((longest - r.shape[0], *r.shape[1:]))]) for r in per_row]
            outputs.append(torch.stack(per_row))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
