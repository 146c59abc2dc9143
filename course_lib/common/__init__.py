"""The bench every chapter stands on: the GPT and MLP models, the data, the optimizer registry,
argument checks."""
