"""If, Loop and Scan as modules that run converted bodies (fx GraphModules) in Python.

Bodies read outer values as extra inputs (``captured``), so gradients flow through the control flow to the outer
parameters. Each body returns a tuple with one entry per ONNX body output.

While compiling or exporting (``torch.compiler.is_compiling()``), a condition or trip count is data, and the Python
forms would read it (``bool(cond)``, ``int(trip_count)``): Dynamo breaks the graph there and torch.export fails. So
each module then takes a structured form that keeps the model one graph with dynamic sizes: If becomes
``torch.cond``; Loop and Scan become ``torch.while_loop``, which carries fixed-shape values, so each scan output is
a buffer allocated before the loop ([number of iterations, *the body output's shape], that shape learned from the
body's metadata) that step i writes with ``index_copy``. A Loop whose condition can stop it early first counts its
iterations with a loop over only what the condition depends on (``cond_state``), then runs exactly that many.
Where no structured form exists (sequence or optional values, branches of different dtypes or ranks, carried values
that change shape), compiling breaks the graph there with the reason (fullgraph=True reports it) and exporting fails
with it; eager mode never takes these forms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from .. import torch_compat
from .common import Module


def _fixed(value: torch.Tensor) -> torch.Tensor:
    """A copy with canonical strides: torch.cond and torch.while_loop want outputs that alias no input, and
    while_loop carried values whose metadata, strides included, the body keeps."""
    return value.clone(memory_format=torch.contiguous_format)


def _all_tensors(values) -> bool:
    return all(isinstance(v, torch.Tensor) for v in values)


def _unstructured(op: str, why: str, run: Callable):
    """The Python form while tracing, after saying why no structured form exists: Dynamo breaks the graph here
    (an error under fullgraph=True that shows ``why``); torch.export without Dynamo fails with ``why`` if it fails."""
    message = f"{op} cannot be compiled in one graph: {why}"
    if torch.compiler.is_dynamo_compiling():
        torch_compat.graph_break(message)
        return run()
    try:
        return run()
    except Exception as error:
        raise RuntimeError(message) from error


def _while(step: Callable, limit: torch.Tensor | None, honour_cond: bool, cond: torch.Tensor,
           state: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor]) -> tuple:
    """``step(i, cond, *state) -> (cond, state, scan values)`` while ``i < limit`` (when given) and ``cond`` (when
    honoured), the scan values of step i written to row i of ``buffers``; returns (iterations, state, buffers).
    The limit travels as a carried value: an outer unbacked value read by the loop's functions cannot be lifted."""
    n = len(state)
    bounded = limit is not None
    if not bounded:
        limit = torch.zeros((), dtype=torch.int64, device=cond.device)

    def cond_fn(i, c, last, *_):
        go = i < last if bounded else i >= 0
        return go & c if honour_cond else go

    # The buffers travel flat: torch 2.14's while_loop gives a carried tensor's outer strides unbacked symbols that
    # a buffer the body rewrites (contiguous, strides from its sizes) would not match; a 1-D tensor's stride is 1.
    def body_fn(i, c, last, *values):
        c, new_state, scans = step(i, c, *values[:n])
        written = [b.view(-1, *s.shape).index_copy(0, i.reshape(1), s.unsqueeze(0)).reshape(-1)
                   for b, s in zip(values[n:], scans, strict=True)]
        return (i + 1, _fixed(c.reshape(()).to(torch.bool)), last.clone(), *(_fixed(s) for s in new_state), *written)

    start = torch.zeros((), dtype=torch.int64, device=cond.device)
    carried = (start, _fixed(cond), _fixed(limit), *(_fixed(s) for s in state), *(b.reshape(-1) for b in buffers))
    out = torch_compat.while_loop(cond_fn, body_fn, carried)
    return out[0], out[3 : 3 + n], [b.view(buffer.shape) for b, buffer in zip(out[3 + n :], buffers, strict=True)]


def _buffers(rows, scans: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros((rows, *s.shape), dtype=s.dtype, device=s.device) for s in scans]


