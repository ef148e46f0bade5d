"""The nn.Modules that converters create."""
