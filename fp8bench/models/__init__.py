"""The models that backends convert and workloads run: the transformer block, the Llama-style decoder, the
training corpus and the model shape tables. Below both backends and workloads."""