class If(Module):
    """ONNX If; ``uncompilable``: why the branches cannot be one ``torch.cond`` (their outputs differ in dtype or
    rank, or are not tensors), when the converter knows it."""

    def __init__(self, then_branch: nn.Module, else_branch: nn.Module, then_inputs: Sequence[int],
                 else_inputs: Sequence[int], num_outputs: int, uncompilable: str | None = None):
        super().__init__()
        self.then_branch, self.else_branch = then_branch, else_branch
        # positions, in the captured values passed to forward, of each branch's captured inputs
        self.then_inputs, self.else_inputs = list(then_inputs), list(else_inputs)
        self.num_outputs = num_outputs
        self.uncompilable = uncompilable

    def forward(self, cond: torch.Tensor | bool, *captured: torch.Tensor):
        """``cond``: a tensor, or a Python bool computed from sizes (symbolic under tracing: a guard on them; in a
        one-element list where the graph computes a 1-d condition)."""
        cond = cond[0] if isinstance(cond, list) else cond
        if torch.compiler.is_compiling() and isinstance(cond, torch.Tensor):
            if self.why_unstructured(captured) is not None:
                return _unstructured("If", self.why_unstructured(captured), lambda: self._python(cond, captured))
            return self._structured(cond, captured)
        if self.carries(cond, captured):
            return self._structured(cond, captured)
        return self._python(cond, captured)

    def why_unstructured(self, captured: Sequence) -> str | None:
        """Why the branches cannot be one torch.cond; None where they can."""
        if self.uncompilable is not None:
            return self.uncompilable
        return None if _all_tensors(captured) else "a branch reads a sequence or optional value"

    def carries(self, cond, captured: Sequence) -> bool:
        """Whether a condition computed from sizes becomes torch.cond: under torch.export (Dynamo guards on it and
        recompiles), where it holds for some of the sizes only and the branches can be one torch.cond. The program
        then keeps both branches (to_onnx writes an If) where a Python branch would keep one, for those sizes."""
        return (isinstance(cond, torch.SymBool) and not torch.compiler.is_dynamo_compiling()
                and not torch_compat.known_true(cond) and not torch_compat.known_true(torch.sym_not(cond))
                and self.why_unstructured(captured) is None)

    def _python(self, cond: torch.Tensor | bool, captured: Sequence[torch.Tensor]):
        if bool(cond.reshape(()) if isinstance(cond, torch.Tensor) else cond):
            outputs = self.then_branch(*(captured[i] for i in self.then_inputs))
        else:
            outputs = self.else_branch(*(captured[i] for i in self.else_inputs))
        return outputs[0] if self.num_outputs == 1 else tuple(outputs)

    def _structured(self, cond: torch.Tensor | torch.SymBool, captured: Sequence[torch.Tensor]):
        def branch(module: nn.Module, inputs: Sequence[int]) -> Callable:
            def run(*operands):
                outputs = module(*(operands[i] for i in inputs))
                if not _all_tensors(outputs):
                    raise RuntimeError("If cannot be compiled in one graph: a branch returns a sequence or optional "
                                       "value, and torch.cond returns tensors only")
                return tuple(_fixed(o) for o in outputs)
            return run

        pred = cond.reshape(()).to(torch.bool) if isinstance(cond, torch.Tensor) else cond
        outputs = torch.cond(pred, branch(self.then_branch, self.then_inputs),
                             branch(self.else_branch, self.else_inputs), tuple(captured))
        return outputs[0] if self.num_outputs == 1 else tuple(outputs)


class Taken(Module):
    """An If whose condition conversion knows: the branch it takes, alone."""

    def __init__(self, branch: nn.Module, num_outputs: int):
        super().__init__()
        self.branch, self.num_outputs = branch, num_outputs

    def forward(self, *captured: torch.Tensor):
        outputs = self.branch(*captured)
        return outputs[0] if self.num_outputs == 1 else tuple(outputs)


