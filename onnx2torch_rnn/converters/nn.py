"""Neural-network layers: convolution, pooling, normalisation, resizing, padding."""
