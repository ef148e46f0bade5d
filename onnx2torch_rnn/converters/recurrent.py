"""Recurrent ops: LSTM, GRU, RNN."""