class Loop(Module):
    """ONNX Loop: ``for i in range(M) while cond`` over a body(i, cond, *carried, *captured)."""

    def __init__(self, body: nn.Module, num_carried: int, num_scan_outputs: int, num_outputs: int,
                 empty_scan_outputs: Sequence[tuple[tuple[int, ...], torch.dtype | None]] = (),
                 cond_state: Sequence[int] | None = None):
        super().__init__()
        self.body = body
        self.num_carried, self.num_scan_outputs, self.num_outputs = num_carried, num_scan_outputs, num_outputs
        # (shape, dtype) of each scan output when the loop runs zero times (dtype None: unknown)
        self.empty_scan_outputs = list(empty_scan_outputs)
        # the carried values (positions) that the body's cond output depends on; None: all of them
        self.cond_state = None if cond_state is None else list(cond_state)

    def forward(self, trip_count: torch.Tensor | None, cond: torch.Tensor | None, *values: torch.Tensor):
        if torch.compiler.is_compiling():
            carried, captured = values[: self.num_carried], values[self.num_carried :]
            why = self._why_unstructured(trip_count, cond, carried)
            if why is not None:
                return _unstructured("Loop", why, lambda: self._python(trip_count, cond, *values))
            return self._structured(trip_count, cond, carried, captured)
        return self._python(trip_count, cond, *values)

    def _why_unstructured(self, trip_count, cond, carried) -> str | None:
        if torch_compat.while_loop is None:
            return f"torch {torch.__version__} has no while_loop"
        if not _all_tensors([v for v in (trip_count, cond) if v is not None]) or not _all_tensors(carried):
            return "it carries a sequence or optional value, and torch.while_loop carries tensors only"
        if not carried and trip_count is None and cond is None:
            return "it has no trip count, no condition and no carried value"
        return None

    def _structured(self, trip_count: torch.Tensor | None, cond: torch.Tensor | None,
                    carried: Sequence[torch.Tensor], captured: Sequence):
        n = self.num_carried
        device = (trip_count if trip_count is not None else cond if cond is not None else carried[0]).device
        first = torch.ones((), dtype=torch.bool, device=device) if cond is None else cond.reshape(()).to(torch.bool)
        limit = None if trip_count is None else trip_count.reshape(()).to(torch.int64)

        def step(i, c, *state):
            outputs = self.body(i, c, *state, *captured)
            self._check_carried(state, outputs[1 : 1 + n])
            return outputs[0], outputs[1 : 1 + n], outputs[1 + n :]

        if not self.num_scan_outputs:
            _, state, _ = _while(step, limit, cond is not None, first, carried, [])
        else:
            if cond is not None:  # it may stop early: count its iterations first, then run exactly that many
                limit = self._count(limit, first, carried, captured)
            elif limit is None:
                raise RuntimeError("Loop cannot be compiled in one graph: it has scan outputs and neither a trip "
                                   "count nor a condition, so nothing bounds them")
            rows = limit.clamp(min=0).item()
            torch._check(rows >= 0)
            start = torch.zeros((), dtype=torch.int64, device=device)
            scans = torch_compat.metadata_only(step, start, first, *carried)[2]
            _, state, buffers = _while(step, limit, False, first, carried, _buffers(rows, scans))
            state = (*state, *buffers)
        return state[0] if self.num_outputs == 1 else tuple(state)

    def _count(self, limit: torch.Tensor | None, first: torch.Tensor, carried: Sequence[torch.Tensor],
               captured: Sequence) -> torch.Tensor:
        """The number of iterations the loop runs, from a loop over the cond output and the carried values it
        depends on (the others stay at their initial values: what they feed is not needed)."""
        kept = range(self.num_carried) if self.cond_state is None else self.cond_state

        def step(i, c, *values):
            state = list(carried)
            for k, value in zip(kept, values, strict=True):
                state[k] = value
            outputs = self.body(i, c, *state, *captured)
            return outputs[0], [outputs[1 + k] for k in kept], []

        count, _, _ = _while(step, limit, True, first, [carried[k] for k in kept], [])
        return count

    @staticmethod
    def _check_carried(before: Sequence[torch.Tensor], after: Sequence) -> None:
        for k, (old, new) in enumerate(zip(before, after, strict=True)):
            if not isinstance(new, torch.Tensor) or new.dtype != old.dtype or new.shape != old.shape:
                kind = f"{new.dtype} {list(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
                raise RuntimeError(
                    f"Loop cannot be compiled in one graph: carried value {k} enters the body as {old.dtype} "
                    f"{list(old.shape)} and leaves it as {kind}; torch.while_loop carries values of one fixed shape")

    def _python(self, trip_count: torch.Tensor | None, cond: torch.Tensor | None, *values: torch.Tensor):
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
        if torch.compiler.is_compiling():
            if torch_compat.while_loop is None:
                return _unstructured("Scan", f"torch {torch.__version__} has no while_loop",
                                     lambda: self._python(state, scan_inputs, captured))
            return self._structured(state, scan_inputs, captured)
        return self._python(state, scan_inputs, captured)

    def _structured(self, state: Sequence[torch.Tensor], scan_inputs: Sequence[torch.Tensor], captured: Sequence):
        n = self.num_state
        axes = [a % x.dim() for a, x in zip(self.input_axes, scan_inputs, strict=True)]
        steps = scan_inputs[0].shape[axes[0]]
        device = scan_inputs[0].device
        limit = torch.full((), steps, dtype=torch.int64, device=device)

        def step(i, c, *values):
            slices = [x.index_select(a, (limit - 1 - i if d else i).reshape(1)).squeeze(a)
                      for x, a, d in zip(scan_inputs, axes, self.input_directions, strict=True)]
            outputs = self.body(*values, *slices, *captured)
            return c, outputs[:n], outputs[n:]

        true = torch.ones((), dtype=torch.bool, device=device)
        scans = torch_compat.metadata_only(step, torch.zeros((), dtype=torch.int64, device=device), true, *state)[2]
        _, state, buffers = _while(step, limit, False, true, state, _buffers(steps, scans))
        stacked = []
        for buffer, axis, direction in zip(buffers, self.output_axes, self.output_directions, strict=True):
            buffer = buffer.flip(0) if direction else buffer
            stacked.append(buffer.movedim(0, axis % buffer.dim()))
        outputs = (*state, *stacked)
        return outputs[0] if self.num_outputs == 1 else outputs

    def _python(self, state: list[torch.Tensor], scan_inputs: Sequence[torch.Tensor], captured: Sequence):
        n = self.num_state
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
