"""A masked recurrence back to ONNX, which has no masked LSTM / GRU / RNN: as a Loop over time of the cell's step.

A recognised Keras Loop with a mask (``LoopedRecurrent(mask=True)``: Embedding(mask_zero) or Masking) keeps a row's
states where its mask is false and outputs zero or the row's previous output there; ONNX's sequence_lens cannot say
that (holes anywhere, the held output). So the recurrent op's translation (op.py) writes a placeholder node
``MaskedRecurrent`` of the private domain ``DOMAIN`` (torch.onnx needs its ``SCHEMA``) with the cell's attributes,
and ``expand`` replaces each by a Loop whose body is the cell's step in ONNX ops, as ONNX's LSTM / GRU / RNN define it,
followed by the mask's selects, as the runtime computes it (runtime.py's ``_cell_loop``). Inputs and outputs are the
ONNX op's: X [T, N, I] (time-major, float32), W, R, B, initial_h, initial_c in ONNX's layout and gate order, one
direction; the mask [T, N]; Y [T, 1, N, H], Y_h and Y_c [1, N, H].
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

DOMAIN = "onnx2torch_rnn.masked"


def _schema() -> OpSchema:
    optional = OpSchema.FormalParameterOption.Optional
    inputs = [OpSchema.FormalParameter(name, "M" if name == "mask" else "T",
                                       param_option=optional if name in ("B", "initial_h", "initial_c") else
                                       OpSchema.FormalParameterOption.Single)
              for name in ("X", "W", "R", "B", "initial_h", "initial_c", "mask")]
    attributes = [OpSchema.Attribute(name, kind, "", required=name in ("cell", "hidden_size", "mask_output"))
                  for name, kind in (("cell", OpSchema.AttrType.STRING), ("hidden_size", OpSchema.AttrType.INT),
                                     ("activations", OpSchema.AttrType.STRINGS),
                                     ("activation_alpha", OpSchema.AttrType.FLOATS),
                                     ("activation_beta", OpSchema.AttrType.FLOATS),
                                     ("linear_before_reset", OpSchema.AttrType.INT),
                                     ("mask_output", OpSchema.AttrType.STRING))]
    return OpSchema("MaskedRecurrent", DOMAIN, 1, inputs=inputs,
                    outputs=[OpSchema.FormalParameter(name, "T") for name in ("Y", "Y_h", "Y_c")],
                    type_constraints=[("T", ["tensor(float)"], ""), ("M", ["tensor(bool)"], "")],
                    attributes=attributes)


SCHEMA = _schema()


def expand(proto: onnx.ModelProto) -> None:
    """Replace every MaskedRecurrent node of the main graph by its Loop (in place)."""
    graph = proto.graph
    if not any(n.domain == DOMAIN for n in graph.node):
        return
    nodes, written = [], set()
    for k, node in enumerate(graph.node):
        loop = _loop(node, f"masked{k}_") if node.domain == DOMAIN else [node]
        written.update(o for n in loop for o in n.output if node.domain == DOMAIN)
        nodes += loop
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [o for o in proto.opset_import if o.domain != DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)
    # the new values' types: lowering the opset keeps a node out of the version converter only where they are known
    known = {v.name for v in graph.value_info}
    graph.value_info.extend(v for v in onnx.shape_inference.infer_shapes(proto).graph.value_info
                            if v.name in written and v.name not in known)


class _Nodes:
    """Nodes being written, each output named ``prefix`` + a counter."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.count = prefix, [], 0

    def __call__(self, op: str, *inputs: str, **attributes) -> str:
        name = f"{self.prefix}{op}_{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op, list(inputs), [name], **attributes))
        return name

    def ints(self, *values: int) -> str:
        return self("Constant", value=helper.make_tensor("v", TensorProto.INT64, [len(values)], list(values)))

    def scalar(self, value: float) -> str:
        return self("Constant", value=helper.make_tensor("v", TensorProto.FLOAT, [], [value]))

    def columns(self, value: str, start: int, end: int) -> str:
        return self("Slice", value, self.ints(start), self.ints(end), self.ints(-1))


def _loop(node: onnx.NodeProto, prefix: str) -> list[onnx.NodeProto]:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    cell, hidden = attributes["cell"].decode(), attributes["hidden_size"]
    X, W, R, B, h0, c0, mask = [*node.input, *[""] * (7 - len(node.input))]
    outer = _Nodes(prefix)
    Wt = outer("Transpose", outer("Squeeze", W, outer.ints(0)))  # [I, gH]
    Rt = outer("Transpose", outer("Squeeze", R, outer.ints(0)))  # [H, gH]
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell] * hidden
    Wb = Rb = None
    if B:  # [1, 2gH]: Wb then Rb
        bias = outer("Squeeze", B, outer.ints(0))
        Wb, Rb = (outer.columns(bias, start, start + gates) for start in (0, gates))
    shape = outer("Shape", X)
    steps = outer("Squeeze", outer("Slice", shape, outer.ints(0), outer.ints(1), outer.ints(0)), outer.ints(0))
    # zeros [N, H] (Expand, not ConstantOfShape: the version converter has no adapter down from its version 20)
    zeros = outer("Expand", outer.scalar(0.0), outer("Concat", outer("Slice", shape, outer.ints(1), outer.ints(2),
                                                                     outer.ints(0)), outer.ints(hidden), axis=0))
    states = [outer("Squeeze", s, outer.ints(0)) if s else zeros for s in ((h0, c0) if cell == "LSTM" else (h0,))]
    body = _body(cell, hidden, attributes, (X, mask, Wt, Rt, Wb, Rb), prefix + "body_")
    finals = [f"{prefix}final_{k}" for k in range(len(states) + 1)]
    ys = f"{prefix}ys"
    outer.nodes.append(helper.make_node("Loop", [steps, "", *states, zeros], [*finals, ys], body=body))
    Y, Y_h, Y_c = [*node.output, "", ""][:3]
    for name, value, axis in ((Y, ys, 1), (Y_h, finals[0], 0), (Y_c, finals[1] if cell == "LSTM" else finals[0], 0)):
        if name:
            outer.nodes.append(helper.make_node("Unsqueeze", [value, outer.ints(axis)], [name]))
    return outer.nodes


