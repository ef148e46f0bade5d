"""Regenerate the bundled example models: `python examples/make_examples.py` (torch 2.13.0, TorchScript exporter).

bilstm_tagger.onnx: a sequence tagger (Embedding -> 2-layer bidirectional LSTM -> Linear) with dynamic batch and
time axes, as torch.onnx exports it at opset 17. Small (about 200 KB) and deterministic (seeded).
"""

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).parent


class BiLSTMTagger(nn.Module):
    def __init__(self, vocabulary=50, embedding=16, hidden=32, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.classify = nn.Linear(2 * hidden, tags)

    def forward(self, tokens):
        features, _ = self.lstm(self.embed(tokens))
        return self.classify(features)


def main():
    torch.manual_seed(0)
    model = BiLSTMTagger().eval()
    tokens = torch.randint(0, 50, (2, 7))
    torch.onnx.export(model, (tokens,), HERE / "bilstm_tagger.onnx", dynamo=False, opset_version=17,
                      input_names=["tokens"], output_names=["tag_scores"],
                      dynamic_axes={"tokens": {0: "batch", 1: "time"}, "tag_scores": {0: "batch", 1: "time"}})


if __name__ == "__main__":
    main()
