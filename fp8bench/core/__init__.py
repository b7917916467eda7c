"""The vocabulary every layer speaks: formats and scalings (`types`), the machine (`hardware`), exact FP8
numerics (`numerics`), the timer (`measure`), a case's record (`records`) and the statistics of a speedup
(`speedup`). Imports nothing else of fp8bench."""