def _body(cell: str, hidden: int, attributes: dict, outer: tuple, prefix: str) -> onnx.GraphProto:
    """One step: x_t and m_t gathered at the iteration, the cell's new states, the mask's selects."""
    X, mask, Wt, Rt, Wb, Rb = outer
    b = _Nodes(prefix)
    names = ["i", "cond", "h", *(["c"] if cell == "LSTM" else []), "out"]
    inputs = {n: prefix + n for n in names}
    x = b("Gather", X, inputs["i"], axis=0)
    m = b("Unsqueeze", b("Gather", mask, inputs["i"], axis=0), b.ints(1))  # [N, 1]
    acts = _activations(attributes)
    h = inputs["h"]

    def affine(value: str, weight: str, bias: str | None, start: int, end: int) -> str:
        product = b("MatMul", value, b.columns(weight, start, end))
        return product if bias is None else b("Add", product, b.columns(bias, start, end))

    H = hidden
    if cell == "LSTM":  # gates i, o, f, c
        gate = [b("Add", affine(x, Wt, Wb, k * H, (k + 1) * H), affine(h, Rt, Rb, k * H, (k + 1) * H))
                for k in range(4)]
        i, o, f, g = acts[0](b, gate[0]), acts[0](b, gate[1]), acts[0](b, gate[2]), acts[1](b, gate[3])
        c_new = b("Add", b("Mul", f, inputs["c"]), b("Mul", i, g))
        h_new = b("Mul", o, acts[2](b, c_new))
        new = [h_new, c_new]
    elif cell == "GRU":  # gates z, r, h
        z, r = (acts[0](b, b("Add", affine(x, Wt, Wb, k * H, (k + 1) * H), affine(h, Rt, Rb, k * H, (k + 1) * H)))
                for k in range(2))
        if attributes.get("linear_before_reset", 0):
            n_in = b("Add", affine(x, Wt, Wb, 2 * H, 3 * H), b("Mul", r, affine(h, Rt, Rb, 2 * H, 3 * H)))
        else:
            n_in = b("Add", affine(x, Wt, Wb, 2 * H, 3 * H), affine(b("Mul", r, h), Rt, Rb, 2 * H, 3 * H))
        n = acts[1](b, n_in)
        h_new = b("Add", b("Mul", b("Sub", b.scalar(1.0), z), n), b("Mul", z, h))
        new = [h_new]
    else:
        h_new = acts[0](b, b("Add", affine(x, Wt, Wb, 0, H), affine(h, Rt, Rb, 0, H)))
        new = [h_new]
    kept = [b("Where", m, value, inputs[state]) for value, state in zip(new, ("h", "c"), strict=False)]
    held = inputs["out"] if attributes["mask_output"].decode() == "hold" else b.scalar(0.0)
    out = b("Where", m, h_new, held)
    y = b("Identity", out)
    cond = b("Identity", inputs["cond"])
    float_state = [helper.make_tensor_value_info(inputs[n], TensorProto.FLOAT, None) for n in names[2:]]
    return helper.make_graph(
        b.nodes, prefix + "step",
        [helper.make_tensor_value_info(inputs["i"], TensorProto.INT64, []),
         helper.make_tensor_value_info(inputs["cond"], TensorProto.BOOL, []), *float_state],
        [helper.make_tensor_value_info(v, t, None) for v, t in
         ((cond, TensorProto.BOOL), *((v, TensorProto.FLOAT) for v in (*kept, out, y)))])


def _activations(attributes: dict) -> list:
    """The cell's activations as functions (nodes, value) -> value, in ONNX's order (alpha and beta: one per
    activation, as the translation writes them)."""
    names = [n.decode() for n in attributes["activations"]]
    alphas = list(attributes.get("activation_alpha", [0.0] * len(names)))
    betas = list(attributes.get("activation_beta", [0.0] * len(names)))
    return [_activation(name, alpha, beta) for name, alpha, beta in zip(names, alphas, betas, strict=True)]


def _activation(name: str, alpha: float, beta: float):
    if name in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
        return lambda b, x: b(name, x)
    if name == "HardSigmoid":
        return lambda b, x: b(name, x, alpha=alpha, beta=beta)
    if name in ("LeakyRelu", "Elu", "ThresholdedRelu"):
        return lambda b, x: b(name, x, alpha=alpha)
    if name == "Affine":
        return lambda b, x: b("Add", b("Mul", x, b.scalar(alpha)), b.scalar(beta))
    if name == "ScaledTanh":
        return lambda b, x: b("Mul", b("Tanh", b("Mul", x, b.scalar(beta))), b.scalar(alpha))
    raise NotImplementedError(f"a masked recurrence with activation {name} has no ONNX Loop here")
