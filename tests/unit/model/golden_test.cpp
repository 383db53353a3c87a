// Placeholder, replaced by the PyTorch golden test.
