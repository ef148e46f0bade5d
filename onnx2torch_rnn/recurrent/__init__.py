"""The recurrent runtime: ONNX LSTM, GRU and RNN, in one place, in layers that only import downwards.

    cells.py    each cell as data (gates, gate orders, state kinds, default activations, its step equations, when a
                torch kernel is exact) and the static configuration of a node, with the op's config string
    runtime.py  the recurrence in Python: the skeleton every cell shares (layout, lengths, masks, directions,
                initial states, output shapes) over torch's kernels or the cell loop; reference, autograd path and
                fallback of the native kernel
    kernel/     the native CPU kernel (C++, built on first use) and its loader
    op.py       the ``onnx2torch_rnn::recurrent`` torch op: kernel or Python implementation, fake (shape)
                implementation, autograd for compiled training, the ONNX translation for export back
    masked_onnx.py  a masked recurrence back to ONNX: the translation's placeholder node and the Loop over the
                cell's step that replaces it after export (ONNX's LSTM/GRU/RNN have no per-step mask)
    module.py   OnnxLSTM / OnnxGRU / OnnxRNN: parameters, configuration, which path each call takes;
                StackedRecurrent: layers in turn (what recognition makes of per-layer nodes with glue);
                LoopedRecurrent / LoopedStack: one layer, or layers in turn, as a Loop or Scan body writes them

Why this split: what a cell *is* (cells) is used by every layer below it; the Python recurrence (runtime) must not
know about torch.library or modules, so the op, the quantized LSTM (modules/quantized.py) and the tests can all call
it; the op is the one entry point that eager inference, torch.compile and torch.export share; the module only
chooses. The converters (converters/recurrent.py) build modules from ONNX nodes.
"""

from .cells import InvalidAttribute
from .module import LoopedRecurrent, LoopedStack, OnnxGRU, OnnxLSTM, OnnxRNN, Recurrent, StackedRecurrent, steps_read
from .op import onnx_translation_table

__all__ = ["InvalidAttribute", "LoopedRecurrent", "LoopedStack", "OnnxGRU", "OnnxLSTM", "OnnxRNN", "Recurrent",
           "StackedRecurrent", "onnx_translation_table", "steps_read"]
